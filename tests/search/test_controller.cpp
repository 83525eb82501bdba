// The controller loop with real processes, real Optuna and a real study file. The trial command is a
// small shell script that speaks the trial protocol (events on fd 3, the trainer's exit codes), chosen
// by model.layers, so every way a trial can end is exercised in seconds; test_study_e2e.cpp runs the
// real `bertsweep train`.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "FakeTrainer.h"
#include "TestUtil.h"
#include "common/Errors.h"
#include "common/TrainConfig.h"
#include "search/Controller.h"
#include "search/OptunaBridge.h"
#include "studies/StudyStore.h"

using namespace bs;
using namespace bs::search;
namespace fs = std::filesystem;

namespace {

StudyConfig study(const std::string& layers, const std::string& extra) {
  return StudyConfig::from_yaml(
      YAML::Load("name: ctl\nseed: 1\n" +
                 std::string(extra.find("sampler") == std::string::npos ? "sampler: grid\n" : "") +
                 (extra.find("pruner") == std::string::npos ? "pruner: none\n" : "") +
                 "base: {target: {max_samples: 4000, eval_every_samples: 250}}\n"
                 "space:\n  model.layers: {choice: " +
                 layers + "}\n" + extra),
      "test");
}

ControllerOptions quiet_options(const std::string& dir, const std::string& script) {
  ControllerOptions o;
  o.dir = dir;
  o.trainer_exe = script;
  o.quiet = true;
  return o;
}

std::map<int64_t, TrialRecord> by_layers(const std::string& db) {
  std::map<int64_t, TrialRecord> out;
  for (auto& t : StudyStore(db).trials()) out[YAML::Load(t.config_yaml)["model"]["layers"].as<int64_t>()] = t;
  return out;
}

}  // namespace

TEST(Controller, EveryWayATrialEndsIsRecordedAndTheStudyGoesOn) {
  std::string dir = test::make_temp_dir("ctl");
  ControllerOptions o = quiet_options(dir, test::write_fake_trainer(dir));
  o.kill_grace_s = 1;
  Controller c(study("[1, 2, 3, 4, 5, 6]", "n_trials: 6\nparallel: 2\ntrial_timeout: 2\n"), o);
  ASSERT_EQ(c.run(), 0);
  auto t = by_layers(c.db_path());
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t[1].state, "COMPLETE");
  EXPECT_TRUE(t[1].reached);
  EXPECT_EQ(t[1].values.at(0), 1000);
  EXPECT_EQ(t[2].state, "COMPLETE");
  EXPECT_FALSE(t[2].reached);
  EXPECT_EQ(t[2].values.at(0), 8000);  // 2 * max_samples: ranks below every reached trial
  EXPECT_EQ(t[3].state, "FAIL");
  EXPECT_NE(t[3].reason.find("NaN"), std::string::npos) << t[3].reason;
  EXPECT_NE(t[3].reason.find("loss is nan"), std::string::npos) << t[3].reason;
  EXPECT_EQ(t[3].exit_code, 4);
  EXPECT_EQ(t[4].state, "FAIL");
  EXPECT_NE(t[4].reason.find("SIGSEGV"), std::string::npos) << t[4].reason;
  EXPECT_EQ(t[5].state, "FAIL");
  EXPECT_NE(t[5].reason.find("timeout"), std::string::npos) << t[5].reason;
  EXPECT_EQ(t[6].state, "COMPLETE");
  EXPECT_EQ(t[6].values.at(0), 500);
  StudyStore store(c.db_path());
  EXPECT_EQ(store.evals(t[1].number).size(), 4u);
  EXPECT_EQ(store.evals(t[6].number).size(), 2u);
  EXPECT_EQ(store.throughput(t[1].number).size(), 4u);
  EXPECT_EQ(store.environment().count("optuna_version"), 1u);
  EXPECT_TRUE(fs::exists(t[3].trial_dir + "/stderr.log"));
  EXPECT_TRUE(fs::exists(t[3].trial_dir + "/config.yaml"));
  // Optuna holds the same outcome.
  OptunaBridge b(c.db_path(), study("[1, 2, 3, 4, 5, 6]", "n_trials: 6\nparallel: 2\ntrial_timeout: 2\n"));
  EXPECT_EQ(b.best_trial_number().value(), t[6].number);
  for (const auto& info : b.trials()) {
    EXPECT_EQ(info.state, StudyStore(c.db_path()).trial(info.number)->state);
  }
  std::string status = study_status_text(dir, "ctl");
  EXPECT_NE(status.find("FAIL 3"), std::string::npos) << status;
  // Best first: the row after the header is the trial that reached the target soonest.
  std::stringstream lines(status);
  std::string line;
  for (int i = 0; i < 3; ++i) std::getline(lines, line);
  EXPECT_EQ(line.rfind(std::to_string(t[6].number) + " ", 0), 0u) << status;
}

