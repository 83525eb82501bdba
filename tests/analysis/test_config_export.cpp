// Exported configs: YAML byte-exact (or --set applied and everything else unchanged), MLPerf JSON values.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <cstdio>
#include <random>
#include <regex>

#include "StudyFixture.h"
#include "TestUtil.h"
#include "common/TrainConfig.h"
#include "studies/ConfigExport.h"

using namespace bs;

namespace {

TrialRecord trial_with(const TrainConfig& c) {
  TrialRecord t;
  t.number = 12;
  t.state = trial_state::kComplete;
  t.config_yaml = c.to_yaml_string();
  t.reached = true;
  t.samples_to_target = 24576;
  t.values = {24576};
  return t;
}

bool has_key(const std::string& json, const std::string& key) {
  return json.find("\"" + key + "\":") != std::string::npos;
}

}  // namespace

TEST(ConfigExport, YamlIsTheStoredConfigWithShortestNumbers) {
  TrainConfig c;
  c.optimizer.lr = 0.0012345678901234567;
  c.optimizer.beta1 = 0.83;  // stored as 0.82999999999999996
  c.optimizer.beta2 = 0.999;
  c.optimizer.eps = 1e-4;
  c.schedule.warmup_fraction = 0.07;  // stored as 0.070000000000000007
  TrialRecord t = trial_with(c);
  ASSERT_NE(t.config_yaml.find("beta1: 0.82999999999999996\n"), std::string::npos) << t.config_yaml;
  t.config_yaml = "# stored as the controller wrote it\n" + t.config_yaml;  // comments, order kept
  const std::string out = export_yaml(t);
  EXPECT_EQ(out.rfind("# stored as the controller wrote it\n", 0), 0u) << out;
  EXPECT_NE(out.find("beta1: 0.83\n"), std::string::npos) << out;
  EXPECT_NE(out.find("beta2: 0.999\n"), std::string::npos) << out;
  EXPECT_NE(out.find("warmup_fraction: 0.07\n"), std::string::npos) << out;
  EXPECT_NE(out.find("eps: 0.0001\n"), std::string::npos) << out;
  // Only number spellings change: the values read back bit-identical.
  const TrainConfig back = TrainConfig::from_yaml(YAML::Load(out), "exported");
  EXPECT_EQ(back.to_yaml_string(), c.to_yaml_string());
  EXPECT_EQ(back.optimizer.lr, c.optimizer.lr);
  // The same number of lines, and every line without a number unchanged.
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), std::count(t.config_yaml.begin(), t.config_yaml.end(), '\n'));
}

TEST(ConfigExport, ShortestNumberRoundTrips) {
  EXPECT_EQ(shortest_number(0.1), "0.1");
  EXPECT_EQ(shortest_number(1e-4), "0.0001");
  EXPECT_EQ(std::strtod(shortest_number(1e-4).c_str(), nullptr), 1e-4);
  EXPECT_EQ(shortest_number(0.999), "0.999");
  EXPECT_EQ(shortest_number(3.0), "3");
  EXPECT_EQ(shortest_number(4096), "4096");
  EXPECT_EQ(shortest_number(1e-7), "1e-07");
  EXPECT_EQ(shortest_number(0.72), "0.72");
  EXPECT_EQ(shortest_number(std::nan("")), "null");
  EXPECT_EQ(shortest_number(1.0 / 3.0), "0.3333333333333333");  // 16 digits suffice here
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-30, 30);
  for (int i = 0; i < 2000; ++i) {
    const double v = std::pow(10.0, u(rng)) * (i % 2 ? 1 : -1);
    const std::string s = shortest_number(v);
    ASSERT_EQ(std::strtod(s.c_str(), nullptr), v) << s;
    // And no shorter spelling reads back: one significant digit fewer gives another double.
    int digits = 0;
    bool leading = true;
    for (char ch : s.substr(0, s.find_first_of("eE"))) {
      if (!std::isdigit(static_cast<unsigned char>(ch)) || (leading && ch == '0')) continue;
      leading = false;
      ++digits;
    }
    if (digits > 1) {
      char buf[400];  // %g of any double fits
      std::snprintf(buf, sizeof buf, "%.*g", digits - 1, v);
      EXPECT_NE(std::strtod(buf, nullptr), v) << s << " vs " << buf;
    }
  }
  // A string that only looks like a number (few digits) is left as written.
  EXPECT_EQ(shorten_yaml_numbers("dir: 1.50\nlr: 0.0016999999999999999\n"), "dir: 1.50\nlr: 0.0017\n");
}

