// `bertsweep train` writes an MLLOG that follows MLCommons' training 5.0.0 rules for BERT
// (mlperf_logging/compliance_checker/training_5.0.0: common.yaml, open/closed_common.yaml, open/closed_bert.yaml)
// as implemented by check_mllog below: every required key exactly once, the interval pairs balanced and
// ordered, the metadata the rules ask, train_samples before run_stop, valid event types, time_ms never
// decreasing. Also: a run starting from a bertsweep checkpoint (model.init_checkpoint) in the closed division,
// and the closed division refused for a run the closed rules do not allow.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "TestUtil.h"
#include "common/Errors.h"
#include "trainer/InitCheckpoint.h"

namespace fs = std::filesystem;
using bs::test::run;

namespace {

struct Line {
  std::string key, event_type, value;
  int64_t time_ms = 0;
  YAML::Node metadata;
  bool value_null = false;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// The rules of training 5.0.0 for a BERT log of `division` ("open" | "closed"), run with `optimizer`.
// Returns every violation found (empty: the log follows them).
std::vector<std::string> check_mllog(const std::string& text, const std::string& division,
                                     const std::string& optimizer) {
  std::vector<std::string> bad;
  std::vector<Line> lines;
  std::istringstream in(text);
  int n = 0;
  for (std::string s; std::getline(in, s); ++n) {
    const std::string token = ":::MLLOG ";
    if (s.rfind(token, 0) != 0) {
      bad.push_back("line " + std::to_string(n) + " is not an MLLOG line: " + s);
      continue;
    }
    YAML::Node j;
    try {
      j = YAML::Load(s.substr(token.size()));
    } catch (const std::exception& e) {
      bad.push_back("line " + std::to_string(n) + " is not JSON: " + e.what());
      continue;
    }
    for (const char* f : {"namespace", "time_ms", "event_type", "key", "value", "metadata"})
      if (!j[f]) bad.push_back("line " + std::to_string(n) + " lacks '" + f + "'");
    if (!j["key"] || !j["metadata"] || !j["time_ms"] || !j["event_type"]) continue;
    Line l;
    l.key = j["key"].as<std::string>();
    l.event_type = j["event_type"].as<std::string>();
    l.time_ms = j["time_ms"].as<int64_t>();
    l.value_null = !j["value"] || j["value"].IsNull();
    l.value = j["value"] && j["value"].IsScalar() ? j["value"].Scalar() : "";
    l.metadata = j["metadata"];
    if (!l.metadata.IsMap() || !l.metadata["file"] || l.metadata["file"].Scalar().empty() || !l.metadata["lineno"] ||
        l.metadata["lineno"].as<int64_t>() <= 0)
      bad.push_back(l.key + ": metadata lacks file/lineno");
    lines.push_back(l);
  }
  std::map<std::string, int> count;
  for (const auto& l : lines) count[l.key]++;
  // clang-format off
  std::set<std::string> exactly_one = {"submission_benchmark", "submission_division", "submission_org",
                                       "submission_platform", "submission_status", "seed", "init_stop", "run_start",
                                       "run_stop", "train_samples", "eval_samples", "global_batch_size",
                                       "gradient_accumulation_steps", "max_sequence_length",
                                       "opt_base_learning_rate", "opt_learning_rate_training_steps",
                                       "opt_learning_rate_warmup_steps", "num_warmup_steps", "start_warmup_step"};
  // clang-format on
  const bool lamb = optimizer == "lamb" || optimizer == "nvlamb";
  const std::vector<std::string> lamb_keys = {"opt_lamb_beta_1", "opt_lamb_beta_2", "opt_lamb_epsilon",
                                              "opt_lamb_weight_decay_rate"};
  if (lamb) exactly_one.insert(lamb_keys.begin(), lamb_keys.end());
  if (optimizer == "adamw")
    for (const char* k : {"opt_adamw_beta_1", "opt_adamw_beta_2", "opt_adamw_epsilon", "opt_adamw_weight_decay"})
      exactly_one.insert(k);
  for (const auto& k : exactly_one)
    if (count[k] != 1) bad.push_back("'" + k + "' appears " + std::to_string(count[k]) + " times, not exactly once");
  if (!lamb)  // the LAMB names only for LAMB
    for (const auto& k : lamb_keys)
      if (count[k]) bad.push_back("'" + k + "' logged for optimizer " + optimizer);
  for (const char* k :
       {"cache_clear", "init_start", "eval_accuracy", "block_start", "block_stop", "eval_start", "eval_stop"})
    if (count[k] < 1) bad.push_back(std::string("'") + k + "' never appears");

  std::map<std::string, std::string> first_value;
  for (const auto& l : lines)
    if (!first_value.count(l.key)) first_value[l.key] = l.value;
  if (first_value["submission_benchmark"] != "bert") bad.push_back("submission_benchmark is not bert");
  if (first_value["submission_division"] != division) bad.push_back("submission_division is not " + division);
  if (first_value["submission_platform"].empty()) bad.push_back("submission_platform is empty");
  if (count["gradient_accumulation_steps"] && !(std::stod(first_value["gradient_accumulation_steps"]) > 0))
    bad.push_back("gradient_accumulation_steps must be > 0");

  int64_t last_ms = 0;
  bool init_started = false, init_stopped = false, run_started = false, run_stopped = false, in_block = false,
       in_eval = false, train_samples_seen = false;
  double max_accuracy = -1;
  std::string last_eval_epoch;
  for (const auto& l : lines) {
    const auto& md = l.metadata;
    if (l.time_ms < last_ms) bad.push_back(l.key + ": time_ms goes backwards");
    last_ms = l.time_ms;
    const bool is_start =
        l.key.size() > 6 && l.key.compare(l.key.size() - 6, 6, "_start") == 0 && l.key != "start_warmup_step";
    const bool is_stop = l.key.size() > 5 && l.key.compare(l.key.size() - 5, 5, "_stop") == 0;
    const std::string want = is_start ? "INTERVAL_START" : is_stop ? "INTERVAL_END" : "POINT_IN_TIME";
    if (l.event_type != want) bad.push_back(l.key + ": event_type " + l.event_type + ", not " + want);
    if (run_stopped) bad.push_back(l.key + " after run_stop");
    if (l.key == "init_start") {
      if (init_stopped || run_started) bad.push_back("init_start after init_stop/run_start");
      init_started = true;
    } else if (l.key == "init_stop") {
      if (!init_started || run_started) bad.push_back("init_stop without init_start, or after run_start");
      init_stopped = true;
    } else if (l.key == "run_start") {
      if (!init_stopped) bad.push_back("run_start before init_stop");
      run_started = true;
    } else if (l.key == "run_stop") {
      if (!run_started) bad.push_back("run_stop before run_start");
      if (!md["status"] || (md["status"].Scalar() != "success" && md["status"].Scalar() != "aborted"))
        bad.push_back("run_stop lacks status success|aborted");
      if (!train_samples_seen) bad.push_back("train_samples must come before run_stop");
      if (in_block) bad.push_back("a block_start is still open at run_stop");
      if (in_eval) bad.push_back("an eval_start is still open at run_stop");
      run_stopped = true;
    } else if (l.key == "train_samples") {
      train_samples_seen = true;
    } else if (l.key == "block_start") {
      if (!run_started) bad.push_back("block_start before run_start");
      if (in_block) bad.push_back("block_start inside a block");
      if (!md["epoch_count"] && !md["samples_count"]) bad.push_back("block_start lacks epoch_count/samples_count");
      if (md["epoch_count"] && (!md["first_epoch_num"] || md["epoch_count"].as<double>() <= 0))
        bad.push_back("block_start: epoch_count needs first_epoch_num and must be > 0");
      if (md["samples_count"] && md["samples_count"].as<double>() < 0) bad.push_back("block_start: samples_count < 0");
      in_block = true;
    } else if (l.key == "block_stop") {
      if (!in_block) bad.push_back("block_stop without block_start");
      if (!md["first_epoch_num"] && !md["samples_count"])
        bad.push_back("block_stop lacks first_epoch_num/samples_count");
      in_block = false;
    } else if (l.key == "eval_start" || l.key == "eval_stop") {
      if (!md["epoch_num"] && !md["samples_count"]) bad.push_back(l.key + " lacks epoch_num/samples_count");
      if ((l.key == "eval_start") == in_eval) bad.push_back(l.key + " out of order");
      if (!run_started) bad.push_back(l.key + " before run_start");
      in_eval = l.key == "eval_start";
      if (md["epoch_num"]) last_eval_epoch = md["epoch_num"].Scalar();
    } else if (l.key == "eval_accuracy") {
      if (!md["epoch_num"]) bad.push_back("eval_accuracy lacks epoch_num (open/closed_bert.yaml)");
      // After its eval (the reference logs it after eval_stop), with the same epoch_num.
      if (last_eval_epoch.empty() || md["epoch_num"].Scalar() != last_eval_epoch)
        bad.push_back("eval_accuracy without an eval_start/eval_stop at the same epoch_num");
      const double a = l.value_null ? -1 : std::stod(l.value);
      if (!(a >= 0 && a < 1.0)) bad.push_back("eval_accuracy " + l.value + " not in [0, 1)");
      max_accuracy = std::max(max_accuracy, a);
    }
  }
  if (init_started && !init_stopped) bad.push_back("init_start without init_stop");
  if (run_started && !run_stopped) bad.push_back("run_start without run_stop");
  (void)max_accuracy;  // closed_bert's ">= 0.720" needs a run that reaches it: the trainer refuses a lower target
  return bad;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += "  " + x + "\n";
  return s;
}

std::string base_config(const std::string& dir) {
  std::string path = dir + "/train.yaml";
  std::ofstream(path) << "extends: " << bs::test::source_dir() << "/configs/train/bert-tiny-brown.yaml\n";
  return path;
}

std::vector<std::string> train_args(const std::string& dir, const std::string& mllog) {
  // clang-format off
  return {bs::test::bertsweep_bin(), "train", "--config", base_config(dir), "--set",
          "data.dir=" + bs::test::small_brown_dataset(), "--set", "log.mllog=" + mllog, "--set",
          "target.max_samples=800", "--set", "target.eval_every_samples=320", "--set", "batch.global=32", "--set",
          "batch.micro=16", "--set", "data.eval_samples=256", "--set", "threads=2", "--set",
          "distributed.backend=none", "--set", "precision=fp32", "--quiet"};
  // clang-format on
}

}  // namespace

TEST(MlLogE2E, OpenDivisionLogFollowsTheTraining500Rules) {
  const auto dir = bs::test::make_temp_dir("mllog");
  const auto mllog = dir + "/mllog.txt";
  auto args = train_args(dir, mllog);
  for (const char* s : {"optimizer.name=adamw", "checkpoint.dir=CKPT"}) {
    args.push_back("--set");
    args.push_back(std::string(s) == "checkpoint.dir=CKPT" ? "checkpoint.dir=" + dir + "/ckpt" : s);
  }
  args.push_back("--dump-params");
  args.push_back(dir + "/params.bin");
  auto r = run(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string log = slurp(mllog);
  auto bad = check_mllog(log, "open", "adamw");
  EXPECT_TRUE(bad.empty()) << "MLLOG breaks the rules:\n" << join(bad) << log;
  // 800 samples in blocks of 320: evals at 320, 640 and 800 (budget end), no block after the last one.
  int evals = 0, blocks = 0;
  std::istringstream in(log);
  for (std::string s; std::getline(in, s);) {
    evals += s.find("\"key\": \"eval_accuracy\"") != std::string::npos;
    blocks += s.find("\"key\": \"block_start\"") != std::string::npos;
  }
  EXPECT_EQ(evals, 3) << log;
  EXPECT_EQ(blocks, 3) << log;
  EXPECT_NE(log.find("\"key\": \"submission_org\", \"value\": \"bertsweep\""), std::string::npos) << log;
  EXPECT_NE(log.find("\"key\": \"submission_status\", \"value\": \"research\""), std::string::npos) << log;
  EXPECT_NE(log.find("\"file\": \"trainer/Trainer.cpp\""), std::string::npos) << log;

  // The checker above can fail: the same log with train_samples dropped, or moved after run_stop, is refused.
  std::string dropped, moved, ts_line;
  std::istringstream in2(log);
  for (std::string s; std::getline(in2, s);) {
    if (s.find("\"key\": \"train_samples\"") != std::string::npos) {
      ts_line = s;
      continue;
    }
    dropped += s + "\n";
  }
  moved = dropped + ts_line + "\n";
  EXPECT_FALSE(check_mllog(dropped, "open", "adamw").empty());
  EXPECT_FALSE(check_mllog(moved, "open", "adamw").empty());

  // The run's final checkpoint holds the weights it ended with: read back as an init checkpoint.
  std::string ckpt;
  for (const auto& e : fs::directory_iterator(dir + "/ckpt"))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) ckpt = e.path().string();
  ASSERT_FALSE(ckpt.empty());
  auto weights = bs::read_init_checkpoint(ckpt);
  std::ifstream pin(dir + "/params.bin", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(pin)), {});
  size_t total = 0;
  for (const auto& kv : weights) total += kv.second.numel();
  EXPECT_EQ(total * sizeof(float), bytes.size());
  EXPECT_TRUE(weights.count("encoder.0.attention.qkv.weight"));