TEST(Controller, PrunesTrialsBehindTheMedian) {
  std::string dir = test::make_temp_dir("ctl");
  ControllerOptions o = quiet_options(dir, test::write_fake_trainer(dir));
  // layers 1 first (good curves), then 2, whose accuracy stays at 0.01: pruned at its first report.
  Controller c(study("[1, 6, 2]", "sampler: random\npruner: median\nn_trials: 8\nparallel: 1\n"), o);
  // MedianPruner needs 2 finished trials: run the good ones by enqueuing through a first pass.
  ASSERT_EQ(c.run(), 0);
  int pruned = 0, complete_bad = 0;
  for (auto& t : StudyStore(c.db_path()).trials()) {
    int layers = YAML::Load(t.config_yaml)["model"]["layers"].as<int>();
    if (t.state == "PRUNED") {
      ++pruned;
      EXPECT_NE(layers, 1);  // the best curve is never behind the median
      EXPECT_NE(t.reason.find("pruned at"), std::string::npos);
      EXPECT_GE(StudyStore(c.db_path()).evals(t.number).size(), 1u);  // the curve is kept
    }
    if (t.state == "COMPLETE" && layers == 2) ++complete_bad;
  }
  // Whenever a lagging trial came after two finished ones it was pruned.
  EXPECT_GE(pruned, 1);  // seed 1: a layers-2 trial comes after two good ones
  (void)complete_bad;
}

TEST(Controller, ResumesAfterTheControllerIsKilled) {
  std::string dir = test::make_temp_dir("ctl");
  std::string script = test::write_fake_trainer(dir);
  const std::string extra = "n_trials: 6\nparallel: 2\nretry_failed: 1\n";
  const std::string layers = "[1, 2, 6]";
  std::string db = dir + "/ctl/study.db";
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the controller to be killed: Python starts in this process only
    setenv("SLOW", "1", 1);
    ControllerOptions o = quiet_options(dir, script);
    Controller c(study(layers, extra + "sampler: random\n"), o);
    _exit(c.run());
  }
  // Wait for at least two finished trials, then SIGKILL it mid-study.
  std::map<int64_t, TrialRecord> before;
  for (int i = 0; i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!fs::exists(db)) continue;
    before.clear();
    try {
      for (auto& t : StudyStore(db).trials())
        if (t.state == "COMPLETE") before[t.number] = t;
    } catch (...) {
    }
    if (before.size() >= 2) break;
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_GE(before.size(), 2u);
  bool was_running = !StudyStore(db).trials_in_state("RUNNING").empty();

  ControllerOptions o = quiet_options(dir, script);
  StudyConfig cfg = load_stored_study(dir, "ctl");
  ASSERT_EQ(Controller(cfg, o).run(), 0);
  StudyStore store(db);
  EXPECT_TRUE(store.trials_in_state("RUNNING").empty());
  for (const auto& kv : before) {  // nothing finished was lost
    auto t = store.trial(kv.first);
    ASSERT_TRUE(t);
    EXPECT_EQ(t->state, "COMPLETE");
    EXPECT_EQ(t->values, kv.second.values);
    EXPECT_EQ(store.evals(kv.first).size(), store.evals(kv.first).size());
  }
  int died = 0, complete = 0;
  for (const auto& t : store.trials()) {
    if (t.reason == "controller died") {
      ++died;
      EXPECT_TRUE(t.retried);
    }
    complete += t.state == "COMPLETE";
  }
  if (was_running) {
    EXPECT_GE(died, 1);
  }
  EXPECT_EQ(complete, 6);  // re-queued trials ran again: 6 trials' worth of results
  OptunaBridge b(db, cfg);
  for (const auto& info : b.trials()) EXPECT_NE(info.state, "RUNNING");
}

