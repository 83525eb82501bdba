// Slurm as the cluster engine, against a real single-node Slurm (slurmctld, slurmd, munge) that CTest starts
// before these tests (tests/slurm/slurm_cluster.sh; SLURM_CONF points at it): real srun trials of the real
// trainer, scancel, a Slurm time limit, a SIGKILLed controller and srun, and an impossible request.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "common/Errors.h"
#include "reliability/ReliabilityUtil.h"
#include "search/Slurm.h"

using namespace bs;
namespace fs = std::filesystem;

namespace {

// Skips the test (with the reason the cluster script wrote) where no test cluster runs.
#define REQUIRE_SLURM_CLUSTER()                         \
  do {                                                  \
    const std::string why = cluster_status();           \
    if (why != "up") {                                  \
      GTEST_SKIP() << "no test Slurm cluster: " << why; \
    }                                                   \
  } while (0)

// The test cluster's folder (CTest's Slurm.ClusterStart starts it there); its slurm.conf becomes SLURM_CONF
// of this process and so of every srun/squeue the controller runs.
std::string cluster_dir() {
  const char* env = std::getenv("BERTSWEEP_SLURM_DIR");
  return env ? env : BERTSWEEP_TEST_SLURM_DIR;
}

std::string cluster_status() {
  const std::string dir = cluster_dir();
  std::string s = test::read_file(dir + "/status");
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.empty()) return "tests/slurm/slurm_cluster.sh start " + dir + " did not run (run these tests through ctest)";
  if (s == "up") {
    setenv("SLURM_CONF", (dir + "/slurm.conf").c_str(), 1);
    // The test cluster's nodes all live on this machine's loopback, which OpenMPI's TCP transport skips by
    // default (srun passes the environment on to every rank).
    setenv("OMPI_MCA_btl_tcp_if_include", "lo", 1);
  }
  return s;
}

// Slurm's compact node list ("n[1-2]") as names, by Slurm itself.
std::vector<std::string> expand_nodes(const std::string& list) {
  std::vector<std::string> out;
  std::istringstream in(search::run_command({"scontrol", "show", "hostnames", list}).out);
  for (std::string n; in >> n;) out.push_back(n);
  return out;
}

// The last event line of `kind` in a trial's event stream (the srun trials write events to stdout).
std::string last_event(const std::string& text, const std::string& kind) {
  std::string found;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find("\"event\": \"" + kind + "\"") != std::string::npos) found = line;
  return found;
}

// A study of srun trials of bert-tiny on the small dataset with an unreachable target: every trial runs its
// whole budget (768 samples, an eval every 256) unless stopped. The lr choices are stratified (`order`), so
// trials take them in order: two that learn, then one that cannot.
std::string write_study(const std::string& dir, const std::string& name, const std::string& extra = "",
                        const std::string& order = "stratify: [optimizer.lr]\n") {
  const std::string path = dir + "/" + name + ".yaml";
  std::ofstream(path) << "name: " << name << "\nobjective: samples_to_target\nsampler: random\npruner: none\n"
                      << "n_trials: 2\nparallel: 2\nseed: 5\n"
                      << "base:\n  extends: " << test::source_dir() << "/configs/train/bert-tiny-brown.yaml\n"
                      << "  data: {dir: " << test::small_brown_dataset() << ", eval_samples: 64}\n"
                      << "  batch: {global: 32, micro: 32}\n  optimizer: {name: adamw}\n"
                      << "  target: {mlm_accuracy: 0.99, max_samples: 768, eval_every_samples: 256}\n"
                      << "space:\n  optimizer.lr: {choice: [0.02, 0.015, 1.0e-9]}\n"
                      << order << "launcher: {kind: srun}\n"
                      << extra;
  return path;
}

std::vector<std::string> study_run(const std::string& file, const std::string& dir,
                                   const std::vector<std::string>& sets = {}) {
  std::vector<std::string> a = {test::bertsweep_bin(), "study", "run", "--config", file, "--dir", dir};
  for (const auto& s : sets) a.insert(a.end(), {"--set", s});
  return a;
}

