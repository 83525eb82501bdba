// `study confirm`'s runs (search/ConfirmRuns.h) through the trial pool, with real processes and a real study
// file: the trainer is a small shell script that speaks the trial protocol (as in test_controller.cpp),
// chosen by model.layers, so that a run that hangs and a Ctrl-C during a confirmation take seconds.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "FakeTrainer.h"
#include "TestUtil.h"
#include "common/Errors.h"
#include "common/TrainConfig.h"
#include "search/ConfirmRuns.h"
#include "search/StudyConfig.h"
#include "studies/ConfirmStore.h"
#include "studies/StudyStore.h"

using namespace bs;
using namespace bs::search;
namespace fs = std::filesystem;

namespace {

// A study file holding study `cf` (its config says trial_timeout) and one COMPLETE trial per entry of
// `layers`, numbered from 0, trial i with batch 16 * (i + 1); returns the sources to confirm, in that order.
std::vector<ConfirmSource> make_study(const std::string& dir, const std::string& trial_timeout,
                                      const std::vector<int>& layers) {
  fs::create_directories(dir + "/cf");
  StudyStore store(dir + "/cf/study.db");
  const StudyConfig c = StudyConfig::from_yaml(
      YAML::Load("name: cf\nseed: 1\nsampler: random\npruner: none\ntrial_timeout: " + trial_timeout +
                 "\nbase: {target: {max_samples: 4000, eval_every_samples: 250}}\n"
                 "space:\n  model.layers: {choice: [1, 5]}\n"),
      "test");
  store.save_study("cf", c.to_yaml_string());
  std::vector<ConfirmSource> sources;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    TrialRecord t;
    t.number = static_cast<int64_t>(i);
    t.state = trial_state::kComplete;
    t.reached = true;
    t.values = {1000};
    const TrainConfig config = TrainConfig::from_yaml(
        // A batch of its own: runs are named (and stored) by optimizer, batch and seed.
        YAML::Load("model: {layers: " + std::to_string(layers[i]) +
                   "}\nbatch: {global: " + std::to_string(16 * (i + 1)) + ", micro: " + std::to_string(16 * (i + 1)) +
                   "}\ntarget: {max_samples: 4000, eval_every_samples: 250}\n"),
        "test trial");
    t.config_yaml = config.to_yaml_string();
    store.insert_trial(t);
    sources.push_back({t, config.optimizer.name, config.batch.global});
  }
  return sources;
}

ConfirmRunOptions options(const std::string& dir, std::vector<ConfirmSource> sources, std::vector<int64_t> seeds) {
  ConfirmRunOptions o;
  o.dir = dir;
  o.study = "cf";
  o.trainer_exe = test::write_fake_trainer(dir);  // layers 1 reaches the target at 1000 samples, 5 goes silent
  o.sources = std::move(sources);
  o.seeds = std::move(seeds);
  o.quiet = true;
  o.kill_grace_s = 1;
  return o;
}

// Runs the confirmation in a child process with slow runs (~1.6 s each) and returns its pid once the first
// run has started (its folder has its config, written just before the launch), or -1.
pid_t start_in_child(const ConfirmRunOptions& o, const std::string& dir) {
  const pid_t child = fork();
  if (child == 0) {
    setenv("SLOW", "1", 1);
    std::ostringstream progress;
    const ConfirmRunsResult r = run_confirmations(o, progress);
    _exit(r.drained ? exit_code::kTerminated : exit_code::kOk);
  }
  const std::string first = dir + "/cf/confirm/session-1/" + o.sources[0].optimizer + "-b" +
                            std::to_string(o.sources[0].batch) + "-seed1/config.yaml";
  for (int i = 0; i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (fs::exists(first)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      return child;
    }
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return -1;
}

}  // namespace

