// The Slurm pieces that need no cluster: srun's options, the threads per rank, the launcher keys, and the
// failure reasons read from what Slurm printed (texts captured from a real Slurm 22.05).
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>

#include "common/TrainConfig.h"
#include "search/Slurm.h"
#include "search/TrialLauncher.h"

using namespace bs;
using namespace bs::search;

namespace {
struct UnsetSlurmEnv {  // the tests may themselves run inside an allocation
  UnsetSlurmEnv() {
    for (const char* v : {"SLURM_JOB_ID", "SLURM_CPUS_ON_NODE", "SLURM_JOB_NUM_NODES"}) unsetenv(v);
  }
};

LauncherConfig srun_launcher(int ranks) {
  LauncherConfig l;
  l.kind = "srun";
  l.ranks = ranks;
  return l;
}

bool has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

StudyConfig study_with_launcher(const std::string& launcher) {
  return StudyConfig::from_yaml(
      YAML::Load("name: s\nspace:\n  optimizer.lr: {choice: [0.001, 0.002]}\nlauncher: " + launcher + "\n"), "s.yaml");
}

std::string config_error(const std::string& launcher) {
  try {
    study_with_launcher(launcher);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST(Slurm, JobNameFillsStudyAndTrial) {
  EXPECT_EQ(slurm_job_name("bs-{study}-{trial}", "adam", 7), "bs-adam-0007");
  EXPECT_EQ(slurm_job_name("{study}.{study}", "x", 1), "x.x");
  EXPECT_EQ(slurm_job_name("fixed", "x", 12345), "fixed");
}

TEST(Slurm, SrunOptionsAskForWhatTheTrialNeeds) {
  LauncherConfig l = srun_launcher(1);
  auto o = srun_options(l, 4, "bs-s-0001", {});
  EXPECT_TRUE(has(o, "--job-name=bs-s-0001"));
  EXPECT_TRUE(has(o, "--ntasks=1"));
  EXPECT_TRUE(has(o, "--cpus-per-task=4"));
  for (const auto& a : o) EXPECT_NE(a.rfind("--mpi", 0), 0u) << "one rank needs no PMI: " << a;
  l = srun_launcher(4);
  l.nodes = 2;
  l.ranks_per_node = 2;
  l.partition = "gpu,cpu";
  l.time_limit = "1:30:00";
  l.extra_args = {"--exclusive"};
  o = srun_options(l, 2, "n", {"0", "1", "2", "3"});
  for (const char* want : {"--ntasks=4", "--nodes=2", "--ntasks-per-node=2", "--partition=gpu,cpu", "--time=1:30:00",
                           "--mpi=pmix", "--gpus-per-task=1", "--exclusive", "--cpus-per-task=2"})
    EXPECT_TRUE(has(o, want)) << want;
  EXPECT_EQ(o.back(), "--exclusive");  // the user's own arguments come last: they win
  l.mpi = "pmi2";
  EXPECT_TRUE(has(srun_options(l, 1, "n", {}), "--mpi=pmi2"));
  // The whole trainer command: srun's options before the program, and the same thread count in both.
  LaunchSpec s = trainer_launch(l, "/bin/bertsweep", "/t/config.yaml", 2, "/t", {}, "bs-s-0003");
  EXPECT_EQ(s.argv[0], "srun");
  EXPECT_TRUE(has(s.argv, "--job-name=bs-s-0003"));
  auto prog = std::find(s.argv.begin(), s.argv.end(), "/bin/bertsweep");
  ASSERT_NE(prog, s.argv.end());
  EXPECT_LT(std::find(s.argv.begin(), s.argv.end(), "--exclusive"), prog);
  EXPECT_TRUE(has(s.argv, "threads=2"));
}

TEST(Slurm, ThreadsPerRankSplitTheCpusBetweenParallelTrialsAndRanks) {
  UnsetSlurmEnv unset;
  LauncherConfig l = srun_launcher(2);
  EXPECT_EQ(cpus_per_rank(l, 1, 2), 1);  // 2 CPUs, 1 trial of 2 ranks: 1 each (was 2 each: never scheduled)
  EXPECT_EQ(cpus_per_rank(l, 2, 16), 4);
  l.cpus_per_trial = 8;
  EXPECT_EQ(cpus_per_rank(l, 2, 2), 4);  // asked for explicitly
  setenv("SLURM_JOB_ID", "42", 1);
  setenv("SLURM_CPUS_ON_NODE", "6", 1);
  setenv("SLURM_JOB_NUM_NODES", "2", 1);
  l.cpus_per_trial = 0;
  EXPECT_EQ(cpus_per_rank(l, 3, 64), 2);  // inside an allocation: its 12 CPUs, not the controller's 64
  SlurmAllocation a = current_slurm_allocation();
  EXPECT_TRUE(a.inside);
  EXPECT_EQ(a.job_id, "42");
  EXPECT_EQ(a.cpus_on_node * a.nodes, 12);
  // A trial larger than the allocation is refused before it starts.
  l.cpus_per_trial = 16;
  try {
    check_slurm_request(l, 8, "s.yaml");
    ADD_FAILURE() << "16 CPUs accepted inside a 12-CPU allocation";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("holds 12 CPU(s)"), std::string::npos) << e.what();
  }
  UnsetSlurmEnv again;
  LauncherConfig local;
  EXPECT_EQ(cpus_per_rank(local, 2, 8), 4);  // local trials: as before, the cores / parallel
}

TEST(Slurm, LauncherKeysAreCheckedAndReadBack) {
  StudyConfig c = study_with_launcher(
      "{kind: srun, ranks: 4, cpus_per_trial: 8, nodes: 2, ranks_per_node: 2, "
      "partition: debug, time_limit: '2:00:00', mpi: pmi2, job_name: 'x-{trial}', "
      "queue_timeout: 600}");
  EXPECT_EQ(c.launcher.cpus_per_trial, 8);
  EXPECT_EQ(c.launcher.time_limit, "2:00:00");
  EXPECT_EQ(c.launcher.queue_timeout, 600);
  StudyConfig back = StudyConfig::from_yaml(YAML::Load(c.to_yaml_string()), "stored");
  EXPECT_EQ(back.launcher.nodes, 2);
  EXPECT_EQ(back.launcher.ranks_per_node, 2);
  EXPECT_EQ(back.launcher.partition, "debug");
  EXPECT_EQ(back.launcher.mpi, "pmi2");
  EXPECT_EQ(back.launcher.job_name, "x-{trial}");
  EXPECT_EQ(back.launcher.queue_timeout, 600);
  EXPECT_EQ(back.identity(), c.identity());

  EXPECT_NE(config_error("{kind: local, partition: debug}").find("'launcher.partition' is a Slurm key"),
            std::string::npos);
  EXPECT_NE(config_error("{kind: srun, time_limit: 'soon'}").find("s.yaml:4"), std::string::npos);
  EXPECT_NE(config_error("{kind: srun, time_limit: 'soon'}").find("--time format"), std::string::npos);
  EXPECT_NE(config_error("{kind: srun, ranks: 3, cpus_per_trial: 4}").find("multiple of launcher.ranks"),
            std::string::npos);
  EXPECT_NE(config_error("{kind: srun, ranks: 4, nodes: 2, ranks_per_node: 3}").find("must equal launcher.ranks"),
            std::string::npos);
  EXPECT_NE(config_error("{kind: srun, partition: 'a b'}").find("launcher.partition"), std::string::npos);
  EXPECT_NE(config_error("{kind: srun, job_name: 'x;rm'}").find("launcher.job_name"), std::string::npos);
  EXPECT_NE(config_error("{kind: srun, queue_timeout: -1}").find("launcher.queue_timeout"), std::string::npos);
  EXPECT_NE(config_error("{kind: srun, qeue_timeout: 5}").find("unknown key 'launcher.qeue_timeout'"),
            std::string::npos);
}

TEST(Slurm, FailureReasonsComeFromSlurmsOwnWords) {
  const std::string timeout_err =
      "slurmstepd-vm: error: *** STEP 4.0 ON vm CANCELLED AT 2026-12-03T15:40:18 DUE TO TIME LIMIT ***\n"
      "srun: Job step aborted: Waiting up to 4 seconds for job step to finish.\n"
      "srun: error: vm: task 0: Exited with exit code 6\n";
  auto f = slurm_failure(SlurmJob{"4", "TIMEOUT", "TimeLimit", "1:00"}, timeout_err);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->reason.rfind("slurm: job 4 TIMEOUT (time limit 1:00): *** STEP 4.0", 0), 0u) << f->reason;
  EXPECT_FALSE(f->retryable);
  // A step of the controller's allocation: the job is RUNNING, slurmstepd's line says what happened.
  f = slurm_failure(SlurmJob{"9", "RUNNING", "None", "UNLIMITED"}, timeout_err);
  ASSERT_TRUE(f);
  EXPECT_NE(f->reason.find("TIMEOUT"), std::string::npos) << f->reason;
  f = slurm_failure(std::nullopt, "slurmstepd-vm: error: *** JOB 12 ON vm CANCELLED AT 2026-12-03T15:39:02 ***\n");
  ASSERT_TRUE(f);
  EXPECT_NE(f->reason.find("CANCELLED"), std::string::npos);
  EXPECT_FALSE(f->retryable);
  f = slurm_failure(SlurmJob{"13", "NODE_FAIL", "None", "UNLIMITED"}, "");
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->retryable);  // another node may do
  // srun's own words when node n2 of a 2-node step was killed (the test cluster, Slurm 22.05): the reason
  // names the failed node, not n1, whose slurmstepd cancelled its part; the same when the job's state is
  // not known (a step of the controller's allocation) or not yet NODE_FAIL.
  const std::string node_fail_err =
      "srun: error: Node failure on n2\n"
      "slurmstepd-n1: error: *** STEP 1.0 ON n1 CANCELLED AT 2026-12-07T23:29:45 DUE TO NODE FAILURE, SEE SLURMCTLD "
      "LOG FOR DETAILS ***\n"
      "srun: Job step aborted: Waiting up to 4 seconds for job step to finish.\n"
      "srun: error: n1: task 0: Terminated\n";
  // (srun itself may exit 0 then, and the job's record say COMPLETED while the node is not yet down.)
  for (const auto& job :
       {std::optional<SlurmJob>(SlurmJob{"1", "NODE_FAIL", "NodeDown", "UNLIMITED"}),
        std::optional<SlurmJob>(SlurmJob{"1", "COMPLETED", "None", "UNLIMITED"}), std::optional<SlurmJob>()}) {
    f = slurm_failure(job, node_fail_err);
    ASSERT_TRUE(f);
    EXPECT_NE(f->reason.find("NODE_FAIL (Node failure on n2)"), std::string::npos) << f->reason;
    EXPECT_TRUE(f->retryable);
  }
  f = slurm_failure(std::nullopt, "srun: error: Unable to allocate resources: Invalid partition name specified\n");
  ASSERT_TRUE(f);
  EXPECT_NE(f->reason.find("launch failed"), std::string::npos);
  EXPECT_NE(f->reason.find("Invalid partition name"), std::string::npos);
  EXPECT_FALSE(f->retryable);
  f = slurm_failure(std::nullopt,
                    "The application appears to have been direct launched using \"srun\",\n"
                    "but OMPI was not built with SLURM's PMI support and therefore cannot\nexecute.\n");
  ASSERT_TRUE(f);
  EXPECT_NE(f->reason.find("not built with SLURM's PMI support"), std::string::npos) << f->reason;
  // The trainer's own failure (exit 3, its message) is not Slurm's to explain.
  EXPECT_FALSE(slurm_failure(SlurmJob{"5", "FAILED", "NonZeroExitCode", "UNLIMITED"},
                             "bertsweep train: data error: x.hdf5 is truncated\n"
                             "srun: error: vm: task 0: Exited with exit code 3\n"));
}

TEST(Slurm, RunCommandCapturesOutputAndExitCode) {
  auto r = run_command({"sh", "-c", "echo out; echo err >&2; exit 3"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_EQ(run_command({"no-such-program-bertsweep"}).exit_code, 127);
  r = run_command({"sleep", "5"}, 0.3);
  EXPECT_EQ(r.exit_code, 128 + 9);
}