// This user's jobs of the test cluster whose name starts with `prefix` and that still hold or wait for CPUs.
// COMPLETING counts: after the controller exits, a job that Slurm itself ended (TIMEOUT) can stay COMPLETING
// for a few seconds of slurmd cleanup, so the tests wait up to 30 s for the list to empty.
std::vector<std::string> live_jobs(const std::string& prefix) {
  auto r = search::run_command(
      {"squeue", "--noheader", "--states=PENDING,RUNNING,SUSPENDED,COMPLETING", "--format=%i %j %T"});
  std::vector<std::string> out;
  std::istringstream in(r.out);
  for (std::string id, name, state; in >> id >> name >> state;)
    if (name.rfind(prefix, 0) == 0) out.push_back(id + " " + name + " " + state);
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "; ";
  return s;
}

std::string trial_attr(const std::string& db, int64_t trial, const std::string& key) {
  SQLite::Database d(db, SQLite::OPEN_READONLY);
  SQLite::Statement q(d,
                      "SELECT a.value_json FROM trial_user_attributes a JOIN trials t ON t.trial_id = a.trial_id "
                      "WHERE a.key = ? AND t.number = ?");
  q.bind(1, key);
  q.bind(2, static_cast<int64_t>(trial));
  if (!q.executeStep()) return "";
  std::string v = q.getColumn(0).getString();
  return v.size() >= 2 ? v.substr(1, v.size() - 2) : v;
}

std::string slurm_job_attr(const std::string& db, int64_t trial) { return trial_attr(db, trial, "bs_slurm_job"); }

bool running_with_evals(const std::string& db, int64_t n, std::size_t evals) {
  StudyStore s(db, StudyStore::Mode::kReadOnly);
  auto t = s.trial(n);
  return t && t->state == trial_state::kRunning && s.evals(n).size() >= evals;
}

bool has_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) return false;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) return true;
  return false;
}

}  // namespace

// Two srun trials run at once as Slurm jobs of one CPU each (2 CPUs / parallel 2), complete, and keep their
// job ids; `study status` shows them, and no job is left.
TEST(SlurmE2E, SrunTrialsCompleteAsJobsAndKeepTheirJobIds) {
  REQUIRE_SLURM_CLUSTER();
  const std::string dir = test::make_temp_dir("slurm-ok");
  const std::string file = write_study(dir, "sok");
  auto r = test::run(study_run(file, dir), 400);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("as Slurm jobs"), std::string::npos) << r.err;
  StudyStore store(dir + "/sok/study.db", StudyStore::Mode::kReadOnly);
  ASSERT_EQ(store.trials().size(), 2u);
  std::set<std::string> ids;
  for (const auto& t : store.trials()) {
    EXPECT_EQ(t.state, trial_state::kComplete) << t.reason;
    const std::string id = slurm_job_attr(store.path(), t.number);
    EXPECT_TRUE(std::regex_match(id, std::regex("[0-9]+"))) << "trial " << t.number << ": '" << id << "'";
    ids.insert(id);
    // The job's own record: the name the controller gave it and the CPUs it asked for.
    auto job = search::run_command({"scontrol", "--oneliner", "show", "job", id});
    EXPECT_NE(job.out.find("JobName=bs-sok-000" + std::to_string(t.number)), std::string::npos) << job.out;
    EXPECT_NE(job.out.find("NumCPUs=1"), std::string::npos) << job.out;
    EXPECT_NE(test::read_file(t.trial_dir + "/config.yaml").find("threads: 1"), std::string::npos);
  }
  EXPECT_EQ(ids.size(), 2u);
  auto status = test::run({test::bertsweep_bin(), "study", "status", "sok", "--dir", dir});
  EXPECT_NE(status.out.find("slurm_job"), std::string::npos) << status.out;
  for (const auto& id : ids) EXPECT_NE(status.out.find(" " + id + " "), std::string::npos) << status.out;
  EXPECT_TRUE(test::wait_for([&] { return live_jobs("bs-sok-").empty(); }, 30)) << joined(live_jobs("bs-sok-"));
  fs::remove_all(dir);
}