TEST(ConfigExport, LayoutAccumulationEvalIntervalAndLrScaling) {
  TrainConfig c;
  c.batch.global = 4096;
  c.batch.micro = 48;
  EXPECT_EQ(per_device_batch(4096, {2, 8}), 256);
  EXPECT_EQ(gradient_accumulation_steps(c, {2, 8}), 6);  // ceil(256 / 48)
  EXPECT_EQ(nvidia_gradient_steps(c, {2, 8}), 8);        // NVIDIA needs a divisor of 256: 8 (micro 32)
  c.batch.micro = 64;
  EXPECT_EQ(gradient_accumulation_steps(c, {2, 8}), 4);
  EXPECT_EQ(nvidia_gradient_steps(c, {2, 8}), 4);
  try {
    per_device_batch(4096, {3, 8});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("4096"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("24 devices"), std::string::npos) << e.what();
  }
  // floor(0.05 * (230.23 * GBS + 3e6), 25000): 4096 -> 197151.1 -> 175000; 8192 -> 244302.2 -> 225000;
  // 448 -> 155157.2 -> 150000 (NVIDIA's configs for that size use 150000).
  EXPECT_EQ(mlperf_bert_eval_interval_samples(4096), 175000);
  EXPECT_EQ(mlperf_bert_eval_interval_samples(8192), 225000);
  EXPECT_EQ(mlperf_bert_eval_interval_samples(448), 150000);
  EXPECT_EQ(scaled_learning_rate(1e-3, 256, 4096, "linear"), 1e-3 * 16);
  EXPECT_EQ(scaled_learning_rate(1e-3, 256, 4096, "sqrt"), 1e-3 * 4);
  EXPECT_EQ(scaled_learning_rate(1e-3, 256, 4096, "none"), 1e-3);
  EXPECT_THROW(scaled_learning_rate(1e-3, 256, 4096, "cubic"), ConfigError);
}

TEST(ConfigExport, SetOverridesOnlyTheNamedKeysAndKeepsExactDoubles) {
  TrainConfig c;
  c.optimizer.name = "lamb";
  c.optimizer.lr = 0.0012345678901234567;
  c.optimizer.beta2 = 0.99912345678901;
  c.schedule.warmup_fraction = 0.0123456789;
  c.seed = 42;
  TrialRecord t = trial_with(c);
  const std::string out = export_yaml(t, {"data.dir=/prod/data", "batch.micro=8"});
  TrainConfig back = TrainConfig::from_yaml(YAML::Load(out), "exported");
  EXPECT_EQ(back.data.dir, "/prod/data");
  EXPECT_EQ(back.batch.micro, 8);
  // Every other key unchanged: compare the canonical YAML of both with the two keys put back.
  back.data.dir = c.data.dir;
  back.batch.micro = c.batch.micro;
  EXPECT_EQ(back.to_yaml_string(), c.to_yaml_string());
  EXPECT_EQ(back.optimizer.lr, c.optimizer.lr);  // bit-exact
  EXPECT_EQ(back.optimizer.beta2, c.optimizer.beta2);
  EXPECT_THROW(export_yaml(t, {"optimizer.nme=lamb"}), ConfigError);
}

