// Study configs and search spaces: parsing, refusal of bad input before any trial, conditional and
// derived parameters, and the resolved training config of a trial.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>

#include "TestUtil.h"
#include "common/TrainConfig.h"
#include "search/StudyConfig.h"

using namespace bs;
using namespace bs::search;

namespace {
std::string write_study(const std::string& text) {
  std::string dir = test::make_temp_dir("space");
  std::string path = dir + "/study.yaml";
  std::ofstream(path) << text;
  return path;
}
std::string error_of(const std::string& text) {
  try {
    StudyConfig::load(write_study(text));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
const char* kHead = "name: t\nbase: {batch: {global: 64, micro: 16}}\nspace:\n";
}  // namespace

// configs/studies/optimizer-study.yaml (BENCHMARKS.md section 7): 8 trials for each of the 12 cells, every trial
// from the phase-1 checkpoint, and the sample budget and eval interval scaled by sqrt(batch / 256).
TEST(SearchSpace, TheOptimizerStudyScalesBudgetAndEvalIntervalWithSqrtBatch) {
  StudyConfig c = StudyConfig::load(test::source_dir() + "/configs/studies/optimizer-study.yaml");
  EXPECT_EQ(c.sampler, "tpe");
  EXPECT_EQ(c.pruner, "median");
  ASSERT_EQ(c.strata().size(), 12u);
  EXPECT_EQ(c.n_trials, 8 * 12);
  for (int64_t batch : {64, 256, 1024}) {
    const std::map<std::string, ParamValue> sampled = {{"optimizer.name", std::string("nvlamb")},
                                                       {"batch.global", batch},
                                                       {"optimizer.lr", 0.004},
                                                       {"optimizer.beta2", 0.99},
                                                       {"schedule.warmup_fraction", 0.1}};
    TrainConfig t = c.space.resolve(c.base(), sampled, "trial");
    const double root = std::sqrt(static_cast<double>(batch) / 256.0);
    EXPECT_EQ(t.target.max_samples, static_cast<int64_t>(40960 * root)) << batch;
    EXPECT_EQ(t.target.eval_every_samples, static_cast<int64_t>(2048 * root)) << batch;
    EXPECT_EQ(t.model.init_checkpoint, "data/proxy-phase1/checkpoint-512.pt");
    EXPECT_EQ(t.model.hidden, 256);
    EXPECT_EQ(t.data.seq_len, 64);
    EXPECT_DOUBLE_EQ(t.target.mlm_accuracy, 0.140);
  }
}

TEST(SearchSpace, ReadsTheShippedStudyConfigs) {
  for (std::string f : {"demo.yaml", "smoke.yaml", "adam-vs-lamb.yaml"}) {
    StudyConfig c = StudyConfig::load(test::source_dir() + "/configs/studies/" + f);
    EXPECT_FALSE(c.space.empty()) << f;
    EXPECT_EQ(c.objectives[0], "samples_to_target");
    // The base is fully explicit and valid on its own.
    TrainConfig base = c.base();
    EXPECT_EQ(base.model.hidden, 128) << f;
  }
  StudyConfig demo = StudyConfig::load(test::source_dir() + "/configs/studies/demo.yaml");
  EXPECT_EQ(demo.n_trials, 12);
  EXPECT_EQ(demo.space.derived().size(), 1u);
}

TEST(SearchSpace, RefusesUnknownKeyPathNamingParameterAndLine) {
  std::string e = error_of(std::string(kHead) +
                           "  optimizer.lr: {uniform: [0.001, 0.01]}\n  optimiser.beta2: {uniform: [0.9, 0.99]}\n");
  EXPECT_NE(e.find("optimiser.beta2"), std::string::npos) << e;
  EXPECT_NE(e.find("study.yaml:5"), std::string::npos) << e;
}

TEST(SearchSpace, RefusesEmptyChoiceAndInvertedRange) {
  std::string e = error_of(std::string(kHead) + "  optimizer.name: {choice: []}\n");
  EXPECT_NE(e.find("optimizer.name"), std::string::npos) << e;
  EXPECT_NE(e.find("non-empty"), std::string::npos) << e;
  e = error_of(std::string(kHead) + "  optimizer.lr: {log_uniform: [0.01, 0.001]}\n");
  EXPECT_NE(e.find("optimizer.lr"), std::string::npos) << e;
  EXPECT_NE(e.find("low"), std::string::npos) << e;
  e = error_of(std::string(kHead) + "  optimizer.lr: {log_uniform: [0.0, 0.1]}\n");
  EXPECT_NE(e.find("low > 0"), std::string::npos) << e;
  e = error_of(std::string(kHead) + "  batch.global: {int: [16, 64], pow2: true, stride: 2}\n");
  EXPECT_NE(e.find("stride"), std::string::npos) << e;
  e = error_of(std::string(kHead) + "  optimizer.lr: {uniform: [0.1, 0.2], when: {optimizer.nam: lamb}}\n");
  EXPECT_NE(e.find("optimizer.nam"), std::string::npos) << e;
  // A nested list inside the condition's values is refused, not matched as an empty value.
  e = error_of(std::string(kHead) +
               "  optimizer.name: {choice: [adam, lamb]}\n"
               "  optimizer.beta2: {uniform: [0.9, 0.99], when: {optimizer.name: [lamb, [adam]]}}\n");
  EXPECT_NE(e.find("each listed value must be a plain value"), std::string::npos) << e;
  EXPECT_NE(e.find("optimizer.beta2"), std::string::npos) << e;
}

TEST(SearchSpace, RefusesUnknownStudyKeysAndBadValues) {
  EXPECT_NE(error_of("name: t\nsampler: tpe\nn_trails: 3\n").find("n_trails"), std::string::npos);
  EXPECT_NE(error_of("name: t\nsampler: bayes\n").find("sampler"), std::string::npos);
  // Counts past int are refused, not wrapped (4294967296 trials once became 0, 4294967298 in parallel 2).
  EXPECT_NE(error_of("name: t\nn_trials: 4294967296\n").find("n_trials' must be an integer <= 2147483647"),
            std::string::npos)
      << error_of("name: t\nn_trials: 4294967296\n");
  EXPECT_NE(error_of("name: t\nparallel: 4294967298\n").find("parallel"), std::string::npos);
  EXPECT_NE(error_of("name: t\nlauncher: {kind: mpirun, ranks: 4294967298}\n").find("launcher.ranks"),
            std::string::npos)
      << error_of("name: t\nlauncher: {kind: mpirun, ranks: 4294967298}\n");
  EXPECT_NE(error_of("name: t\nlauncher: {kind: local, gpus: [3000000000]}\n").find("launcher.gpus"),
            std::string::npos);
  // NaN is not a number of seconds: stored as .nan it could not be read back on resume.
  for (const char* t : {"nan", "inf", ".nan", "-1"})
    EXPECT_NE(error_of(std::string("name: t\ntrial_timeout: ") + t + "\n").find("trial_timeout"), std::string::npos)
        << t;
  EXPECT_NE(error_of("name: ../x\n").find("study name"), std::string::npos);
  EXPECT_NE(error_of("name: t\nbase: {optimizer: {lr: -1}}\n").find("optimizer.lr"), std::string::npos);
  EXPECT_NE(error_of("name: t\nobjective: [samples_to_target, batch.global]\npruner: median\n").find("prune"),
            std::string::npos);
  EXPECT_NE(error_of("name: t\nobjective: [samples_to_target, optimizer.name]\n").find("not a numeric training key"),
            std::string::npos);
  EXPECT_NE(error_of("name: t\nsampler: grid\nspace:\n  optimizer.lr: {uniform: [0.1, 0.2]}\n").find("grid"),
            std::string::npos);
  // A condition on a parameter declared below it cannot be evaluated.
  EXPECT_NE(error_of(std::string(kHead) + "  optimizer.beta2: {uniform: [0.9, 0.99], when: {optimizer.name: lamb}}\n"
                                          "  optimizer.name: {choice: [adam, lamb]}\n")
                .find("declared above"),
            std::string::npos);
}

TEST(SearchSpace, ConditionalParametersAreSampledOnlyWhenTheirConditionHolds) {
  StudyConfig c = StudyConfig::load(
      write_study(std::string(kHead) + "  optimizer.name: {choice: [adam, lamb]}\n"
                                       "  optimizer.beta2: {uniform: [0.9, 0.99], when: {optimizer.name: lamb}}\n"
                                       "  batch.global: {int: [16, 128], pow2: true}\n"));
  ASSERT_EQ(c.space.params().size(), 3u);
  const auto& b = c.space.params()[2];
  std::vector<ParamValue> expect = {int64_t(16), int64_t(32), int64_t(64), int64_t(128)};
  EXPECT_EQ(b.grid_values(), expect);
  for (std::string opt : {"adam", "lamb"}) {
    std::vector<std::string> asked;
    auto sampled = c.space.sample(c.base(), [&](const SpaceParam& p) -> ParamValue {
      asked.push_back(p.key);
      if (p.key == "optimizer.name") return opt;
      if (p.key == "batch.global") return int64_t(32);
      return 0.95;
    });
    EXPECT_EQ(sampled.count("optimizer.beta2"), opt == "lamb" ? 1u : 0u) << opt;
    EXPECT_EQ(asked.size(), opt == "lamb" ? 3u : 2u);
    TrainConfig t = c.space.resolve(c.base(), sampled, "trial");
    EXPECT_EQ(t.optimizer.name, opt);
    EXPECT_EQ(t.batch.global, 32);
    EXPECT_EQ(t.optimizer.beta2, opt == "lamb" ? 0.95 : 0.999);
  }
}

TEST(SearchSpace, DerivedLearningRateScalesWithBatch) {
  StudyConfig c = StudyConfig::load(
      write_study("name: t\nbase: {batch: {micro: 16}}\nspace:\n"
                  "  batch.global: {choice: [64, 1024]}\n  optimizer.lr: {log_uniform: [0.0001, 0.01]}\n"
                  "derived:\n  optimizer.lr: {scale: optimizer.lr, by: batch.global, rule: sqrt, base_batch: 256}\n"));
  for (int64_t batch : {64, 1024}) {
    std::map<std::string, ParamValue> s = {{"batch.global", batch}, {"optimizer.lr", 0.002}};
    TrainConfig t = c.space.resolve(c.base(), s, "trial");
    EXPECT_NEAR(t.optimizer.lr, 0.002 * std::sqrt(double(batch) / 256.0), 1e-15);
  }
}

TEST(SearchSpace, ResolvedConfigIsValidatedAndSetsApply) {
  // heads 3 fits hidden 96 but not 128: only the sampled combination can be checked.
  StudyConfig c = StudyConfig::load(
      write_study(std::string(kHead) + "  model.hidden: {choice: [96, 128]}\n" + "  model.heads: {choice: [2, 3]}\n"),
      {"base.data.dir=/data/x", "n_trials=4"});
  EXPECT_EQ(c.n_trials, 4);
  EXPECT_EQ(c.base().data.dir, "/data/x");
  EXPECT_THROW(c.space.resolve(c.base(), {{"model.hidden", int64_t(128)}, {"model.heads", int64_t(3)}}, "trial 1"),
               ConfigError);  // 128 % 3
  EXPECT_NO_THROW(c.space.resolve(c.base(), {{"model.hidden", int64_t(96)}, {"model.heads", int64_t(3)}}, "t2"));
  // A value no combination can make valid is refused when the study is read, before any trial.
  EXPECT_THROW(StudyConfig::load(write_study(std::string(kHead) + "  model.heads: {choice: [2, 3]}\n")), ConfigError);
  // The canonical text reads back to the same search.
  StudyConfig back = StudyConfig::from_yaml(YAML::Load(c.to_yaml_string()), "stored");
  EXPECT_EQ(back.identity(), c.identity());
  EXPECT_EQ(back.n_trials, 4);
  StudyConfig other = StudyConfig::load(
      write_study(std::string(kHead) + "  model.hidden: {choice: [96, 128]}\n" + "  model.heads: {choice: [2, 4]}\n"));
  EXPECT_NE(other.identity(), c.identity());
}
