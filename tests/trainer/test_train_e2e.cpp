// `bertsweep train` end to end on real Brown data: learning, the trial protocol, MLLOG, SIGTERM + resume,
// NaN detection and configs that do not fit the data.
#include <gtest/gtest.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "TestUtil.h"
#include "common/ExitCodes.h"
#include "trainer/ShardIO.h"

namespace fs = std::filesystem;
using bs::test::run;

namespace {

std::string tiny_config(const std::string& dir, const std::string& extra = "") {
  std::string path = dir + "/train.yaml";
  std::ofstream(path) << "extends: " << bs::test::source_dir() << "/configs/models/bert-tiny.yaml\n"
                      << "data: {dir: " << bs::test::small_brown_dataset() << ", seq_len: 128, sampler: local_presort}\n"
                      << "optimizer: {name: adamw, lr: 0.003, weight_decay: 0.01}\n"
                      << "schedule: {name: poly, warmup_fraction: 0.05}\n"
                      << "batch: {global: 32, micro: 32}\n"
                      << "clip: {mode: global_after_allreduce, max_norm: 1.0}\n"
                      << "distributed: {backend: none}\n"
                      << "target: {mlm_accuracy: 0.99, max_samples: 6400, eval_every_samples: 1600}\n"
                      << "threads: 2\nseed: 3\n"
                      << extra;
  return path;
}

// Flat JSON numbers of one event line: {"event":"eval","step":3,...}
std::map<std::string, std::string> fields(const std::string& line) {
  std::map<std::string, std::string> m;
  std::regex kv("\"([a-z_]+)\": (\"[^\"]*\"|[^,}]+)");
  for (auto it = std::sregex_iterator(line.begin(), line.end(), kv); it != std::sregex_iterator(); ++it)
    m[(*it)[1]] = (*it)[2];
  return m;
}

std::vector<std::map<std::string, std::string>> events_of(const std::string& text, const std::string& kind) {
  std::vector<std::map<std::string, std::string>> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    auto f = fields(line);
    if (f["event"] == "\"" + kind + "\"") out.push_back(f);
  }
  return out;
}

// Accuracy of always predicting the most common masked token of the eval set.
double frequency_baseline() {
  auto eval = bs::read_shard(bs::test::small_brown_dataset() + "/eval.hdf5");
  auto pos = eval.masked_lm_positions, ids = eval.masked_lm_ids;
  auto valid = pos.gt(0);
  auto labels = ids.masked_select(valid).to(torch::kLong);
  auto counts = torch::bincount(labels);
  return counts.max().item<double>() / static_cast<double>(labels.numel());
}

}  // namespace

TEST(TrainE2E, LearnsFromContextAndSpeaksTheProtocol) {
  auto dir = bs::test::make_temp_dir("train");
  auto mllog = dir + "/mllog.txt";
  // No dropout, lr 0.001 held near its peak (the schedule spans 3000 steps, the run 250): measured on this
  // data, bert-tiny leaves the unigram plateau at step ~100-150 with these settings for seeds 3, 4 and 5
  // (0.071 and 0.075 at 8000 samples for seeds 4 and 5), while a poly decay over the short run, or
  // lr >= 0.002, can keep it on the plateau for the whole run.
  auto r = run({bs::test::bertsweep_bin(), "train", "--config",
                tiny_config(dir), "--set", "log.mllog=" + mllog, "--set", "model.dropout=0.0", "--set",
                "optimizer.lr=0.001", "--set", "schedule.total_steps=3000", "--set", "schedule.warmup_fraction=0.01",
                "--set", "target.max_samples=8000", "--events", "stdout"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto evals = events_of(r.out, "eval");
  ASSERT_EQ(evals.size(), 5u) << r.out;
  const double first_loss = std::stod(evals.front()["loss"]), last_loss = std::stod(evals.back()["loss"]);
  const double acc = std::stod(evals.back()["mlm_accuracy"]);
  const double base = frequency_baseline();
  EXPECT_LT(last_loss, first_loss) << "eval loss must decrease";
  EXPECT_LT(last_loss, std::log(4000.0) - 1.0) << "eval loss must fall well below the untrained ln(vocab)";
  // No predictor that ignores the context beats always answering the most common token (top-1 accuracy of
  // any fixed distribution is at most the largest label frequency), so accuracy well above that baseline
  // is learning from context.
  EXPECT_GT(acc, 1.5 * base) << "final accuracy " << acc << " vs most-common-token baseline " << base;
  auto thr = events_of(r.out, "throughput");
  ASSERT_FALSE(thr.empty());
  EXPECT_GT(std::stod(thr.back()["tokens_per_s"]), 0);
  auto done = events_of(r.out, "done");
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]["reached"], "false");  // target 0.99 is out of reach: budget spent, not reached
  EXPECT_EQ(done[0]["samples"], "8000");
  std::ifstream in(mllog);
  std::string log((std::istreambuf_iterator<char>(in)), {});
  for (const char* key : {"\"run_start\"", "\"run_stop\"", "\"eval_accuracy\"", "\"global_batch_size\"",
                          "\"opt_base_learning_rate\"", "\"epoch_start\""})
    EXPECT_NE(log.find(key), std::string::npos) << key;
  EXPECT_NE(r.err.find("BLAS"), std::string::npos) << "the trainer must say which BLAS it runs on";
}

