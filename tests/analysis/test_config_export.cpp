// Exported configs: YAML byte-exact (or --set applied and everything else unchanged), MLPerf JSON values.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

// The number after "key": in the JSON text (strtod of the exact digits written).
double json_number(const std::string& json, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\": ([-+0-9.eE]+)");
  if (!std::regex_search(json, m, re)) throw std::runtime_error("no key " + key + " in\n" + json);
  return std::strtod(m[1].str().c_str(), nullptr);
}
bool has_key(const std::string& json, const std::string& key) {
  return json.find("\"" + key + "\":") != std::string::npos;
}

}  // namespace

TEST(ConfigExport, YamlIsExactlyTheStoredConfig) {
  TrainConfig c;
  c.optimizer.lr = 0.0012345678901234567;
  TrialRecord t = trial_with(c);
  t.config_yaml = "# stored as the controller wrote it\n" + t.config_yaml;  // byte-exact, comments too
  EXPECT_EQ(export_yaml(t), t.config_yaml);
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
  EXPECT_EQ(json_number(j, "global_batch_size"), 4096);
  EXPECT_EQ(json_number(j, "opt_base_learning_rate"), 0.0017);
  EXPECT_EQ(json_number(j, "opt_lamb_beta_1"), 0.83);
  EXPECT_EQ(json_number(j, "opt_lamb_beta_2"), 0.9975);
  EXPECT_EQ(json_number(j, "opt_epsilon"), 1e-7);
  EXPECT_EQ(json_number(j, "opt_lamb_weight_decay_rate"), 0.0123);
  EXPECT_EQ(json_number(j, "opt_lamb_learning_rate_decay_poly_power"), 0.5);
  EXPECT_EQ(json_number(j, "start_warmup_step"), -25);
  const int64_t total = (1000000 + 4095) / 4096;  // the trainer runs ceil(max_samples / batch) steps
  EXPECT_EQ(json_number(j, "opt_learning_rate_training_steps"), total);
  EXPECT_EQ(json_number(j, "opt_learning_rate_warmup_steps"), std::llround(0.07 * total));
  EXPECT_EQ(json_number(j, "num_warmup_steps"), std::llround(0.07 * total));
  EXPECT_EQ(json_number(j, "max_samples"), 1000000);
  EXPECT_EQ(json_number(j, "seed"), 9);
  EXPECT_EQ(json_number(j, "trial"), 12);
  EXPECT_FALSE(has_key(j, "opt_adam_beta_1"));

  c.optimizer.name = "adamw";
  c.schedule.warmup_steps = 33;
  const std::string a = export_mlperf_json(c, trial_with(c), "s1");
  EXPECT_EQ(json_number(a, "opt_adam_beta_1"), 0.83);
  EXPECT_EQ(json_number(a, "opt_adam_beta_2"), 0.9975);
  EXPECT_EQ(json_number(a, "opt_weight_decay"), 0.0123);
  EXPECT_EQ(json_number(a, "opt_learning_rate_warmup_steps"), 33);
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
