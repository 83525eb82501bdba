// The Optuna bridge on a real SQLite study file: ask/tell, pruning, re-queued trials, a sampler seed,
// coexistence with the bs_ tables, and the file read by stock Optuna in /usr/bin/python3.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <fstream>

#include "TestUtil.h"
#include "search/OptunaBridge.h"
#include "search/StudyConfig.h"
#include "studies/StudyStore.h"

using namespace bs;
using namespace bs::search;

namespace {
StudyConfig config(const std::string& extra = "") {
  return StudyConfig::from_yaml(YAML::Load("name: b\nsampler: random\nseed: 5\npruner: median\nspace:\n"
                                           "  optimizer.name: {choice: [adam, lamb]}\n"
                                           "  optimizer.lr: {log_uniform: [0.0001, 0.01]}\n"
                                           "  batch.global: {int: [16, 64], pow2: true}\n"
                                           "  optimizer.beta2: {uniform: [0.9, 0.99], when: {optimizer.name: lamb}}\n" +
                                           extra),
                                "test");
}
}  // namespace

TEST(OptunaBridge, InterpreterFindsDebianOptuna) {
  std::string v = ensure_python();
  EXPECT_FALSE(v.empty());
  EXPECT_EQ(python_version().substr(0, 2), "3.");
}

TEST(OptunaBridge, AskTellAndStockOptunaReadsTheSameFile) {
  std::string dir = test::make_temp_dir("bridge");
  std::string db = dir + "/study.db";
  StudyConfig c = config();
  StudyStore store(db);  // our tables first, as the controller does
  std::map<int64_t, double> told;
  {
    OptunaBridge b(db, c);
    for (int i = 0; i < 5; ++i) {
      auto a = b.ask(c.space, c.base());
      EXPECT_EQ(a.number, i);
      const std::string opt = std::get<std::string>(a.params.at("optimizer.name"));
      EXPECT_EQ(a.params.count("optimizer.beta2"), opt == "lamb" ? 1u : 0u);
      int64_t batch = std::get<int64_t>(a.params.at("batch.global"));
      EXPECT_TRUE(batch == 16 || batch == 32 || batch == 64);
      double lr = std::get<double>(a.params.at("optimizer.lr"));
      EXPECT_GE(lr, 0.0001);
      EXPECT_LE(lr, 0.01);
      if (i == 3) {
        b.tell_fail(a.number);
        continue;
      }
      double v = 1000.0 * (i + 1) + lr;
      b.tell_complete(a.number, {v});
      told[a.number] = v;
      TrialRecord t;
      t.number = a.number;
      t.state = trial_state::kComplete;
      t.values = {v};
      store.insert_trial(t);
    }
    EXPECT_EQ(b.best_trial_number().value(), 0);
    auto counts = b.count_by_state();
    EXPECT_EQ(counts["COMPLETE"], 4);
    EXPECT_EQ(counts["FAIL"], 1);
  }
  // Stock Optuna in Debian's interpreter, as a separate process.
  std::string script = dir + "/read.py";
  std::ofstream(script) << "import optuna, sys\n"
                           "s = optuna.load_study(study_name='b', storage='sqlite:///' + sys.argv[1])\n"
                           "for t in s.trials:\n"
                           "    print(t.number, t.state.name, repr(t.value))\n"
                           "print('best', s.best_trial.number)\n";
  auto r = test::run({"/usr/bin/python3", script, db});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& kv : told) {
    std::ostringstream want;
    want.precision(17);
    want << kv.first << " COMPLETE ";
    EXPECT_NE(r.out.find(want.str()), std::string::npos) << r.out;
  }
  EXPECT_NE(r.out.find("3 FAIL None"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("best 0"), std::string::npos) << r.out;
  EXPECT_EQ(StudyStore(db).trials().size(), 4u);  // ours still there beside Optuna's
}

TEST(OptunaBridge, PrunesALaggingTrialAndReplaysEnqueuedParams) {
  std::string db = test::make_temp_dir("bridge") + "/study.db";
  StudyConfig c = config();
  OptunaBridge b(db, c);
  // Three trials whose error falls well; then one that stays high is pruned by the median rule.
  for (int i = 0; i < 3; ++i) {
    auto a = b.ask(c.space, c.base());
    for (int step = 1; step <= 4; ++step) b.report(a.number, 1.0 - 0.2 * step, step * 100);
    b.tell_complete(a.number, {100.0 + i});
  }
  auto lag = b.ask(c.space, c.base());
  b.report(lag.number, 0.99, 100);
  EXPECT_TRUE(b.should_prune(lag.number));
  b.tell_pruned(lag.number);
  auto good = b.ask(c.space, c.base());
  b.report(good.number, 0.1, 100);
  EXPECT_FALSE(b.should_prune(good.number));
  b.tell_fail(good.number);
  // Re-queue the failed trial's parameters: the next ask returns exactly them, with the attributes.
  b.enqueue(good.params, {{"bs_retry_of", std::to_string(good.number)}, {"bs_attempt", "2"}});
  auto retry = b.ask(c.space, c.base());
  EXPECT_EQ(retry.params, good.params);
  EXPECT_EQ(retry.user_attrs.at("bs_attempt"), "2");
  EXPECT_EQ(retry.user_attrs.at("bs_retry_of"), std::to_string(good.number));
  // A trial of an earlier session can be failed by number (resume).
  OptunaBridge again(db, c);
  again.tell_fail(retry.number);
  auto trials = again.trials();
  EXPECT_EQ(trials.back().state, "FAIL");
  EXPECT_EQ(trials.at(lag.number).state, "PRUNED");
}

TEST(OptunaBridge, SameSeedSameFirstSamples) {
  StudyConfig c = config();
  auto first = [&] {
    std::string db = test::make_temp_dir("bridge") + "/study.db";
    OptunaBridge b(db, c);
    return b.ask(c.space, c.base()).params;
  };
  EXPECT_EQ(first(), first());
}

TEST(OptunaBridge, PythonErrorsCarryTheTraceback) {
  std::string db = test::make_temp_dir("bridge") + "/study.db";
  StudyConfig c = config();
  OptunaBridge b(db, c);
  auto a = b.ask(c.space, c.base());
  b.tell_complete(a.number, {1.0});
  try {
    b.tell_complete(a.number, {2.0});  // telling a finished trial again is an Optuna error
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("Traceback"), std::string::npos) << m;
    EXPECT_NE(m.find("ValueError: Cannot tell a COMPLETE trial"), std::string::npos) << m;
  }
}