  // A closed-division LAMB run that starts from that checkpoint: the closed rules' keys, all once.
  const auto mllog2 = dir + "/mllog-closed.txt";
  auto args2 = train_args(dir, mllog2);
  for (const std::string& s : std::vector<std::string>{
           "optimizer.name=lamb", "optimizer.lr=1e-12", "target.mlm_accuracy=0.72", "log.submission_division=closed",
           "log.submission_platform=test box", "model.init_checkpoint=" + ckpt}) {
    args2.push_back("--set");
    args2.push_back(s);
  }
  args2.push_back("--dump-params");
  args2.push_back(dir + "/params-closed.bin");
  auto r2 = run(args2);
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  const std::string log2 = slurp(mllog2);
  bad = check_mllog(log2, "closed", "lamb");
  EXPECT_TRUE(bad.empty()) << "closed MLLOG breaks the rules:\n" << join(bad) << log2;
  EXPECT_NE(log2.find("\"key\": \"submission_platform\", \"value\": \"test box\""), std::string::npos);
  EXPECT_NE(log2.find("\"key\": \"init_checkpoint_step\""), std::string::npos);
  // The CLI run really started from the checkpoint: with a vanishing learning rate its final weights are
  // the checkpoint's (the first run's final weights).
  std::ifstream p2(dir + "/params-closed.bin", std::ios::binary);
  std::string bytes2((std::istreambuf_iterator<char>(p2)), {});
  ASSERT_EQ(bytes2.size(), bytes.size());
  std::vector<float> a(bytes.size() / 4), b(bytes.size() / 4);
  std::memcpy(a.data(), bytes.data(), bytes.size());
  std::memcpy(b.data(), bytes2.data(), bytes2.size());
  double max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) max_diff = std::max(max_diff, double(std::abs(a[i] - b[i])));
  EXPECT_LT(max_diff, 1e-5) << "the run did not start from model.init_checkpoint";
}

