#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "common/TrainConfig.h"

using bs::ConfigError;
using bs::TrainConfig;

static std::string write(const std::string& dir, const std::string& name, const std::string& text) {
  std::string p = dir + "/" + name;
  std::ofstream(p) << text;
  return p;
}

static std::string error_of(const std::string& path, std::vector<std::string> sets = {}) {
  try {
    TrainConfig::load(path, sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(TrainConfig, ParsesTypedKeysAndRoundTripsThroughYaml) {
  auto dir = bs::test::make_temp_dir("cfg");
  auto p = write(dir, "a.yaml",
                 "model: {hidden: 256, layers: 4, heads: 4}\n"
                 "optimizer: {name: lamb, lr: 0.00175, beta2: 0.95}\n"
                 "data: {strata: [16, 128]}\nseed: 42\n");
  TrainConfig c = TrainConfig::load(p);
  EXPECT_EQ(c.model.hidden, 256);
  EXPECT_EQ(c.optimizer.name, "lamb");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.00175);
  EXPECT_EQ(c.data.strata, (std::vector<int64_t>{16, 128}));
  EXPECT_EQ(c.seed, 42);
  auto back = write(dir, "b.yaml", c.to_yaml_string());
  TrainConfig d = TrainConfig::load(back);
  EXPECT_EQ(d.to_yaml_string(), c.to_yaml_string());
  EXPECT_DOUBLE_EQ(d.optimizer.beta2, 0.95);
}

TEST(TrainConfig, UnknownKeyNamesPathAndLine) {
  auto dir = bs::test::make_temp_dir("cfg");
  auto p = write(dir, "typo.yaml", "model:\n  hidden: 128\n  hiden: 64\n");
  std::string e = error_of(p);
  EXPECT_NE(e.find("model.hiden"), std::string::npos) << e;
  EXPECT_NE(e.find("typo.yaml:3"), std::string::npos) << e;
}

TEST(TrainConfig, WrongTypeNamesKeyAndExpectedType) {
  auto dir = bs::test::make_temp_dir("cfg");
  auto p = write(dir, "t.yaml", "batch:\n  global: lots\n");
  std::string e = error_of(p);
  EXPECT_NE(e.find("batch.global"), std::string::npos) << e;
  EXPECT_NE(e.find("integer"), std::string::npos) << e;
  EXPECT_NE(e.find("t.yaml:2"), std::string::npos) << e;
}

TEST(TrainConfig, OutOfRangeAndUnknownNamesAreRefused) {
  auto dir = bs::test::make_temp_dir("cfg");
  auto p = write(dir, "ok.yaml", "seed: 1\n");
  EXPECT_NE(error_of(p, {"optimizer.lr=-1"}).find("optimizer.lr"), std::string::npos);
  EXPECT_NE(error_of(p, {"optimizer.beta1=1.0"}).find("optimizer.beta1"), std::string::npos);
  EXPECT_NE(error_of(p, {"optimizer.name=adamax"}).find("must be one of"), std::string::npos);
  EXPECT_NE(error_of(p, {"data.seq_len=1024"}).find("max_position"), std::string::npos);
  EXPECT_NE(error_of(p, {"nope.key=3"}).find("unknown key 'nope.key'"), std::string::npos);
}

TEST(TrainConfig, SetOverridesAndExtendsMerge) {
  auto dir = bs::test::make_temp_dir("cfg");
  write(dir, "base.yaml", "model: {hidden: 64, heads: 2, layers: 1}\noptimizer: {lr: 0.5}\n");
  auto p = write(dir, "child.yaml", "extends: base.yaml\noptimizer: {name: sgd}\n");
  TrainConfig c = TrainConfig::load(p, {"optimizer.lr=0.25", "data.sampler=packing"});
  EXPECT_EQ(c.model.hidden, 64);
  EXPECT_EQ(c.optimizer.name, "sgd");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.25);
  EXPECT_EQ(c.data.sampler, "packing");
}

TEST(TrainConfig, MissingFileAndSyntaxErrorAreClear) {
  EXPECT_NE(error_of("/nonexistent/x.yaml").find("file not found"), std::string::npos);
  auto dir = bs::test::make_temp_dir("cfg");
  auto p = write(dir, "bad.yaml", "model: {hidden: 64\nseed: [\n");
  std::string e = error_of(p);
  EXPECT_NE(e.find("YAML syntax error"), std::string::npos) << e;
}
