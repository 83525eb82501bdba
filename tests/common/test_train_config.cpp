#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
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

// The typed path a trial's config takes (search space -> TrainConfig -> stored row): set() parses a value
// as --set does, text()/number() read one key back, read_stored() reads a row an older version wrote.
TEST(TrainConfig, SetTextAndNumberGoThroughTheKeyTable) {
  TrainConfig c;
  c.set("optimizer.lr", "2e-3", "trial 1");
  c.set("batch.global", "4096.0", "trial 1");  // a whole number written as a float, as --set accepts
  c.set("optimizer.name", "lamb", "trial 1");
  c.set("data.strata", "[16, 128]", "trial 1");
  c.set("seed", "7", "trial 1");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2e-3);
  EXPECT_EQ(c.batch.global, 4096);
  EXPECT_EQ(c.optimizer.name, "lamb");
  EXPECT_EQ(c.data.strata, (std::vector<int64_t>{16, 128}));
  EXPECT_EQ(c.seed, 7);
  // text() is what the stored YAML holds for the key.
  const YAML::Node stored = YAML::Load(c.to_yaml_string());
  EXPECT_EQ(c.text("optimizer.lr"), stored["optimizer"]["lr"].Scalar());
  EXPECT_EQ(c.text("batch.global"), "4096");
  EXPECT_EQ(c.text("optimizer.name"), "lamb");
  EXPECT_EQ(c.text("seed"), "7");
  EXPECT_EQ(c.text("data.strata"), "[16, 128]");
  EXPECT_DOUBLE_EQ(c.number("optimizer.lr"), 2e-3);
  EXPECT_DOUBLE_EQ(c.number("batch.global"), 4096.0);
  EXPECT_THROW(c.number("optimizer.name"), ConfigError);
  EXPECT_THROW(c.text("optimizer.learning_rate"), ConfigError);
  // Errors name the source and the key; nothing is range-checked until validate().
  try {
    c.set("batch.global", "lots", "trial 3");
    FAIL() << "accepted a word for an integer key";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("trial 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("batch.global"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c.set("optimizer.learning_rate", "1", "trial 3"), ConfigError);
  c.set("model.heads", "3", "trial 4");  // 128 % 3: only validate() sees the combination
  EXPECT_THROW(c.validate("trial 4"), ConfigError);
}

TEST(TrainConfig, ReadStoredSkipsWhatThisVersionNoLongerKnows) {
  // An older row: a removed backend (gloo), a key that no longer exists, and a malformed value.
  const TrainConfig c = TrainConfig::read_stored(
      "optimizer: {name: lamb, lr: 0.5, gone_key: 1}\ndistributed: {backend: gloo}\nbatch: {global: lots}\n"
      "old_top_level: x\nseed: 9\n");
  EXPECT_EQ(c.optimizer.name, "lamb");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);
  EXPECT_EQ(c.seed, 9);
  EXPECT_EQ(c.batch.global, TrainConfig().batch.global);  // unparsable: the default stays
  EXPECT_EQ(c.distributed.backend, "gloo");               // read, not validated: results report what ran
  EXPECT_EQ(TrainConfig::read_stored("not: [valid").optimizer.name, TrainConfig().optimizer.name);
  EXPECT_EQ(TrainConfig::read_stored("").seed, TrainConfig().seed);
  // A row this version wrote reads back exactly.
  TrainConfig full;
  full.set("optimizer.lr", "0.1", "t");
  full.set("model.init_checkpoint", "/ckpt/phase1.pt", "t");
  EXPECT_EQ(TrainConfig::read_stored(full.to_yaml_string()).to_yaml_string(), full.to_yaml_string());
}

// Nested aliases ("billion laughs": 9 levels of 9 aliases, about 400 bytes, 387 million nodes expanded) are
// refused from the parser's events before any tree is walked; a config with a few honest aliases loads.
TEST(TrainConfig, AliasBombIsRefusedQuickly) {
  std::string dir = bs::test::make_temp_dir("alias-bomb");
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'i'; ++c) {
    bomb += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 9; ++i) bomb += std::string(i ? ", " : "") + "*" + static_cast<char>(c - 1);
    bomb += "]\n";
  }
  bomb += "model: {hidden: 128}\n";
  const auto start = std::chrono::steady_clock::now();
  const std::string err = error_of(write(dir, "bomb.yaml", bomb));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(err.find("bomb.yaml:"), std::string::npos) << err;
  EXPECT_NE(err.find("billion laughs"), std::string::npos) << err;
  EXPECT_LT(seconds, 1.0);  // the walk it replaces took minutes
  // Aliases within the bound: counted, and the config loads.
  EXPECT_NO_THROW(bs::yaml::check_alias_expansion("a: &a [1, 2]\nb: [*a, *a, *a]\n", "inline"));
  std::string wide = "a: &a [";
  for (int i = 0; i < 1000; ++i) wide += std::string(i ? "," : "") + "1";
  wide += "]\nb: [";
  for (int i = 0; i < 200; ++i) wide += std::string(i ? "," : "") + "*a";
  wide += "]\n";  // 200 x 1001 nodes: past the bound without any nesting
  EXPECT_THROW(bs::yaml::check_alias_expansion(wide, "wide"), ConfigError);
}