// A trial of 2 ranks: srun starts both with --mpi=pmix (OpenMPI direct-launched by srun finds its peers
// through Slurm's PMIx) and one CPU each on the 2-CPU node, and they train as one world.
TEST(SlurmE2E, TwoRankTrialFindsItsPeerThroughPmix) {
  REQUIRE_SLURM_CLUSTER();
  const std::string dir = test::make_temp_dir("slurm-ranks");
  const std::string file = write_study(dir, "sranks");
  auto r = test::run(study_run(file, dir,
                               {"n_trials=1", "parallel=1", "launcher.ranks=2", "base.distributed.backend=mpi",
                                "base.target.max_samples=256"}),
                     400);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  StudyStore store(dir + "/sranks/study.db", StudyStore::Mode::kReadOnly);
  auto t = store.trial(0);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->state, trial_state::kComplete) << t->reason;
  const std::string out = test::read_file(t->trial_dir + "/stdout.log");
  EXPECT_NE(out.find("\"world\": 2"), std::string::npos) << out.substr(0, 2000);
  // The trainer's per-rank load events reach the study file.
  const auto loads = store.rank_load(0);
  ASSERT_FALSE(loads.empty()) << out.substr(0, 2000);
  // One entry per rank: "computed_tokens": [a, b].
  EXPECT_TRUE(std::regex_search(loads.front().json, std::regex("\"computed_tokens\": \\[[0-9.]+, [0-9.]+\\]")))
      << loads.front().json;
  auto job = search::run_command({"scontrol", "--oneliner", "show", "job", slurm_job_attr(store.path(), 0)});
  EXPECT_NE(job.out.find("NumTasks=2"), std::string::npos) << job.out;
  fs::remove_all(dir);
}

// A trial of 4 ranks on 2 nodes (launcher nodes: 2, ranks_per_node: 2) trains as one MPI world across them
// (OpenMPI's TCP between the nodes, shared memory within each); the start event and the trial's row record
// the node list and the job; and it ends at the same loss as the same config as 4 ranks on this one machine.
TEST(SlurmE2E, TrialAcrossTwoNodesTrainsAsOneWorldAndMatchesOneNode) {
  REQUIRE_SLURM_CLUSTER();
  const std::string dir = test::make_temp_dir("slurm-nodes");
  const std::string file = write_study(dir, "snodes");
  auto r = test::run(study_run(file, dir,
                               {"n_trials=1", "parallel=1", "launcher.ranks=4", "launcher.nodes=2",
                                "launcher.ranks_per_node=2", "base.distributed.backend=mpi", "base.batch.micro=8",
                                "base.target.max_samples=256", "base.target.eval_every_samples=128"}),
                     400);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  StudyStore store(dir + "/snodes/study.db", StudyStore::Mode::kReadOnly);
  auto t = store.trial(0);
  ASSERT_TRUE(t);
  ASSERT_EQ(t->state, trial_state::kComplete) << t->reason;
  const std::string out = test::read_file(t->trial_dir + "/stdout.log");
  const std::string start = last_event(out, "start");
  EXPECT_NE(start.find("\"world\": 4"), std::string::npos) << start;
  const std::string nodes = trial_attr(store.path(), 0, "bs_slurm_nodes");
  const auto names = expand_nodes(nodes);
  ASSERT_EQ(names.size(), 2u) << "bs_slurm_nodes '" << nodes << "'";
  EXPECT_NE(names[0], names[1]);
  EXPECT_NE(start.find("\"slurm_nodes\": \"" + nodes + "\""), std::string::npos) << start;
  auto job = search::run_command({"scontrol", "--oneliner", "show", "job", slurm_job_attr(store.path(), 0)});
  EXPECT_NE(job.out.find("NumNodes=2 "), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("NumTasks=4"), std::string::npos) << job.out;
  // `study status` shows where the trial ran.
  auto status = test::run({test::bertsweep_bin(), "study", "status", "snodes", "--dir", dir});
  EXPECT_NE(status.out.find(" " + nodes), std::string::npos) << status.out;

  // The same config, 4 ranks under mpirun on this machine: the same seed gives the same loss.
  std::vector<std::string> local = {"mpirun", "-np", "4", "--oversubscribe"};
  if (geteuid() == 0) local.push_back("--allow-run-as-root");
  for (const auto& a :
       {test::bertsweep_bin(), std::string("train"), std::string("--config"), t->trial_dir + "/config.yaml",
        std::string("--events"), dir + "/local.jsonl", std::string("--quiet")})
    local.push_back(a);
  auto one = test::run(local, 400);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const std::string across = last_event(out, "eval"), here = last_event(test::read_file(dir + "/local.jsonl"), "eval");
  ASSERT_FALSE(across.empty());
  ASSERT_FALSE(here.empty());
  EXPECT_EQ(test::json_number(across, "samples"), test::json_number(here, "samples"));
  EXPECT_NEAR(test::json_number(across, "loss"), test::json_number(here, "loss"),
              1e-4 * std::abs(test::json_number(here, "loss")))
      << "across nodes: " << across << "\none node: " << here;
  EXPECT_NEAR(test::json_number(across, "train_loss"), test::json_number(here, "train_loss"),
              1e-4 * std::abs(test::json_number(here, "train_loss")));
  fs::remove_all(dir);
}

