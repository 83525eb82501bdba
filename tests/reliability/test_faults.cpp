// Fault injection with the real CLI, trainer, SQLite and Optuna: a trial SIGKILLed mid-run, a trial that
// hangs (SIGSTOP), the controller SIGKILLed during a trial, the study folder's disk filling up, one MPI rank
// killed. After each: the study file passes integrity_check, finished trials keep their values, and no
// trial stays RUNNING.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <fstream>

#include "ReliabilityUtil.h"

using namespace bs;
namespace fs = std::filesystem;

namespace {
// An unreachable target: every trial runs its whole (small) budget, with an eval every 256 samples.
const std::vector<std::string> kLongTrials = {"base.target.mlm_accuracy=0.99", "base.target.max_samples=768",
                                              "base.target.eval_every_samples=256", "base.data.eval_samples=64",
                                              "parallel=1"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void expect_no_running_and_intact(const std::string& db) {
  EXPECT_EQ(test::integrity(db), "ok");
  StudyStore store(db);
  EXPECT_TRUE(store.trials_in_state(trial_state::kRunning).empty());
}
}  // namespace

// Trial 0 is SIGKILLed after its first eval, trial 1 is SIGSTOPped (no events: the trial timeout kills it),
// trial 2 runs normally. The study goes on and ends with the two failures explained.
TEST(Faults, KilledAndHungTrialsFailWithReasonAndTheStudyGoesOn) {
  std::string dir = test::make_temp_dir("rel-trialkill");
  std::string db = dir + "/tk/study.db";
  // 60 s: long enough that a healthy trial on a busy 2-core CI machine is never mistaken for a hung one.
  auto argv = test::smoke_study(dir, "tk", with(kLongTrials, {"n_trials=3", "trial_timeout=60"}));
  pid_t ctl = test::spawn(argv, dir + "/controller.log");

  auto running_with_eval = [&](int64_t n, std::size_t* evals, int64_t* pid) {
    StudyStore s(db);
    auto t = s.trial(n);
    if (!t || t->state != trial_state::kRunning) return false;
    *evals = s.evals(n).size();
    *pid = t->pid;
    return *evals >= 1;
  };
  std::size_t evals0 = 0, evals1 = 0;
  int64_t pid0 = 0, pid1 = 0;
  ASSERT_TRUE(test::wait_for([&] { return running_with_eval(0, &evals0, &pid0); }, 240))
      << test::read_file(dir + "/controller.log");
  ASSERT_EQ(kill(static_cast<pid_t>(pid0), SIGKILL), 0);
  ASSERT_TRUE(test::wait_for([&] { return running_with_eval(1, &evals1, &pid1); }, 240))
      << test::read_file(dir + "/controller.log");
  ASSERT_EQ(kill(static_cast<pid_t>(pid1), SIGSTOP), 0);

  ASSERT_EQ(test::wait_exit(ctl, 300), 0) << test::read_file(dir + "/controller.log");
  expect_no_running_and_intact(db);
  StudyStore store(db);
  auto t0 = store.trial(0), t1 = store.trial(1), t2 = store.trial(2);
  ASSERT_TRUE(t0 && t1 && t2);
  EXPECT_EQ(t0->state, trial_state::kFail);
  EXPECT_NE(t0->reason.find("signal 9"), std::string::npos) << t0->reason;
  EXPECT_GE(store.evals(0).size(), evals0);  // its curve up to the kill is kept
  EXPECT_EQ(t1->state, trial_state::kFail);
  EXPECT_EQ(t1->reason.rfind("timeout", 0), 0u) << t1->reason;
  EXPECT_GE(store.evals(1).size(), evals1);
  EXPECT_EQ(kill(static_cast<pid_t>(pid1), 0), -1) << "the hung trial's process is still there";
  EXPECT_EQ(t2->state, trial_state::kComplete) << t2->reason;
  EXPECT_EQ(store.evals(2).size(), 3u);  // 768 samples / 256: the whole curve of a normal trial
}

// The controller is SIGKILLed while trial 1 runs: its trial process stops with it, the file stays intact,
// and `study resume` marks trial 1 failed ("controller died") and completes the study.
TEST(Faults, ControllerKilledDuringATrialThenResumeCompletes) {
  std::string dir = test::make_temp_dir("rel-ctlkill");
  std::string db = dir + "/ck/study.db";
  pid_t ctl = test::spawn(test::smoke_study(dir, "ck", with(kLongTrials, {"n_trials=3"})), dir + "/controller.log");
  std::vector<TrialRecord> done;
  int64_t pid1 = 0;
  ASSERT_TRUE(test::wait_for(
      [&] {
        StudyStore s(db);
        auto t1 = s.trial(1);
        if (!t1 || t1->state != trial_state::kRunning || s.evals(1).empty()) return false;
        done = s.trials_in_state(trial_state::kComplete);
        pid1 = t1->pid;
        return true;
      },
      240))
      << test::read_file(dir + "/controller.log");
  ASSERT_EQ(kill(ctl, SIGKILL), 0);
  test::wait_exit(ctl, 10);
  ASSERT_EQ(done.size(), 1u);
  // PDEATHSIG: the orphaned trial stops instead of running on unobserved.
  EXPECT_TRUE(test::wait_for([&] { return kill(static_cast<pid_t>(pid1), 0) != 0; }, 30));
  EXPECT_EQ(test::integrity(db), "ok");

  auto r = test::run({test::bertsweep_bin(), "study", "resume", "ck", "--dir", dir, "--quiet"}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_no_running_and_intact(db);
  StudyStore store(db);
  EXPECT_EQ(store.trial(done[0].number)->values, done[0].values);
  EXPECT_EQ(store.trial(done[0].number)->state, trial_state::kComplete);
  EXPECT_EQ(store.trial(1)->state, trial_state::kFail);
  EXPECT_EQ(store.trial(1)->reason, "controller died");
  EXPECT_EQ(store.trials().size(), 3u);
}

// The study folder lives on a small tmpfs that fills up during trial 1: the controller stops with a
// non-zero exit and an error, the file is intact, and after space is freed `study resume` completes.
TEST(Faults, DiskFullStopsTheControllerCleanlyAndResumeCompletes) {
  std::string dir = test::make_temp_dir("rel-diskfull");
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=48m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << "; needs root / CAP_SYS_ADMIN)";
  }
  struct Unmount {
    std::string d;
    ~Unmount() { umount2(d.c_str(), MNT_DETACH); }
  } unmount{dir};
  std::string db = dir + "/df/study.db";
  std::string log = dir + "/../diskfull-controller." + std::to_string(getpid()) + ".log";
  pid_t ctl = test::spawn(test::smoke_study(dir, "df", with(kLongTrials, {"n_trials=3"})), log);
  std::vector<TrialRecord> done;
  ASSERT_TRUE(test::wait_for(
      [&] {
        StudyStore s(db);
        auto t1 = s.trial(1);
        done = s.trials_in_state(trial_state::kComplete);
        return t1 && t1->state == trial_state::kRunning && done.size() == 1;
      },
      240))
      << test::read_file(log);
  {  // fill every free byte
    std::ofstream filler(dir + "/filler", std::ios::binary);
    std::string mb(1 << 20, 'x');
    while (filler.write(mb.data(), mb.size()) && filler.flush()) {
    }
  }
  int code = test::wait_exit(ctl, 240);
  std::string out = test::read_file(log);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(code, -1) << "the controller hung on a full disk";
  EXPECT_NE(out.find("full"), std::string::npos) << out;
  EXPECT_EQ(test::integrity(db), "ok");
  fs::remove(dir + "/filler");
  auto r = test::run({test::bertsweep_bin(), "study", "resume", "df", "--dir", dir, "--quiet"}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_no_running_and_intact(db);
  StudyStore store(db);
  EXPECT_EQ(store.trial(done[0].number)->values, done[0].values);
  fs::remove(log);
}

// One rank of a 2-rank MPI training run is SIGKILLed: the run ends non-zero within the distributed
// timeout and a margin instead of hanging.
TEST(Faults, KilledMpiRankEndsTheRunInsteadOfHanging) {
  std::string dir = test::make_temp_dir("rel-mpikill");
  std::string events = dir + "/events.jsonl";
  std::vector<std::string> argv = {"/usr/bin/mpirun", "-np", "2", "--oversubscribe"};
  if (geteuid() == 0) argv.push_back("--allow-run-as-root");
  for (std::string a : {test::bertsweep_bin(), std::string("train"), std::string("--config"),
                        test::source_dir() + "/configs/train/bert-tiny-brown.yaml"})
    argv.push_back(a);
  for (std::string s : {"data.dir=" + test::small_brown_dataset(), std::string("distributed.backend=mpi"),
                        std::string("distributed.timeout_s=10"), std::string("target.mlm_accuracy=0.99"),
                        std::string("target.max_samples=100000"), std::string("target.eval_every_samples=64"),
                        std::string("data.eval_samples=32"), std::string("batch.global=16"),
                        std::string("batch.micro=8"), std::string("threads=1")})
    argv.insert(argv.end(), {"--set", s});
  argv.insert(argv.end(), {"--events", events, "--quiet"});
  if (!fs::exists(argv[0])) {
    GTEST_SKIP() << "no /usr/bin/mpirun";
  }
  pid_t mpirun = test::spawn(argv, dir + "/mpirun.log");
  // The ranks: children of mpirun, once training has produced an eval.
  std::vector<pid_t> ranks;
  ASSERT_TRUE(test::wait_for(
      [&] {
        if (test::count_lines_with(events, "\"eval\"") < 1) return false;
        ranks.clear();
        for (const auto& e : fs::directory_iterator("/proc")) {
          std::string stat = test::read_file(e.path().string() + "/stat");
          auto close = stat.rfind(')');
          if (close == std::string::npos) continue;  // (the name is "exe": bertsweep re-executes itself)
          std::istringstream rest(stat.substr(close + 2));
          char state;
          pid_t ppid;
          rest >> state >> ppid;
          if (ppid == mpirun) ranks.push_back(std::stoi(e.path().filename().string()));
        }
        return ranks.size() == 2;
      },
      180))
      << test::read_file(dir + "/mpirun.log");
  auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(ranks[1], SIGKILL), 0);
  int code = test::wait_exit(mpirun, 10 + 50);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(code, -1) << "still running " << took << " s after a rank was killed";
  EXPECT_NE(code, 0);
  EXPECT_TRUE(test::wait_for([&] { return kill(ranks[0], 0) != 0; }, 5)) << "the surviving rank is still alive";
}
