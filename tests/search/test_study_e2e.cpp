// End to end: `bertsweep study run` on configs/studies/smoke.yaml with the real trainer (bert-tiny on
// the small Brown dataset), real Optuna and a real study file; then SIGKILL of the controller and
// `study resume`.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <SQLiteCpp/SQLiteCpp.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "TestUtil.h"
#include "studies/StudyStore.h"

using namespace bs;

namespace {
std::vector<std::string> study_run(const std::string& dir, const std::string& data, const std::string& name) {
  return {test::bertsweep_bin(),
          "study",
          "run",
          "--config",
          test::source_dir() + "/configs/studies/smoke.yaml",
          "--set",
          "base.data.dir=" + data,
          "--name",
          name,
          "--dir",
          dir,
          "--quiet"};
}
}  // namespace

TEST(StudyE2E, SmallStudyFillsOptunaAndBertsweepTables) {
  std::string data = test::small_brown_dataset();
  std::string dir = test::make_temp_dir("e2e-study");
  auto r = test::run(study_run(dir, data, "smoke"), 900);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string db = dir + "/smoke/study.db";
  {
    SQLite::Database raw(db, SQLite::OPEN_READONLY);
    for (std::string t : {"studies", "trials", "trial_values", "trial_params", "trial_intermediate_values", "bs_trials",
                          "bs_evals", "bs_throughput", "bs_environment", "bs_study"})
      EXPECT_EQ(raw.execAndGet("SELECT COUNT(*) FROM sqlite_master WHERE name = '" + t + "'").getInt(), 1) << t;
  }
  StudyStore store(db);
  auto trials = store.trials();
  ASSERT_EQ(trials.size(), 6u);
  int complete = 0;
  for (const auto& t : trials) {
    EXPECT_NE(t.state, "RUNNING");
    if (t.state != "FAIL") {
      EXPECT_GE(store.evals(t.number).size(), 1u) << "trial " << t.number;
    }
    complete += t.state == "COMPLETE";
  }
  EXPECT_GE(complete, 1);
  // Stock Optuna reads the same trials and values.
  std::string script = dir + "/read.py";
  std::ofstream(script) << "import optuna, sys\n"
                           "s = optuna.load_study(study_name='smoke', storage='sqlite:///' + sys.argv[1])\n"
                           "for t in s.trials: print(t.number, t.state.name, repr(t.value))\n"
                           "print('best', s.best_trial.number)\n";
  auto py = test::run({"/usr/bin/python3", script, db});
  ASSERT_EQ(py.exit_code, 0) << py.err;
  for (const auto& t : trials) {
    std::ostringstream want;
    want.precision(17);
    want << t.number << " " << t.state << " ";
    if (t.state == "COMPLETE") want << t.values.at(0);
    EXPECT_NE(py.out.find(want.str()), std::string::npos) << want.str() << "\n" << py.out;
  }
  auto st = test::run({test::bertsweep_bin(), "study", "status", "smoke", "--dir", dir});
  EXPECT_EQ(st.exit_code, 0) << st.err;
  EXPECT_NE(st.out.find("best: trial"), std::string::npos) << st.out;
}

TEST(StudyE2E, KilledControllerResumesWithoutLosingTrials) {
  std::string data = test::small_brown_dataset();
  std::string dir = test::make_temp_dir("e2e-resume");
  auto argv = study_run(dir, data, "resumed");
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  std::string db = dir + "/resumed/study.db";
  std::vector<TrialRecord> done;
  for (int i = 0; i < 1200 && done.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    try {
      if (std::ifstream(db)) done = StudyStore(db).trials_in_state("COMPLETE");
    } catch (...) {
    }
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  ASSERT_FALSE(done.empty()) << "no trial completed before the kill";
  auto r = test::run({test::bertsweep_bin(), "study", "resume", "resumed", "--dir", dir, "--quiet"}, 900);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  StudyStore store(db);
  EXPECT_TRUE(store.trials_in_state("RUNNING").empty());
  for (const auto& t : done) EXPECT_EQ(store.trial(t.number)->values, t.values);
  int finished = 0;
  for (const auto& t : store.trials()) finished += !t.retried;
  EXPECT_EQ(finished, 6);
}