TEST(Controller, StratifiedStudyGivesEveryCellAnEqualShareAndKeepsItOnResume) {
  std::string dir = test::make_temp_dir("ctl");
  ControllerOptions o = quiet_options(dir, test::write_fake_trainer(dir));
  // TPE alone would pile onto layers 6 (best) once it has a model; stratify must keep all 6 cells equal.
  const std::string extra =
      "  model.heads: {choice: [1, 2]}\n  optimizer.lr: {log_uniform: [1.0e-4, 1.0e-2]}\n"
      "sampler: tpe\nparallel: 2\nstratify: [model.layers, model.heads]\n";
  auto cfg = [&](int n) { return study("[1, 2, 6]", extra + "n_trials: " + std::to_string(n) + "\n"); };
  ASSERT_EQ(cfg(12).strata().size(), 6u);
  auto counts = [&] {
    std::map<std::pair<int64_t, int64_t>, int> n;
    for (auto& t : StudyStore(dir + "/ctl/study.db").trials()) {
      YAML::Node c = YAML::Load(t.config_yaml);
      ++n[{c["model"]["layers"].as<int64_t>(), c["model"]["heads"].as<int64_t>()}];
    }
    return n;
  };
  ASSERT_EQ(Controller(cfg(12), o).run(), 0);
  auto n = counts();
  ASSERT_EQ(n.size(), 6u);
  for (const auto& kv : n) EXPECT_EQ(kv.second, 2) << kv.first.first << "x" << kv.first.second;
  ASSERT_EQ(Controller(cfg(18), o).run(), 0);  // resumed with a larger budget
  n = counts();
  for (const auto& kv : n) EXPECT_EQ(kv.second, 3) << kv.first.first << "x" << kv.first.second;
}

// Per-cell TPE and a retry: the failed trial's retry goes first with its exact parameters (no cell is
// chosen for it and it does not count for its cell), then the cells stay balanced.
TEST(Controller, StratifiedTpeStudyRetriesAFailedTrialWithItsParameters) {
  std::string dir = test::make_temp_dir("ctl");
  ControllerOptions o = quiet_options(dir, test::write_fake_trainer(dir));
  ASSERT_EQ(Controller(study("[1, 4]",  // layers 4 segfaults: retried once
                             "  optimizer.lr: {log_uniform: [1.0e-4, 1.0e-2]}\n"
                             "sampler: tpe\nstratify: [model.layers]\nretry_failed: 1\nn_trials: 4\n"),
                       o)
                .run(),
            0);
  auto trials = StudyStore(dir + "/ctl/study.db").trials();
  ASSERT_EQ(trials.size(), 6u);  // 4 in the budget plus the 2 retries
  std::map<int64_t, int> by_cell;
  for (const auto& t : trials) {
    if (t.retry_of >= 0) {
      EXPECT_EQ(t.number, t.retry_of + 1) << "a retry goes first";
      EXPECT_EQ(t.params_json, trials.at(t.retry_of).params_json);
    } else {
      ++by_cell[YAML::Load(t.config_yaml)["model"]["layers"].as<int64_t>()];
    }
  }
  EXPECT_EQ(by_cell[1], 2);
  EXPECT_EQ(by_cell[4], 2);
}

// Layers-2 trials stay at 1% accuracy and layers-1 trials climb: the whole study's median would prune
// the second layers-2 trial, but within its cell it is no worse than the others.
TEST(Controller, StratifiedMedianPrunerComparesTrialsOfTheSameCell) {
  std::string dir = test::make_temp_dir("ctl");
  ControllerOptions o = quiet_options(dir, test::write_fake_trainer(dir));
  ASSERT_EQ(
      Controller(study("[1, 2]", "sampler: random\npruner: median\nstratify: [model.layers]\nn_trials: 6\n"), o).run(),
      0);
  auto trials = StudyStore(dir + "/ctl/study.db").trials();
  ASSERT_EQ(trials.size(), 6u);
  for (const auto& t : trials) EXPECT_EQ(t.state, "COMPLETE") << t.number << " " << t.reason;
}