TEST(TrainE2E, ReachedTargetReportsSamplesToTarget) {
  auto dir = bs::test::make_temp_dir("train");
  auto r = run({bs::test::bertsweep_bin(), "train", "--config", tiny_config(dir), "--set", "target.mlm_accuracy=0.02",
                "--events", "stdout", "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto done = events_of(r.out, "done");
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]["reached"], "true");
  EXPECT_EQ(done[0]["samples_to_target"], "1600");  // first eval already beats 2%
  EXPECT_TRUE(r.err.empty()) << "--quiet prints nothing: " << r.err;
}

TEST(TrainE2E, SigtermThenResumeMatchesUninterruptedRun) {
  auto dir = bs::test::make_temp_dir("resume");
  // Dropout on: the RNG state must be restored too.
  auto full = run({bs::test::bertsweep_bin(), "train", "--config", tiny_config(dir), "--events", "stdout", "--quiet"});
  ASSERT_EQ(full.exit_code, 0) << full.err;
  auto ck = dir + "/ckpt";
  // Interrupted run: started as a child, SIGTERM after its first eval line appears in the events file.
  auto events = dir + "/events.jsonl";
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    execl(bs::test::bertsweep_bin().c_str(), "bertsweep", "train", "--config", tiny_config(dir).c_str(), "--set",
          ("checkpoint.dir=" + ck).c_str(), "--events", events.c_str(), "--quiet", (char*)nullptr);
    _exit(127);
  }
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    std::ifstream in(events);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    if (text.find("\"eval\"") != std::string::npos) break;
    ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(300)) << "no eval event";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), bs::exit_code::kTerminated);
  ASSERT_TRUE(fs::exists(ck + "/checkpoint.pt"));
  auto resumed = run({bs::test::bertsweep_bin(), "train", "--config", tiny_config(dir), "--set",
                      "checkpoint.dir=" + ck, "--resume", "--events", "stdout", "--quiet"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  auto a = events_of(full.out, "eval"), b = events_of(resumed.out, "eval");
  ASSERT_FALSE(b.empty());
  // Every eval of the resumed run equals the uninterrupted run's eval at the same step.
  for (const auto& e : b) {
    bool found = false;
    for (const auto& f : a)
      if (f.at("step") == e.at("step")) {
        found = true;
        EXPECT_NEAR(std::stod(e.at("mlm_accuracy")), std::stod(f.at("mlm_accuracy")), 1e-6) << "step " << e.at("step");
        EXPECT_NEAR(std::stod(e.at("loss")), std::stod(f.at("loss")), 1e-4) << "step " << e.at("step");
      }
    EXPECT_TRUE(found) << "step " << e.at("step");
  }
}

TEST(TrainE2E, NonFiniteLossStopsWithItsOwnExitCode) {
  auto dir = bs::test::make_temp_dir("nan");
  auto r = run({bs::test::bertsweep_bin(), "train", "--config", tiny_config(dir), "--set", "optimizer.name=sgd",
                "--set", "optimizer.lr=1e30", "--set", "clip.mode=none", "--set", "schedule.name=constant", "--quiet"});
  EXPECT_EQ(r.exit_code, bs::exit_code::kNonFinite) << r.err;
  EXPECT_NE(r.err.find("NaN"), std::string::npos) << r.err;
}

TEST(TrainE2E, ModelThatDoesNotFitTheDataIsRefusedBeforeTraining) {
  auto dir = bs::test::make_temp_dir("fit");
  auto r = run({bs::test::bertsweep_bin(), "train", "--config", tiny_config(dir), "--set", "model.vocab_size=100"});
  EXPECT_EQ(r.exit_code, bs::exit_code::kUsage);
  EXPECT_NE(r.err.find("vocab"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("step "), std::string::npos) << "must refuse before the first step: " << r.err;
  auto s = run({bs::test::bertsweep_bin(), "train", "--config", tiny_config(dir), "--set", "model.max_position=64"});
  EXPECT_EQ(s.exit_code, bs::exit_code::kUsage);
  EXPECT_NE(s.err.find("max_position"), std::string::npos) << s.err;
  auto t = run({bs::test::bertsweep_bin(), "train", "--config", tiny_config(dir), "--set", "data.dir=/nonexistent"});
  EXPECT_EQ(t.exit_code, bs::exit_code::kData);
  EXPECT_NE(t.err.find("/nonexistent"), std::string::npos) << t.err;
}