// The study's trial_timeout holds for confirmation runs as for its trials: the silent run is stopped (SIGTERM)
// and stored with its exit code, not reached, and the reason; the other run is unaffected.
TEST(ConfirmRuns, ARunWithoutAnEventForTrialTimeoutIsStoppedAndStoredAsTimedOut) {
  const std::string dir = test::make_temp_dir("confirm-runs");
  ConfirmRunOptions o = options(dir, make_study(dir, "2", {1, 5}), {7});
  o.parallel = 2;
  std::ostringstream progress;
  const auto t0 = std::chrono::steady_clock::now();
  const ConfirmRunsResult r = run_confirmations(o, progress);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 20) << "the silent run was not stopped (it sleeps 30 s)";
  EXPECT_FALSE(r.drained);
  ASSERT_EQ(r.runs.size(), 2u);
  const auto stored = ConfirmStore(r.db, false).runs();
  ASSERT_EQ(stored.size(), 2u);
  for (const auto& run : stored) {
    EXPECT_EQ(run.session, r.session);
    EXPECT_EQ(run.seed, 7);
    if (run.source_trial == 0) {
      EXPECT_EQ(run.exit_code, 0);
      EXPECT_TRUE(run.reached);
      EXPECT_EQ(run.samples_to_target.value_or(-1), 1000);
      EXPECT_EQ(run.reason, "");
    } else {
      EXPECT_EQ(run.source_trial, 1);
      EXPECT_EQ(run.exit_code, 128 + SIGTERM) << run.reason;
      EXPECT_FALSE(run.reached);
      EXPECT_EQ(run.reason, "timeout: no event for 2 s");
    }
  }
}

// The first SIGINT drains: the running run finishes and is stored, the seeds not started yet are not run or
// stored, and the caller hears that it drained (the CLI then exits exit_code::kTerminated, as `study run`).
TEST(ConfirmRuns, FirstSignalDrainsTheRunningRunAndStoresNothingNotStarted) {
  const std::string dir = test::make_temp_dir("confirm-runs");
  ConfirmRunOptions o = options(dir, make_study(dir, "0", {1}), {1, 2, 3});
  const std::string db = dir + "/cf/study.db";
  const pid_t child = start_in_child(o, dir);
  ASSERT_GT(child, 0) << "the first run did not start";
  kill(child, SIGINT);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "study confirm died instead of draining";
  EXPECT_EQ(WEXITSTATUS(status), exit_code::kTerminated);
  const auto stored = ConfirmStore(db, false).runs();
  ASSERT_EQ(stored.size(), 1u) << "only the run that was running is stored";
  EXPECT_EQ(stored[0].seed, 1);
  EXPECT_EQ(stored[0].exit_code, 0);
  EXPECT_TRUE(stored[0].reached) << "the drained run was not left to finish";
  EXPECT_FALSE(fs::exists(dir + "/cf/confirm/session-1/" + o.sources[0].optimizer + "-b" +
                          std::to_string(o.sources[0].batch) + "-seed2"))
      << "a seed started after the signal";
}