TEST(Controller, StratifyMustNameUnconditionalChoiceParameters) {
  auto err = [](const std::string& extra) {
    try {
      study("[1, 2]", extra + "sampler: tpe\n");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err("stratify: [model.heads]\n").find("'model.heads' is not a parameter of 'space'"), std::string::npos);
  std::string e = err("  optimizer.lr: {log_uniform: [1.0e-4, 1.0e-2]}\nstratify: [optimizer.lr]\n");
  EXPECT_NE(e.find("must be an unconditional choice parameter"), std::string::npos) << e;
  e = err("stratify: [model.layers, model.layers]\n");
  EXPECT_NE(e.find("listed twice"), std::string::npos) << e;
  EXPECT_EQ(err("stratify: model.layers\n"), "no error");
}

TEST(Controller, FirstSignalDrainsRunningTrialsAndResumeFinishesTheBudget) {
  std::string dir = test::make_temp_dir("ctl");
  std::string script = test::write_fake_trainer(dir);
  const std::string extra = "n_trials: 6\nparallel: 2\nsampler: random\n";
  std::string db = dir + "/ctl/study.db";
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("SLOW", "1", 1);  // each trial takes ~1.6 s
    ControllerOptions o = quiet_options(dir, script);
    _exit(Controller(study("[1, 6]", extra), o).run());
  }
  bool running = false;
  for (int i = 0; i < 600 && !running; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    try {
      running = fs::exists(db) && !StudyStore(db).trials_in_state("RUNNING").empty();
    } catch (...) {
    }
  }
  ASSERT_TRUE(running);
  kill(child, SIGINT);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "the controller died instead of draining";
  EXPECT_EQ(WEXITSTATUS(status), exit_code::kTerminated);
  StudyStore store(db);
  auto trials = store.trials();
  EXPECT_LT(trials.size(), 6u);  // stopped early
  for (const auto& t : trials) EXPECT_EQ(t.state, "COMPLETE") << "trial " << t.number << ": " << t.reason;

  ControllerOptions o = quiet_options(dir, script);
  ASSERT_EQ(Controller(load_stored_study(dir, "ctl"), o).run(), 0);
  int complete = 0;
  for (const auto& t : StudyStore(db).trials()) complete += t.state == "COMPLETE";
  EXPECT_EQ(complete, 6);
}

// --- GPU trials ---

