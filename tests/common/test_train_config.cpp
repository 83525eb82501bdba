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

TEST(TrainConfig, SubmissionKeysAndInitCheckpointHaveDefaultsAndRules) {
  bs::TrainConfig d;
  EXPECT_EQ(d.log.submission_division, "open");
  EXPECT_EQ(d.log.submission_org, "bertsweep");
  EXPECT_EQ(d.log.submission_status, "research");
  EXPECT_TRUE(d.log.submission_platform.empty());  // resolved at run time: CPU model or GPU name
  EXPECT_TRUE(d.model.init_checkpoint.empty());
  for (const char* k : {"log.submission_division", "log.submission_org", "log.submission_platform",
                        "log.submission_status", "model.init_checkpoint"})
    EXPECT_TRUE(bs::TrainConfig::is_key(k)) << k;
  auto err = [](const std::vector<std::string>& sets) {
    try {
      bs::TrainConfig::from_yaml(YAML::Node(YAML::NodeType::Map), "t.yaml", sets);
    } catch (const bs::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(err({"log.submission_division=closed"}).find("LAMB"), std::string::npos);
  EXPECT_NE(err({"log.submission_division=closed", "optimizer.name=lamb"}).find("0.720"), std::string::npos);
  EXPECT_NE(err({"log.submission_division=closed", "optimizer.name=lamb", "target.mlm_accuracy=0.72"})
                .find("model.init_checkpoint"),
            std::string::npos);
  EXPECT_EQ(err({"log.submission_division=closed", "optimizer.name=lamb", "target.mlm_accuracy=0.72",
                 "model.init_checkpoint=phase1.pt"}),
            "(accepted)");
  EXPECT_NE(err({"log.submission_division=secret"}).find("log.submission_division"), std::string::npos);
  EXPECT_NE(err({"log.submission_status=shipping"}).find("research"), std::string::npos);
  EXPECT_NE(err({"log.submission_org="}).find("log.submission_org"), std::string::npos);
  // Round trip through YAML keeps the new keys.
  auto c = bs::TrainConfig::from_yaml(YAML::Node(YAML::NodeType::Map), "t.yaml",
                                      {"model.init_checkpoint=/x/y.pt", "log.submission_platform=8xH200"});
  auto back = bs::TrainConfig::from_yaml(YAML::Load(c.to_yaml_string()), "back");
  EXPECT_EQ(back.model.init_checkpoint, "/x/y.pt");
  EXPECT_EQ(back.log.submission_platform, "8xH200");
}
