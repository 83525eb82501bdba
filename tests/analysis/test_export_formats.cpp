// Production exports through the real CLI on a real SQLite study: the same trial exported as yaml,
// mlperf-json and nvidia-config holds the same values in all three (read back by yaml-cpp, Python's json
// module and bash's `source`); --nodes/--gpus-per-node that do not divide the batch are exit 2; --scale-lr;
// numbers in their shortest exact form.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "StudyFixture.h"
#include "TestUtil.h"
#include "common/TrainConfig.h"
#include "studies/ConfigExport.h"
#include "studies/StudyStore.h"

using namespace bs;
namespace fs = std::filesystem;

namespace {

const char* kStudy = "prod";

// A study with one COMPLETE trial whose values are not round in binary (0.0017, 0.83, ...).
TrainConfig trial_config() {
  TrainConfig c;
  c.optimizer.name = "lamb";
  c.optimizer.lr = 0.0017;
  c.optimizer.beta1 = 0.83;
  c.optimizer.beta2 = 0.9975;
  c.optimizer.eps = 1e-4;
  c.optimizer.weight_decay = 0.0123;
  c.batch.global = 4096;
  c.batch.micro = 64;
  c.target.max_samples = 1000000;
  c.schedule.warmup_steps = -1;
  c.schedule.warmup_fraction = 0.07;
  c.schedule.start_warmup_step = 5;
  c.model.layers = 24;
  c.model.hidden = 1024;
  c.model.heads = 16;
  c.model.intermediate = 4096;
  c.precision = "bf16";
  c.seed = 1234;
  return c;
}

std::string make_study() {
  const std::string dir = test::make_temp_dir("export-formats");
  fs::create_directories(dir + "/" + kStudy);
  StudyStore store(dir + "/" + kStudy + "/study.db");
  TrialRecord t;
  t.number = 3;
  t.state = trial_state::kComplete;
  t.config_yaml = trial_config().to_yaml_string();
  t.reached = true;
  t.samples_to_target = 24576;
  t.values = {24576};
  store.insert_trial(t);
  return dir;
}

test::RunResult bs_export(const std::string& dir, const std::string& format, const std::string& out,
                          std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {
      test::bertsweep_bin(), "study", "export", kStudy, "--trial", "3", "--format", format, "--out", out, "--dir", dir};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return test::run(argv, 120);
}

// "name=value" lines into a map.
std::map<std::string, std::string> key_values(const std::string& text) {
  std::map<std::string, std::string> m;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return m;
}

double num(const std::map<std::string, std::string>& m, const std::string& k) {
  auto it = m.find(k);
  if (it == m.end() || it->second.empty()) throw std::runtime_error("no value for " + k);
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (*end != '\0') throw std::runtime_error(k + " is not a number: '" + it->second + "'");
  return v;
}

// The values every format must agree on, in one vocabulary.
struct Values {
  double lr, beta1, beta2, weight_decay, seed, steps, warmup, start_warmup, accumulation, device_batch, global_batch;
};

Values from_yaml(const std::string& path, const ProductionLayout& layout) {
  const TrainConfig c = TrainConfig::from_yaml(YAML::LoadFile(path), path);
  const int64_t local = c.batch.global / layout.devices();
  return {c.optimizer.lr,
          c.optimizer.beta1,
          c.optimizer.beta2,
          c.optimizer.weight_decay,
          static_cast<double>(c.seed),
          static_cast<double>(resolved_total_steps(c)),
          static_cast<double>(resolved_warmup_steps(c)),
          static_cast<double>(c.schedule.start_warmup_step),
          static_cast<double>((local + c.batch.micro - 1) / c.batch.micro),
          static_cast<double>(local),
          static_cast<double>(c.batch.global)};
}

Values from_json(const std::string& path) {
  // Python's json module reads the file; repr() of a float is its shortest round-trip text.
  auto r = test::run({"/usr/bin/python3", "-c",
                      "import json,sys\n"
                      "d=json.load(open(sys.argv[1]))\n"
                      "for k in ['opt_base_learning_rate','opt_lamb_beta_1','opt_lamb_beta_2',"
                      "'opt_lamb_weight_decay_rate','seed','opt_learning_rate_training_steps',"
                      "'opt_learning_rate_warmup_steps','start_warmup_step','gradient_accumulation_steps',"
                      "'per_device_batch_size','global_batch_size']:\n"
                      "    print(k + '=' + repr(d[k]))\n",
                      path});
  if (r.exit_code != 0) throw std::runtime_error("python3 could not read " + path + ": " + r.err);
  auto m = key_values(r.out);
  return {num(m, "opt_base_learning_rate"),
          num(m, "opt_lamb_beta_1"),
          num(m, "opt_lamb_beta_2"),
          num(m, "opt_lamb_weight_decay_rate"),
          num(m, "seed"),
          num(m, "opt_learning_rate_training_steps"),
          num(m, "opt_learning_rate_warmup_steps"),
          num(m, "start_warmup_step"),
          num(m, "gradient_accumulation_steps"),
          num(m, "per_device_batch_size"),
          num(m, "global_batch_size")};
}

std::map<std::string, std::string> sourced(const std::string& path, const std::vector<std::string>& names) {
  // A clean environment: every value must come from the file.
  std::string script = "set -eu; source \"$1\"";
  for (const auto& n : names) script += "; echo " + n + "=\"$" + n + "\"";
  auto r = test::run({"/usr/bin/env", "-i", "/bin/bash", "-c", script, "bash", path});
  if (r.exit_code != 0) throw std::runtime_error("bash could not source " + path + ": " + r.err);
  return key_values(r.out);
}

Values from_shell(const std::string& path, const ProductionLayout& layout) {
  auto m = sourced(path, {"LR", "OPT_LAMB_BETA_1", "OPT_LAMB_BETA_2", "WEIGHT_DECAY_RATE", "SEED", "MAX_STEPS",
                          "WARMUP_STEPS", "START_WARMUP_STEP", "GRADIENT_STEPS", "BATCHSIZE", "DGXNNODES", "DGXNGPU"});
  EXPECT_EQ(num(m, "DGXNNODES"), layout.nodes);
  EXPECT_EQ(num(m, "DGXNGPU"), layout.gpus_per_node);
  // NVIDIA's global batch: BATCHSIZE per GPU times the GPUs.
  return {num(m, "LR"),
          num(m, "OPT_LAMB_BETA_1"),
          num(m, "OPT_LAMB_BETA_2"),
          num(m, "WEIGHT_DECAY_RATE"),
          num(m, "SEED"),
          num(m, "MAX_STEPS"),
          num(m, "WARMUP_STEPS"),
          num(m, "START_WARMUP_STEP"),
          num(m, "GRADIENT_STEPS"),
          num(m, "BATCHSIZE"),
          num(m, "BATCHSIZE") * num(m, "DGXNNODES") * num(m, "DGXNGPU")};
}

void expect_same(const Values& a, const Values& b, const std::string& what) {
  EXPECT_EQ(a.lr, b.lr) << what;  // bit-exact: shortest text reads back as the same double
  EXPECT_EQ(a.beta1, b.beta1) << what;
  EXPECT_EQ(a.beta2, b.beta2) << what;
  EXPECT_EQ(a.weight_decay, b.weight_decay) << what;
  EXPECT_EQ(a.seed, b.seed) << what;
  EXPECT_EQ(a.steps, b.steps) << what;
  EXPECT_EQ(a.warmup, b.warmup) << what;
  EXPECT_EQ(a.start_warmup, b.start_warmup) << what;
  EXPECT_EQ(a.accumulation, b.accumulation) << what;
  EXPECT_EQ(a.device_batch, b.device_batch) << what;
  EXPECT_EQ(a.global_batch, b.global_batch) << what;
}

// Exports trial 3 in all three formats with `extra` options and checks they agree; returns the YAML values.
Values round_trip(const std::string& dir, const ProductionLayout& layout, std::vector<std::string> extra) {
  const std::string out = test::make_temp_dir("export-formats-out");
  std::vector<std::string> with_layout = extra;
  with_layout.insert(with_layout.end(), {"--nodes", std::to_string(layout.nodes), "--gpus-per-node",
                                         std::to_string(layout.gpus_per_node)});
  auto y = bs_export(dir, "yaml", out + "/best.yaml", extra);
  EXPECT_EQ(y.exit_code, 0) << y.err;
  auto j = bs_export(dir, "mlperf-json", out + "/best.json", with_layout);
  EXPECT_EQ(j.exit_code, 0) << j.err;
  auto s = bs_export(dir, "nvidia-config", out + "/config_prod.sh", with_layout);
  EXPECT_EQ(s.exit_code, 0) << s.err;
  const Values yv = from_yaml(out + "/best.yaml", layout);
  expect_same(yv, from_json(out + "/best.json"), "mlperf-json vs yaml");
  expect_same(yv, from_shell(out + "/config_prod.sh", layout), "nvidia-config vs yaml");
  return yv;
}

}  // namespace