namespace {
std::string config_error(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  try {
    StudyConfig::from_yaml(YAML::Load(yaml), "g.yaml", sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}
const std::string kGpuStudy =
    "name: g\nsampler: random\npruner: none\nbase: {target: {max_samples: 4000, eval_every_samples: 250}}\n"
    "space:\n  model.layers: {choice: [1, 6]}\n";
}  // namespace

TEST(Controller, GpuLauncherKeysAreCheckedWithFileLineKeyAndFix) {
  // line 7 is the launcher line
  std::string e = config_error(kGpuStudy + "launcher: {gpus: [0, 1], gpus_per_trial: 1}\nparallel: 3\n");
  EXPECT_NE(e.find("g.yaml:7: parallel (3) x launcher.gpus_per_trial (1) needs 3 GPUs but launcher.gpus lists 2 "
                   "(0,1); lower parallel or gpus_per_trial, or list more GPUs"),
            std::string::npos)
      << e;
  e = config_error(kGpuStudy + "launcher: {gpus: [0, 1, 2, 3], gpus_per_trial: 2}\nparallel: 4\n");
  EXPECT_NE(e.find("needs 8 GPUs but launcher.gpus lists 4 (0,1,2,3)"), std::string::npos) << e;
  e = config_error(kGpuStudy + "launcher:\n  gpus_per_trial: -1\n");
  EXPECT_NE(e.find("g.yaml:8: 'launcher.gpus_per_trial' must be an integer >= 0, got '-1'"), std::string::npos) << e;
  e = config_error(kGpuStudy + "launcher:\n  gpus: [0, -2]\n");
  EXPECT_NE(e.find("g.yaml:8: 'launcher.gpus' must be an integer >= 0, got '-2'"), std::string::npos) << e;
  e = config_error(kGpuStudy + "launcher:\n  gpus: [0, 1, 0]\n");
  EXPECT_NE(e.find("g.yaml:8: 'launcher.gpus' lists GPU 0 twice; list each GPU once"), std::string::npos) << e;
  e = config_error(kGpuStudy + "launcher:\n  gpus: []\n");
  EXPECT_NE(e.find("'launcher.gpus' must be a non-empty list of GPU ids"), std::string::npos) << e;
  e = config_error(kGpuStudy + "launcher:\n  gpus: GPU-abc\n");
  EXPECT_NE(e.find("'launcher.gpus' must be a non-empty list"), std::string::npos) << e;
  e = config_error(kGpuStudy + "launcher:\n  kind: local\n  gpu_per_trial: 1\n");
  EXPECT_NE(e.find("g.yaml:9: unknown key 'launcher.gpu_per_trial' (known: kind, ranks, hostfile, extra_args, "
                   "gpus_per_trial, gpus, cpus_per_trial, nodes"),
            std::string::npos)
      << e;
  // GPU trials run with device=cuda: a base that insists on the CPU, or a searched device, contradicts that.
  e = config_error(kGpuStudy + "launcher: {gpus_per_trial: 1}\n", {"base.device=cpu"});
  EXPECT_NE(e.find("base training config says device: cpu"), std::string::npos) << e;
  e = config_error(kGpuStudy + "  device: {choice: [cpu, cuda]}\nlauncher: {gpus_per_trial: 1}\n");
  EXPECT_NE(e.find("'device' cannot be searched"), std::string::npos) << e;
  // What fits is accepted, also through --set; without a list, the machine is asked when the controller starts.
  EXPECT_EQ(config_error(kGpuStudy + "launcher: {gpus: [0, 1, 2, 3], gpus_per_trial: 2}\nparallel: 2\n"), "no error");
  EXPECT_EQ(config_error(kGpuStudy, {"launcher.gpus=[0, 1]", "launcher.gpus_per_trial=1", "parallel=2"}), "no error");
  EXPECT_EQ(config_error(kGpuStudy + "launcher: {gpus_per_trial: 4}\nparallel: 8\n"), "no error");
}

TEST(Controller, GpuLauncherKeysRoundTripThroughTheStoredConfig) {
  StudyConfig c = StudyConfig::from_yaml(
      YAML::Load(kGpuStudy + "parallel: 2\nlauncher: {kind: srun, ranks: 2, gpus_per_trial: 2, gpus: [3, 1, 0, 2]}\n"),
      "g.yaml");
  EXPECT_EQ(c.launcher.gpus_per_trial, 2);
  EXPECT_EQ(c.launcher.gpus, (std::vector<std::string>{"3", "1", "0", "2"}));
  std::string text = c.to_yaml_string();
  EXPECT_NE(text.find("gpus_per_trial: 2"), std::string::npos) << text;
  EXPECT_NE(text.find("gpus: [3, 1, 0, 2]"), std::string::npos) << text;
  StudyConfig back = StudyConfig::from_yaml(YAML::Load(text), "stored");
  EXPECT_EQ(back.launcher.gpus_per_trial, 2);
  EXPECT_EQ(back.launcher.gpus, c.launcher.gpus);
  EXPECT_EQ(back.launcher.kind, "srun");
  EXPECT_EQ(back.to_yaml_string(), text);
  // Not part of the search: a CPU study may be continued on GPUs. CPU configs store no GPU keys.
  StudyConfig cpu = StudyConfig::from_yaml(YAML::Load(kGpuStudy + "parallel: 2\n"), "g.yaml");
  EXPECT_EQ(cpu.identity(), c.identity());
  EXPECT_EQ(cpu.launcher.gpus_per_trial, 0);
  EXPECT_EQ(cpu.to_yaml_string().find("gpus"), std::string::npos);
  StudyConfig absent = StudyConfig::from_yaml(YAML::Load(kGpuStudy + "launcher: {gpus_per_trial: 1}\n"), "g.yaml");
  EXPECT_TRUE(absent.launcher.gpus.empty());  // all visible
  EXPECT_EQ(StudyConfig::from_yaml(YAML::Load(absent.to_yaml_string()), "stored").launcher.gpus_per_trial, 1);
}

// A real study on "GPUs" 0 and 1, one per trial, two at a time: a wrapper around the trial script records
// what each trial got and holds a lock per GPU while it runs, so two trials on one GPU fail the trial.
TEST(Controller, PlacesParallelTrialsOnDisjointGpusAndStoresTheAssignment) {
  std::string dir = test::make_temp_dir("ctl");
  std::string script = test::write_fake_trainer(dir);
  fs::create_directories(dir + "/locks");
  std::string wrapper = dir + "/gpu-trial.sh";
  std::ofstream(wrapper)
      << "#!/bin/sh\n"
         "d=$(dirname \"$3\")\n"
         "echo \"$CUDA_VISIBLE_DEVICES\" > \"$d/gpus.txt\"\n"
         "echo \"$*\" > \"$d/args.txt\"\n"
         "lock=" +
             dir +
             "/locks/gpu$CUDA_VISIBLE_DEVICES\n"
             "mkdir \"$lock\" 2>/dev/null || { echo \"GPU $CUDA_VISIBLE_DEVICES taken\" >&2; exit 5; }\n" +
             script +
             " \"$@\"; rc=$?\n"
             "rmdir \"$lock\"\n"
             "exit $rc\n";
  fs::permissions(wrapper, fs::perms::owner_all);
  setenv("SLOW", "1", 1);  // trials of ~1.6 s, so that two run at once
  Controller c(StudyConfig::from_yaml(YAML::Load(kGpuStudy + "n_trials: 4\nparallel: 2\nlauncher: {gpus: [0, 1], "
                                                             "gpus_per_trial: 1}\n"),
                                      "g.yaml"),
               quiet_options(dir, wrapper));
  int code = c.run();
  unsetenv("SLOW");
  ASSERT_EQ(code, 0);
  OptunaBridge b(c.db_path(), StudyConfig::from_yaml(YAML::Load(kGpuStudy), "g.yaml"));
  std::map<int64_t, std::string> attrs;
  for (const auto& info : b.trials())
    if (info.user_attrs.count("bs_gpus")) attrs[info.number] = info.user_attrs.at("bs_gpus");
  std::set<std::string> used;
  auto trials = StudyStore(c.db_path()).trials();
  ASSERT_EQ(trials.size(), 4u);
  for (const auto& t : trials) {
    EXPECT_EQ(t.state, "COMPLETE") << "trial " << t.number << ": " << t.reason;  // never two on one GPU
    std::string got;
    std::getline(std::ifstream(t.trial_dir + "/gpus.txt"), got);
    EXPECT_TRUE(got == "0" || got == "1") << got;
    EXPECT_EQ(attrs[t.number], got) << "trial " << t.number;  // the stored assignment is what it got
    used.insert(got);
    std::string args;
    std::getline(std::ifstream(t.trial_dir + "/args.txt"), args);
    EXPECT_NE(args.find("--set device=cuda"), std::string::npos) << args;
  }
  EXPECT_EQ(used, (std::set<std::string>{"0", "1"}));
  EXPECT_EQ(StudyStore(c.db_path()).environment().at("gpus"), "0,1");
  std::string status = study_status_text(dir, "g");
  EXPECT_NE(status.find(" gpus "), std::string::npos) << status;
  std::stringstream lines(status);
  std::string line;
  std::getline(lines, line);
  std::getline(lines, line);
  for (int i = 0; i < 4 && std::getline(lines, line); ++i) {  // COMPLETE rows: no reason, gpus come last
    std::stringstream fields(line);
    std::string first, last, f;
    fields >> first;
    for (last = first; fields >> f;) last = f;
    EXPECT_EQ(last, attrs[std::stoll(first)]) << line;
  }
}

// GPUs found on the machine are checked when the controller starts (a new study and a resumed one), before
// any trial runs or anything is written.
TEST(Controller, TooFewVisibleGpusStopTheStudyBeforeAnyTrialAtStartAndResume) {
  std::string dir = test::make_temp_dir("ctl");
  std::string script = test::write_fake_trainer(dir);
  StudyConfig cfg = StudyConfig::from_yaml(
      YAML::Load(kGpuStudy + "n_trials: 2\nparallel: 2\nlauncher: {gpus_per_trial: 1}\n"), "g.yaml");
  auto error_of = [&](const StudyConfig& c) {
    try {
      Controller(c, quiet_options(dir, script)).run();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  setenv("CUDA_VISIBLE_DEVICES", "0", 1);
  std::string e = error_of(cfg);
  EXPECT_NE(e.find("g.yaml: parallel (2) x launcher.gpus_per_trial (1) needs 2 GPUs but 1 GPU(s) are visible (0) "
                   "in CUDA_VISIBLE_DEVICES='0'"),
            std::string::npos)
      << e;
  EXPECT_FALSE(fs::exists(dir + "/g/study.db"));  // nothing started
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  e = error_of(cfg);
  EXPECT_NE(e.find("no GPU is visible"), std::string::npos) << e;
  setenv("CUDA_VISIBLE_DEVICES", "GPU-aa,GPU-bb", 1);
  EXPECT_EQ(error_of(cfg), "no error");
  EXPECT_EQ(StudyStore(dir + "/g/study.db").environment().at("gpus"), "GPU-aa,GPU-bb");
  setenv("CUDA_VISIBLE_DEVICES", "1", 1);
  e = error_of(load_stored_study(dir, "g"));
  EXPECT_NE(e.find("needs 2 GPUs but 1 GPU(s) are visible (1)"), std::string::npos) << e;
  unsetenv("CUDA_VISIBLE_DEVICES");
}