// A second SIGINT stops the running run (SIGTERM) instead of waiting for it: cut short by the user, it is not
// stored (its "not reached" would be untrue), and the confirmation still ends as drained.
TEST(ConfirmRuns, SecondSignalStopsTheRunningRunWhichIsNotStored) {
  const std::string dir = test::make_temp_dir("confirm-runs");
  ConfirmRunOptions o = options(dir, make_study(dir, "0", {1}), {1, 2});
  const std::string db = dir + "/cf/study.db";
  const pid_t child = start_in_child(o, dir);
  ASSERT_GT(child, 0) << "the first run did not start";
  const auto t0 = std::chrono::steady_clock::now();
  kill(child, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(child, SIGINT);
  int status = 0;
  waitpid(child, &status, 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(WIFEXITED(status)) << "study confirm died instead of stopping its run";
  EXPECT_EQ(WEXITSTATUS(status), exit_code::kTerminated);
  EXPECT_LT(seconds, 1.2) << "the run was left to finish (it takes 1.6 s)";
  EXPECT_TRUE(ConfirmStore(db, false).runs().empty());
}

// --resume continues the latest session: only the seeds it has not stored run, into that session, a folder
// left by a run that was never stored is replaced, a complete session runs nothing, and without --resume the
// next confirmation is a new session.
TEST(ConfirmRuns, ResumeRunsOnlyTheSeedsTheLatestSessionHasNotStored) {
  const std::string dir = test::make_temp_dir("confirm-runs");
  const std::vector<ConfirmSource> sources = make_study(dir, "0", {1});
  std::ostringstream progress;
  const ConfirmRunsResult first = run_confirmations(options(dir, sources, {1}), progress);
  ASSERT_EQ(first.session, 1);
  ASSERT_EQ(first.runs.size(), 1u);
  const std::string seed2 =
      dir + "/cf/confirm/session-1/" + sources[0].optimizer + "-b" + std::to_string(sources[0].batch) + "-seed2";
  fs::create_directories(seed2);
  std::ofstream(seed2 + "/left-by-a-run-cut-short") << "x\n";

  ConfirmRunOptions o = options(dir, sources, {1, 2});
  o.resume = true;
  const ConfirmRunsResult resumed = run_confirmations(o, progress);
  EXPECT_EQ(resumed.session, 1);
  ASSERT_EQ(resumed.runs.size(), 1u) << "seed 1 was stored already";
  EXPECT_EQ(resumed.runs[0].seed, 2);
  ASSERT_EQ(resumed.earlier.size(), 1u);
  EXPECT_EQ(resumed.earlier[0].seed, 1);
  EXPECT_FALSE(fs::exists(seed2 + "/left-by-a-run-cut-short")) << "the stale folder was not replaced";
  const auto stored = ConfirmStore(first.db, false).runs();
  ASSERT_EQ(stored.size(), 2u);
  for (const auto& r : stored) {
    EXPECT_EQ(r.session, 1);
    EXPECT_TRUE(r.reached);
  }

  const ConfirmRunsResult again = run_confirmations(o, progress);
  EXPECT_EQ(again.session, 1);
  EXPECT_TRUE(again.runs.empty()) << "a complete session was run again";
  EXPECT_EQ(again.earlier.size(), 2u);
  EXPECT_EQ(run_confirmations(options(dir, sources, {1}), progress).session, 2);
}

// --resume refuses, before running or writing anything, a session that confirmed another trial for a pair
// (the study's best changed since) or ran it with another config.
TEST(ConfirmRuns, ResumeRefusesASessionThatRanAnotherTrialOrConfigForAPair) {
  const std::string dir = test::make_temp_dir("confirm-runs");
  const std::vector<ConfirmSource> sources = make_study(dir, "0", {1});
  std::ostringstream progress;
  const ConfirmRunsResult first = run_confirmations(options(dir, sources, {1}), progress);
  ASSERT_EQ(first.runs.size(), 1u);

  std::vector<ConfirmSource> newer = sources;
  newer[0].trial.number = 7;
  ConfirmRunOptions o = options(dir, newer, {1, 2});
  o.resume = true;
  try {
    run_confirmations(o, progress);
    ADD_FAILURE() << "resumed a session that confirmed trial 0 with trial 7";
  } catch (const StudyError& e) {
    EXPECT_NE(std::string(e.what()).find("now the best is trial 7"), std::string::npos) << e.what();
  }
  o = options(dir, sources, {1, 2});
  o.resume = true;
  o.sets = {"target.max_samples=3000"};
  try {
    run_confirmations(o, progress);
    ADD_FAILURE() << "resumed a session with another config";
  } catch (const StudyError& e) {
    EXPECT_NE(std::string(e.what()).find("another config"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ConfirmStore(first.db, false).runs().size(), 1u);
  EXPECT_FALSE(fs::exists(dir + "/cf/confirm/session-1/" + sources[0].optimizer + "-b" +
                          std::to_string(sources[0].batch) + "-seed2"))
      << "a refused resume started a run";
}
