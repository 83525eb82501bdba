// A study whose base config names model.init_checkpoint: every trial starts from those weights. With a
// vanishing learning rate, every trial's first eval loss is the eval loss of the run that wrote the checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "TestUtil.h"

namespace fs = std::filesystem;

TEST(InitCheckpointStudyE2E, EveryTrialStartsFromTheBaseCheckpoint) {
  const std::string dir = bs::test::make_temp_dir("initckpt-study");
  const std::string data = bs::test::small_brown_dataset();
  const std::string train_cfg = bs::test::source_dir() + "/configs/train/bert-tiny-brown.yaml";
  // clang-format off
  auto src = bs::test::run({bs::test::bertsweep_bin(), "train", "--config", train_cfg, "--set", "data.dir=" + data,
                            "--set", "data.eval_samples=128", "--set", "batch.global=32", "--set", "batch.micro=32",
                            "--set", "target.max_samples=320", "--set", "target.eval_every_samples=320", "--set",
                            "schedule.warmup_steps=0", "--set", "threads=2", "--set", "precision=fp32", "--set",
                            "distributed.backend=none", "--set", "checkpoint.dir=" + dir + "/ckpt", "--events",
                            "stdout", "--quiet"});
  // clang-format on
  ASSERT_EQ(src.exit_code, 0) << src.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(src.out, m, std::regex("\"event\": \"eval\".*\"loss\": ([0-9.eE+-]+)"))) << src.out;
  const double src_loss = std::stod(m[1]);
  std::string ckpt;
  for (const auto& e : fs::directory_iterator(dir + "/ckpt"))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) ckpt = e.path().string();
  ASSERT_FALSE(ckpt.empty());

  const std::string study = dir + "/study.yaml";
  std::ofstream(study) << "name: fromckpt\nobjective: samples_to_target\nsampler: random\npruner: none\n"
                       << "n_trials: 2\nparallel: 1\nseed: 5\ntrial_timeout: 300\n"
                       << "base:\n  extends: " << train_cfg << "\n"
                       << "  model: {init_checkpoint: " << ckpt << "}\n"
                       << "  data: {dir: " << data << ", eval_samples: 128}\n"
                       << "  batch: {global: 32, micro: 32}\n  threads: 2\n  precision: fp32\n"
                       << "  target: {mlm_accuracy: 0.99, max_samples: 64, eval_every_samples: 32}\n"
                       << "space:\n  optimizer.lr: {log_uniform: [1.0e-12, 1.0e-11]}\n"
                       << "launcher: {kind: local}\n";
  auto r = bs::test::run(
      {bs::test::bertsweep_bin(), "study", "run", "--config", study, "--dir", dir + "/studies", "--quiet"}, 600);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // First eval of each trial, read from the study file with Python's sqlite3.
  const std::string script = dir + "/read.py";
  std::ofstream(script)
      << "import sqlite3, sys\n"
         "c = sqlite3.connect(sys.argv[1])\n"
         "for t, in c.execute('SELECT DISTINCT trial FROM bs_evals ORDER BY trial'):\n"
         "    l, = c.execute('SELECT loss FROM bs_evals WHERE trial=? ORDER BY samples LIMIT 1', (t,)).fetchone()\n"
         "    print(t, repr(l))\n";
  auto py = bs::test::run({"/usr/bin/python3", script, dir + "/studies/fromckpt/study.db"});
  ASSERT_EQ(py.exit_code, 0) << py.err;
  std::istringstream in(py.out);
  int trials = 0;
  for (int t; in >> t;) {
    double loss;
    in >> loss;
    ++trials;
    EXPECT_NEAR(loss, src_loss, 1e-6 * src_loss) << "trial " << t << " did not start from " << ckpt;
  }
  EXPECT_EQ(trials, 2) << py.out;
}