TEST(ExportFormats, NvidiaConfigAndMlperfJsonHoldTheYamlValues) {
  const std::string dir = make_study();
  const TrainConfig c = trial_config();
  const Values v = round_trip(dir, {2, 8}, {});
  // And those are the trial's own values (4096 / 16 devices = 256 per GPU, ceil(256 / 64) = 4 micro-steps).
  EXPECT_EQ(v.lr, c.optimizer.lr);
  EXPECT_EQ(v.seed, 1234);
  EXPECT_EQ(v.device_batch, 256);
  EXPECT_EQ(v.accumulation, 4);
  EXPECT_EQ(v.steps, (1000000 + 4095) / 4096);
  EXPECT_EQ(v.warmup, std::llround(0.07 * ((1000000 + 4095) / 4096)));
  // One node, one GPU: the whole batch on the device, 64 micro-steps.
  const Values one = round_trip(dir, {1, 1}, {});
  EXPECT_EQ(one.device_batch, 4096);
  EXPECT_EQ(one.accumulation, 64);
}

TEST(ExportFormats, MlperfSettingsModelShapeAndPrecision) {
  const std::string dir = make_study();
  const std::string out = test::make_temp_dir("export-formats-mlperf");
  auto j = bs_export(dir, "mlperf-json", out + "/h.json", {"--set", "model.layers=12"});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  auto r = test::run({"/usr/bin/python3", "-c",
                      "import json,sys\nd=json.load(open(sys.argv[1]))\nb=d['bert_config']\n"
                      "print('layers=%d' % b['num_hidden_layers'])\nprint('hidden=%d' % b['hidden_size'])\n"
                      "print('heads=%d' % b['num_attention_heads'])\nprint('inter=%d' % b['intermediate_size'])\n"
                      "print('target=' + repr(d['target_mlm_accuracy']))\nprint('eval=%d' % d['eval_samples'])\n"
                      "print('interval=%d' % d['eval_interval_samples'])\nprint('precision=' + d['precision'])\n",
                      out + "/h.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto m = key_values(r.out);
  EXPECT_EQ(m["layers"], "12");  // --set model.layers reaches the JSON
  EXPECT_EQ(m["hidden"], "1024");
  EXPECT_EQ(m["heads"], "16");
  EXPECT_EQ(m["inter"], "4096");
  EXPECT_EQ(m["target"], "0.72");
  EXPECT_EQ(m["eval"], "10000");
  // floor(0.05 * (230.23 * 4096 + 3e6) = 197151.1, 25000) = 175000
  EXPECT_EQ(m["interval"], "175000");
  EXPECT_EQ(m["precision"], "bf16");

  auto s = bs_export(dir, "nvidia-config", out + "/c.sh");
  ASSERT_EQ(s.exit_code, 0) << s.err;
  auto sh = sourced(out + "/c.sh",
                    {"EVAL_ITER_START_SAMPLES", "EVAL_ITER_SAMPLES", "TARGET_MLM_ACCURACY", "NUM_EVAL_EXAMPLES"});
  EXPECT_EQ(sh["EVAL_ITER_START_SAMPLES"], "175000");
  EXPECT_EQ(sh["EVAL_ITER_SAMPLES"], "175000");
  EXPECT_EQ(sh["TARGET_MLM_ACCURACY"], "0.72");
  EXPECT_EQ(sh["NUM_EVAL_EXAMPLES"], "10000");
}

TEST(ExportFormats, LayoutThatDoesNotDivideTheBatchIsExit2AndWritesNothing) {
  const std::string dir = make_study();
  const std::string out = test::make_temp_dir("export-formats-bad");
  for (const std::string format : {"mlperf-json", "nvidia-config"}) {
    auto r = bs_export(dir, format, out + "/x", {"--nodes", "3", "--gpus-per-node", "8"});
    EXPECT_EQ(r.exit_code, 2) << format << ": " << r.err;
    EXPECT_NE(r.err.find("4096"), std::string::npos) << r.err;  // both numbers named
    EXPECT_NE(r.err.find("24"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out + "/x")) << format;
  }
  auto r = bs_export(dir, "nvidia-config", out + "/x", {"--nodes", "0"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  // A batch the layout divides is fine: 4096 = 4 x 1024.
  EXPECT_EQ(bs_export(dir, "nvidia-config", out + "/y", {"--nodes", "4", "--gpus-per-node", "4"}).exit_code, 0);
}

TEST(ExportFormats, ScaleLrLinearAndSqrtToTheProductionBatch) {
  const std::string dir = make_study();
  const double lr = trial_config().optimizer.lr;
  const Values lin = round_trip(dir, {4, 8}, {"--set", "batch.global=16384", "--scale-lr", "linear"});
  EXPECT_EQ(lin.global_batch, 16384);
  EXPECT_EQ(lin.lr, lr * 4.0);
  const Values sq = round_trip(dir, {4, 8}, {"--set", "batch.global=16384", "--scale-lr", "sqrt"});
  EXPECT_EQ(sq.lr, lr * std::sqrt(4.0));
  const Values none = round_trip(dir, {4, 8}, {"--set", "batch.global=16384"});
  EXPECT_EQ(none.lr, lr);
  const std::string out = test::make_temp_dir("export-formats-scale");
  auto bad = bs_export(dir, "yaml", out + "/z.yaml", {"--scale-lr", "cubic"});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  auto both = bs_export(dir, "yaml", out + "/z.yaml", {"--scale-lr", "linear", "--set", "optimizer.lr=0.1"});
  EXPECT_EQ(both.exit_code, 2) << both.err;
}

TEST(ExportFormats, NumbersAreWrittenInShortestExactForm) {
  const std::string dir = make_study();
  const std::string out = test::make_temp_dir("export-formats-short");
  ASSERT_EQ(bs_export(dir, "yaml", out + "/a.yaml").exit_code, 0);
  ASSERT_EQ(bs_export(dir, "mlperf-json", out + "/a.json").exit_code, 0);
  ASSERT_EQ(bs_export(dir, "nvidia-config", out + "/a.sh").exit_code, 0);
  std::ifstream yf(out + "/a.yaml"), jf(out + "/a.json"), sf(out + "/a.sh");
  std::stringstream y, j, s;
  y << yf.rdbuf();
  j << jf.rdbuf();
  s << sf.rdbuf();
  EXPECT_NE(y.str().find("lr: 0.0017\n"), std::string::npos) << y.str();
  EXPECT_NE(y.str().find("beta1: 0.83\n"), std::string::npos) << y.str();
  EXPECT_NE(y.str().find("eps: 0.0001\n"), std::string::npos) << y.str();
  EXPECT_NE(j.str().find("\"opt_base_learning_rate\": 0.0017,"), std::string::npos) << j.str();
  EXPECT_NE(j.str().find("\"opt_lamb_beta_1\": 0.83,"), std::string::npos) << j.str();
  EXPECT_NE(j.str().find("\"opt_epsilon\": 0.0001,"), std::string::npos) << j.str();
  EXPECT_NE(s.str().find("export LR=0.0017\n"), std::string::npos) << s.str();
  EXPECT_NE(s.str().find("export OPT_LAMB_BETA_2=0.9975\n"), std::string::npos) << s.str();
  // No 17-digit spelling anywhere.
  for (const std::string& text : {y.str(), j.str(), s.str()})
    EXPECT_EQ(text.find("0000000000"), std::string::npos) << text;
}