TEST(ConfigExport, MlperfJsonCarriesTheHyperparameters) {
  TrainConfig c;
  c.optimizer.name = "lamb";
  c.optimizer.lr = 0.0017;
  c.optimizer.beta1 = 0.83;
  c.optimizer.beta2 = 0.9975;
  c.optimizer.eps = 1e-7;
  c.optimizer.weight_decay = 0.0123;
  c.batch.global = 4096;
  c.target.max_samples = 1000000;
  c.schedule.warmup_steps = -1;
  c.schedule.warmup_fraction = 0.07;
  c.schedule.power = 0.5;
  c.schedule.start_warmup_step = -25;
  c.seed = 9;
  const std::string j = export_mlperf_json(c, trial_with(c), "s1");
  EXPECT_EQ(bs::test::json_number(j, "global_batch_size"), 4096);
  EXPECT_EQ(bs::test::json_number(j, "opt_base_learning_rate"), 0.0017);
  EXPECT_EQ(bs::test::json_number(j, "opt_lamb_beta_1"), 0.83);
  EXPECT_EQ(bs::test::json_number(j, "opt_lamb_beta_2"), 0.9975);
  EXPECT_EQ(bs::test::json_number(j, "opt_epsilon"), 1e-7);
  EXPECT_EQ(bs::test::json_number(j, "opt_lamb_weight_decay_rate"), 0.0123);
  EXPECT_EQ(bs::test::json_number(j, "opt_lamb_learning_rate_decay_poly_power"), 0.5);
  EXPECT_EQ(bs::test::json_number(j, "start_warmup_step"), -25);
  const int64_t total = (1000000 + 4095) / 4096;  // the trainer runs ceil(max_samples / batch) steps
  EXPECT_EQ(bs::test::json_number(j, "opt_learning_rate_training_steps"), total);
  EXPECT_EQ(bs::test::json_number(j, "opt_learning_rate_warmup_steps"), std::llround(0.07 * total));
  EXPECT_EQ(bs::test::json_number(j, "num_warmup_steps"), std::llround(0.07 * total));
  EXPECT_EQ(bs::test::json_number(j, "max_samples"), 1000000);
  EXPECT_EQ(bs::test::json_number(j, "seed"), 9);
  EXPECT_EQ(bs::test::json_number(j, "trial"), 12);
  EXPECT_EQ(bs::test::json_number(j, "gradient_accumulation_steps"), 128);  // 4096 / micro 32, one device
  EXPECT_EQ(bs::test::json_number(j, "per_device_batch_size"), 4096);
  EXPECT_EQ(bs::test::json_number(j, "target_mlm_accuracy"), 0.72);
  EXPECT_EQ(bs::test::json_number(j, "eval_samples"), 10000);
  EXPECT_EQ(bs::test::json_number(j, "eval_interval_samples"), 175000);
  EXPECT_EQ(bs::test::json_number(j, "num_hidden_layers"), c.model.layers);
  EXPECT_EQ(bs::test::json_number(j, "hidden_size"), c.model.hidden);
  EXPECT_NE(j.find("\"precision\": \"auto\""), std::string::npos) << j;
  const std::string laid = export_mlperf_json(c, trial_with(c), "s1", {2, 4});
  EXPECT_EQ(bs::test::json_number(laid, "per_device_batch_size"), 512);
  EXPECT_EQ(bs::test::json_number(laid, "gradient_accumulation_steps"), 16);
  EXPECT_THROW(export_mlperf_json(c, trial_with(c), "s1", {3, 1}), ConfigError);
  EXPECT_FALSE(has_key(j, "opt_adam_beta_1"));

  c.optimizer.name = "adamw";
  c.schedule.warmup_steps = 33;
  const std::string a = export_mlperf_json(c, trial_with(c), "s1");
  EXPECT_EQ(bs::test::json_number(a, "opt_adam_beta_1"), 0.83);
  EXPECT_EQ(bs::test::json_number(a, "opt_adam_beta_2"), 0.9975);
  EXPECT_EQ(bs::test::json_number(a, "opt_weight_decay"), 0.0123);
  EXPECT_EQ(bs::test::json_number(a, "opt_learning_rate_warmup_steps"), 33);
  EXPECT_FALSE(has_key(a, "opt_lamb_beta_1"));

  // Valid JSON: Python's json module reads it (the one-key-per-line layout is ours).
  const std::string dir = test::make_temp_dir("mlperf");
  std::ofstream(dir + "/h.json") << a;
  auto r = test::run({"/usr/bin/python3", "-c",
                      "import json,sys; d=json.load(open(sys.argv[1])); assert d['global_batch_size']==4096; "
                      "assert d['bertsweep']['study']=='s1'",
                      dir + "/h.json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(ConfigExport, UnknownStudyNamesThePathAndTheStudiesThere) {
  const std::string dir = test::make_temp_dir("unknown");
  std::filesystem::create_directories(dir + "/alpha");
  { StudyStore s(dir + "/alpha/study.db"); }
  try {
    existing_study_db(dir, "beta");
    FAIL() << "no error";
  } catch (const StudyError& e) {
    EXPECT_NE(std::string(e.what()).find("beta/study.db"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("alpha"), std::string::npos) << e.what();
  }
  EXPECT_EQ(existing_study_db(dir, "alpha"), dir + "/alpha/study.db");
}