// slurm_cluster.sh kill-node|start-node DIR NODE.
int cluster_node(const std::string& what, const std::string& node) {
  return test::run({test::source_dir() + "/tests/slurm/slurm_cluster.sh", what, cluster_dir(), node}, 60).exit_code;
}

std::string node_state(const std::string& node) {
  std::string s = search::run_command({"sinfo", "--noheader", "--Node", "--nodes=" + node, "--format=%T"}).out;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Brings a killed node back (slurmd again; ReturnToService=2 returns it to service) for the tests after this
// one, whatever way the test ends.
struct NodeBack {
  std::string node;
  ~NodeBack() {
    if (node.empty()) return;
    cluster_node("start-node", node);
    test::wait_for([&] { return node_state(node) == "idle"; }, 60);
  }
};

// A node is killed as by a power cut (its slurmd, slurmstepd and the trial's rank on it) while a 2-node
// trial runs there: the trial ends FAIL with Slurm's NODE_FAIL and that node's name within a bounded time
// (the rank on the other node does not hang: Slurm ends the step), retry_failed reruns it on healthy nodes
// from its last checkpoint (not from step 0), and the study completes with every row intact.
TEST(SlurmE2E, KilledNodeFailsTheTrialAndTheRetryContinuesFromItsCheckpointElsewhere) {
  REQUIRE_SLURM_CLUSTER();
  const std::string dir = test::make_temp_dir("slurm-nodefail");
  const std::string file = write_study(dir, "snf");
  const std::string db = dir + "/snf/study.db";
  pid_t ctl =
      test::spawn(study_run(file, dir,
                            {"n_trials=1", "parallel=1", "retry_failed=1", "launcher.ranks=2", "launcher.nodes=2",
                             "launcher.ranks_per_node=1", "base.distributed.backend=mpi", "base.batch.micro=16",
                             "base.target.max_samples=4096", "base.target.eval_every_samples=256",
                             "base.checkpoint.dir=" + dir + "/ck", "base.checkpoint.every_samples=256"}),
                  dir + "/controller.log");
  ASSERT_TRUE(test::wait_for(
      [&] {
        return running_with_evals(db, 0, 2) && has_checkpoint(dir + "/ck/trial-0000") &&
               !trial_attr(db, 0, "bs_slurm_nodes").empty();
      },
      240))
      << test::read_file(dir + "/controller.log");
  const auto nodes = expand_nodes(trial_attr(db, 0, "bs_slurm_nodes"));
  ASSERT_EQ(nodes.size(), 2u);
  const std::string victim = nodes[0];  // rank 0's node: the one writing the checkpoints
  NodeBack back{victim};
  const double killed_at = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  ASSERT_EQ(cluster_node("kill-node", victim), 0);
  ASSERT_EQ(test::wait_exit(ctl, 600), 0) << test::read_file(dir + "/controller.log");
  const std::string log = test::read_file(dir + "/controller.log");

  StudyStore store(db, StudyStore::Mode::kReadOnly);
  ASSERT_EQ(store.trials().size(), 2u) << log;
  const auto t0 = *store.trial(0), t1 = *store.trial(1);
  EXPECT_EQ(t0.state, trial_state::kFail);
  EXPECT_NE(t0.reason.find("NODE_FAIL"), std::string::npos) << t0.reason;
  EXPECT_NE(t0.reason.find("Node failure on " + victim), std::string::npos) << t0.reason;
  // SlurmdTimeout is 10 s: Slurm gives the node up within about 30 s, and nothing waits much longer.
  EXPECT_LT(t0.end_time - killed_at, 90) << "the failed trial took this long to end";
  EXPECT_EQ(t1.retry_of, 0);
  EXPECT_EQ(t1.state, trial_state::kComplete) << t1.reason;
  const auto retry_nodes = expand_nodes(trial_attr(db, 1, "bs_slurm_nodes"));
  EXPECT_EQ(retry_nodes.size(), 2u);
  EXPECT_EQ(std::count(retry_nodes.begin(), retry_nodes.end(), victim), 0) << "the retry ran on the dead node";
  // From the checkpoint: the retry's first eval comes after trial 0's first two, and the trainer says so.
  const auto evals0 = store.evals(0), evals1 = store.evals(1);
  ASSERT_GE(evals0.size(), 2u);
  ASSERT_FALSE(evals1.empty());
  EXPECT_GT(evals1.front().samples, evals0[1].samples - 1) << "the retry started from step 0";
  EXPECT_EQ(evals1.back().samples, 4096);
  EXPECT_NE(log.find("continues trial 0 from its last checkpoint"), std::string::npos) << log;
  SQLite::Database check(db, SQLite::OPEN_READONLY);
  EXPECT_EQ(check.execAndGet("PRAGMA integrity_check").getString(), "ok");
  EXPECT_TRUE(test::wait_for([&] { return live_jobs("bs-snf-").empty(); }, 30)) << joined(live_jobs("bs-snf-"));
  fs::remove_all(dir);
}

// A request Slurm can never grant (more CPUs than the cluster has; a partition it does not have) is a
// config error before any trial: exit 2, Slurm's words and the keys to fix, no trial, no job.
TEST(SlurmE2E, ImpossibleRequestIsAConfigErrorBeforeAnyTrial) {
  REQUIRE_SLURM_CLUSTER();
  const std::string dir = test::make_temp_dir("slurm-impossible");
  const std::string file = write_study(dir, "imp");
  auto r = test::run(study_run(file, dir, {"launcher.cpus_per_trial=64"}), 120);
  EXPECT_EQ(r.exit_code, exit_code::kUsage) << r.err;
  EXPECT_NE(r.err.find("srun --test-only"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Requested node configuration is not available"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cpus_per_trial"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/imp/study.db")) << "a refused study wrote its file";
  r = test::run(study_run(file, dir, {"launcher.partition=nosuchpartition"}), 120);
  EXPECT_EQ(r.exit_code, exit_code::kUsage) << r.err;
  EXPECT_NE(r.err.find("nosuchpartition"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("partition"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/imp/study.db"));
  EXPECT_TRUE(test::wait_for([&] { return live_jobs("bs-imp-").empty(); }, 30)) << joined(live_jobs("bs-imp-"));
  fs::remove_all(dir);
}

// A trial cancelled with scancel by someone, and one that runs into its Slurm time limit (1 minute), are
// recorded with Slurm's reason and their job id and are not retried (they would end the same way); a study
// whose every trial failed exits non-zero.
TEST(SlurmE2E, CancelledAndTimedOutTrialsKeepSlurmsReasonAndJobId) {
  REQUIRE_SLURM_CLUSTER();
  const std::string dir = test::make_temp_dir("slurm-fail");
  const std::string file = write_study(dir, "sfail");
  const std::string db = dir + "/sfail/study.db";
  pid_t ctl =
      test::spawn(study_run(file, dir, {"launcher.time_limit=1", "retry_failed=2", "base.target.max_samples=10000000"}),
                  dir + "/controller.log");
  ASSERT_TRUE(test::wait_for([&] { return running_with_evals(db, 0, 1) && running_with_evals(db, 1, 0); }, 240))
      << test::read_file(dir + "/controller.log");
  std::string job0;
  ASSERT_TRUE(test::wait_for([&] { return !(job0 = slurm_job_attr(db, 0)).empty(); }, 30));
  ASSERT_EQ(search::run_command({"scancel", job0}).exit_code, 0);
  // Trial 1 runs on until Slurm's time limit (1 minute, checked every 30 s, then KillWait=2 s).
  ASSERT_EQ(test::wait_exit(ctl, 400), exit_code::kStudy) << test::read_file(dir + "/controller.log");
  StudyStore store(db, StudyStore::Mode::kReadOnly);
  auto trials = store.trials();
  ASSERT_EQ(trials.size(), 2u) << "a cancelled or timed-out trial was retried";
  const auto t0 = *store.trial(0), t1 = *store.trial(1);
  EXPECT_EQ(t0.state, trial_state::kFail);
  EXPECT_NE(t0.reason.find("CANCELLED"), std::string::npos) << t0.reason;
  EXPECT_NE(t0.reason.find("job " + job0), std::string::npos) << t0.reason;
  EXPECT_EQ(t1.state, trial_state::kFail);
  EXPECT_NE(t1.reason.find("TIMEOUT"), std::string::npos) << t1.reason;
  const std::string job1 = slurm_job_attr(db, 1);
  ASSERT_FALSE(job1.empty());
  EXPECT_NE(t1.reason.find("job " + job1), std::string::npos) << t1.reason;
  EXPECT_NE(test::read_file(dir + "/controller.log").find("every trial failed"), std::string::npos);
  EXPECT_TRUE(test::wait_for([&] { return live_jobs("bs-sfail-").empty(); }, 30)) << joined(live_jobs("bs-sfail-"));
  fs::remove_all(dir);
}

// A pruned trial and, after a second Ctrl-C, a running one are stopped the graceful way under srun: the
// trainer's SIGTERM handler runs (exit 6, not srun's SIGKILL 137) and writes its checkpoint.
TEST(SlurmE2E, PruneAndSecondSignalStopTrialsGracefully) {
  REQUIRE_SLURM_CLUSTER();
  const std::string dir = test::make_temp_dir("slurm-stop");
  // Not stratified: a stratified study's median pruner compares within a cell, and each lr is its own cell.
  // Seed 1's random sampler draws 0.015, 0.02, then 1e-9 instead.
  const std::string file = write_study(dir, "sstop", "", "");
  // Pruning: trials 0 and 1 learn, trial 2 (lr 1e-9) cannot and is pruned at its first comparable eval.
  auto r = test::run(
      study_run(file, dir,
                {"pruner=median", "seed=1", "n_trials=3", "parallel=1", "base.checkpoint.dir=" + dir + "/ck-prune"}),
      600);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  {
    StudyStore store(dir + "/sstop/study.db", StudyStore::Mode::kReadOnly);
    auto t2 = store.trial(2);
    ASSERT_TRUE(t2);
    EXPECT_EQ(t2->state, trial_state::kPruned) << t2->reason;
    EXPECT_EQ(t2->exit_code, exit_code::kTerminated) << "the pruned trial did not stop through its SIGTERM handler";
    EXPECT_NE(test::read_file(t2->trial_dir + "/stderr.log").find("stopped by signal"), std::string::npos);
    // Each trial checkpoints into its own folder of checkpoint.dir.
    EXPECT_TRUE(has_checkpoint(dir + "/ck-prune/trial-0002")) << "the pruned trial wrote no checkpoint";
  }
  // Second signal: the running trial is stopped now, gracefully, and recorded.
  const std::string db = dir + "/second/study.db";
  pid_t ctl = test::spawn(study_run(file, dir,
                                    {"name=second", "n_trials=1", "parallel=1", "base.target.max_samples=10000000",
                                     "base.checkpoint.dir=" + dir + "/ck-second"}),
                          dir + "/controller.log");
  ASSERT_TRUE(test::wait_for([&] { return running_with_evals(db, 0, 1); }, 240))
      << test::read_file(dir + "/controller.log");
  kill(ctl, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  kill(ctl, SIGINT);
  EXPECT_EQ(test::wait_exit(ctl, 120), exit_code::kTerminated) << test::read_file(dir + "/controller.log");
  StudyStore store(db, StudyStore::Mode::kReadOnly);
  auto t0 = store.trial(0);
  ASSERT_TRUE(t0);
  EXPECT_EQ(t0->state, trial_state::kFail);
  EXPECT_EQ(t0->reason.rfind("interrupted", 0), 0u) << t0->reason;
  EXPECT_EQ(t0->exit_code, exit_code::kTerminated) << t0->reason;
  EXPECT_TRUE(has_checkpoint(dir + "/ck-second/trial-0000")) << "the stopped trial wrote no checkpoint";
  EXPECT_TRUE(test::wait_for([&] { return live_jobs("bs-second-").empty(); }, 30)) << joined(live_jobs("bs-second-"));
  fs::remove_all(dir);
}

// The controller and its srun are SIGKILLed while a trial runs (the job then stays allocated, since nobody
// ends it); `study resume` cancels the leftover job by its stored id, and no job of the study remains.
TEST(SlurmE2E, KilledControllerLeavesNoJobBehindAfterResume) {
  REQUIRE_SLURM_CLUSTER();
  const std::string dir = test::make_temp_dir("slurm-kill");
  const std::string file = write_study(dir, "skill");
  const std::string db = dir + "/skill/study.db";
  pid_t ctl = test::spawn(study_run(file, dir, {"n_trials=1", "parallel=1", "base.target.max_samples=10000000"}),
                          dir + "/controller.log");
  ASSERT_TRUE(test::wait_for([&] { return running_with_evals(db, 0, 1) && !slurm_job_attr(db, 0).empty(); }, 240))
      << test::read_file(dir + "/controller.log");
  const std::string job0 = slurm_job_attr(db, 0);
  const int64_t srun_pid = StudyStore(db, StudyStore::Mode::kReadOnly).trial(0)->pid;
  kill(ctl, SIGKILL);
  kill(-static_cast<pid_t>(srun_pid), SIGKILL);
  test::wait_exit(ctl, 30);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ASSERT_FALSE(live_jobs("bs-skill-").empty()) << "the SIGKILLed srun took its job with it: nothing left to test";

  // One trial: resume marks it failed ("controller died") and has nothing left to run (exit 7, every trial
  // failed), after cancelling the job.
  auto r = test::run({test::bertsweep_bin(), "study", "resume", "skill", "--dir", dir}, 300);
  EXPECT_EQ(r.exit_code, exit_code::kStudy) << r.err;
  EXPECT_NE(r.err.find("cancelled its leftover Slurm job " + job0), std::string::npos) << r.err;
  StudyStore store(db, StudyStore::Mode::kReadOnly);
  EXPECT_EQ(store.trial(0)->state, trial_state::kFail);
  EXPECT_EQ(store.trial(0)->reason, "controller died");
  EXPECT_TRUE(test::wait_for([&] { return live_jobs("bs-skill-").empty(); }, 30)) << joined(live_jobs("bs-skill-"));
  fs::remove_all(dir);
}

// `study submit`: the controller runs as an sbatch job and its srun trials as steps of that job; a second
// submit while it runs is refused; submitting the finished study again resumes it (nothing left: exit 0).
TEST(SlurmE2E, SubmitRunsTheControllerAsABatchJobWithTrialsAsSteps) {
  REQUIRE_SLURM_CLUSTER();
  const std::string dir = test::make_temp_dir("slurm-submit");
  const std::string file = write_study(dir, "ssub");
  const std::vector<std::string> submit = {
      test::bertsweep_bin(),         "study",         "submit",   "--config", file, "--dir", dir, "--set",
      "base.target.max_samples=512", "--sbatch-args", "--time=10"};
  auto r = test::run(submit, 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string id = r.out.substr(0, r.out.find('\n'));
  ASSERT_TRUE(std::regex_match(id, std::regex("[0-9]+"))) << r.out;
  auto again = test::run(submit, 120);
  EXPECT_EQ(again.exit_code, exit_code::kUsage) << again.err;
  EXPECT_NE(again.err.find("already submitted: Slurm job " + id), std::string::npos) << again.err;
  ASSERT_TRUE(test::wait_for([&] { return live_jobs("bs-ssub-controller").empty(); }, 300))
      << joined(live_jobs("bs-ssub-"));
  const std::string log = test::read_file(dir + "/ssub/controller-" + id + ".log");
  EXPECT_NE(log.find("as steps of Slurm job " + id), std::string::npos) << log;
  StudyStore store(dir + "/ssub/study.db", StudyStore::Mode::kReadOnly);
  ASSERT_EQ(store.trials().size(), 2u) << log;
  for (const auto& t : store.trials()) {
    EXPECT_EQ(t.state, trial_state::kComplete) << t.reason;
    EXPECT_EQ(slurm_job_attr(store.path(), t.number).rfind(id + ".", 0), 0u) << "not a step of the controller's job";
  }
  r = test::run(submit, 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string id2 = r.out.substr(0, r.out.find('\n'));
  ASSERT_TRUE(test::wait_for([&] { return live_jobs("bs-ssub-controller").empty(); }, 300));
  EXPECT_NE(test::read_file(dir + "/ssub/controller-" + id2 + ".log").find("done | 2 complete"), std::string::npos)
      << test::read_file(dir + "/ssub/controller-" + id2 + ".log");
  EXPECT_EQ(StudyStore(dir + "/ssub/study.db", StudyStore::Mode::kReadOnly).trials().size(), 2u);
  fs::remove_all(dir);
}