TEST(MlLogE2E, ClosedDivisionIsRefusedForARunTheClosedRulesDoNotAllow) {
  const auto dir = bs::test::make_temp_dir("mllog-closed");
  for (const auto& [extra, needle] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"optimizer.name=adamw", "target.mlm_accuracy=0.72", "model.init_checkpoint=x.pt"}, "LAMB"},
           {{"optimizer.name=lamb", "target.mlm_accuracy=0.5", "model.init_checkpoint=x.pt"}, "0.720"},
           {{"optimizer.name=lamb", "target.mlm_accuracy=0.72"}, "model.init_checkpoint"}}) {
    std::vector<std::string> args = {bs::test::bertsweep_bin(), "train", "--config",
                                     base_config(dir),          "--set", "log.submission_division=closed",
                                     "--print-config"};
    for (const auto& e : extra) {
      args.push_back("--set");
      args.push_back(e);
    }
    auto r = run(args, 60);
    EXPECT_EQ(r.exit_code, bs::exit_code::kUsage) << needle << ": " << r.err;
    EXPECT_NE(r.err.find("log.submission_division"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  }
  auto r = run({bs::test::bertsweep_bin(), "train", "--config", base_config(dir), "--set",
                "log.submission_status=shipping", "--print-config"},
               60);
  EXPECT_EQ(r.exit_code, bs::exit_code::kUsage);
  EXPECT_NE(r.err.find("log.submission_status"), std::string::npos) << r.err;
}
