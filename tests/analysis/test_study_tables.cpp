// The report's tables against the test's own SQL over the same study file, and the ranking rules of export.
#include <SQLiteCpp/SQLiteCpp.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <map>

#include "StudyFixture.h"
#include "TestUtil.h"
#include "analysis/ConfirmSummary.h"
#include "analysis/StudyTables.h"
#include "common/TrainConfig.h"
#include "studies/ConfigExport.h"

using namespace bs;
using namespace bs::analysis;

namespace {

std::string yaml_get(const std::string& yaml, const std::string& a, const std::string& b) {
  return YAML::Load(yaml)[a][b].Scalar();
}

struct RefStats {
  int n = 0;
  double min = INFINITY, mean = 0, std = 0;
};

RefStats ref_stats(const std::vector<double>& xs) {
  RefStats r;
  r.n = static_cast<int>(xs.size());
  long double sum = 0;
  for (double x : xs) {
    sum += x;
    r.min = std::min(r.min, x);
  }
  if (r.n) r.mean = static_cast<double>(sum / r.n);
  if (r.n > 1) {
    long double ss = 0;
    for (double x : xs) ss += (x - (long double)r.mean) * (x - (long double)r.mean);
    r.std = static_cast<double>(std::sqrt(ss / (r.n - 1)));
  }
  return r;
}

}  // namespace

TEST(StudyTables, StatsAreFloat64MeanAndSampleStd) {
  std::vector<double> xs = {4096, 8192, 6144, 5120.5};
  auto s = stats_of(xs);
  auto r = ref_stats(xs);
  EXPECT_EQ(s.n, 4);
  EXPECT_DOUBLE_EQ(s.best, 4096);
  EXPECT_DOUBLE_EQ(s.mean, r.mean);
  EXPECT_NEAR(s.std, r.std, 1e-9 * r.std);
  EXPECT_DOUBLE_EQ(stats_of({7}).std, 0.0);
  EXPECT_DOUBLE_EQ(stats_of(xs, /*minimize=*/false).best, 8192);
  EXPECT_EQ(stats_of({}).n, 0);
}

TEST(StudyTables, OptimizerBatchTableEqualsOwnSql) {
  const std::string dir = test::make_temp_dir("tables");
  const std::string db = dir + "/study.db";
  {
    StudyStore store(db);
    test::fill_random_study(store, 60, 11);
  }
  // Independent: our own SQL over bs_trials, grouping by the YAML's optimizer.name / batch.global.
  std::map<std::pair<std::string, int64_t>, std::vector<double>> samples;
  std::map<std::pair<std::string, int64_t>, std::map<std::string, int>> states;
  {
    SQLite::Database sql(db, SQLite::OPEN_READONLY);
    SQLite::Statement q(sql, "SELECT state, reached, samples_to_target, config_yaml FROM bs_trials");
    while (q.executeStep()) {
      const std::string yaml = q.getColumn(3).getString();
      auto key = std::make_pair(yaml_get(yaml, "optimizer", "name"), std::stoll(yaml_get(yaml, "batch", "global")));
      const std::string state = q.getColumn(0).getString();
      ++states[key][state];
      if (state == "COMPLETE" && q.getColumn(1).getInt() == 1 && !q.getColumn(2).isNull())
        samples[key].push_back(q.getColumn(2).getDouble());
    }
  }
  StudyStore store(db);
  auto table = optimizer_batch_table(store.trials());
  ASSERT_EQ(table.size(), states.size());
  int with_samples = 0;
  for (const auto& row : table) {
    auto key = std::make_pair(row.optimizer, row.batch);
    ASSERT_TRUE(states.count(key)) << row.optimizer << " " << row.batch;
    EXPECT_EQ(row.complete, states[key]["COMPLETE"]);
    EXPECT_EQ(row.pruned, states[key]["PRUNED"]);
    EXPECT_EQ(row.failed, states[key]["FAIL"]);
    auto r = ref_stats(samples[key]);
    EXPECT_EQ(row.reached, r.n);
    EXPECT_EQ(row.samples.n, r.n);
    if (r.n) {
      ++with_samples;
      EXPECT_DOUBLE_EQ(row.samples.best, r.min);
      EXPECT_NEAR(row.samples.mean, r.mean, 1e-9 * r.mean);
      EXPECT_NEAR(row.samples.std, r.std, 1e-9 * (1 + r.std));
      ASSERT_GE(row.best_trial, 0);
      EXPECT_DOUBLE_EQ(*store.trial(row.best_trial)->samples_to_target, r.min);
    }
  }
  EXPECT_GT(with_samples, 3);  // the random study exercises several groups
}

TEST(StudyTables, RankingPutsReachedTrialsFirstThenObjective) {
  std::vector<TrialRecord> ts = {
      test::make_trial(0, trial_state::kComplete, "lamb", 64, true, 5000),
      test::make_trial(1, trial_state::kComplete, "lamb", 64, true, 3000),
      test::make_trial(2, trial_state::kComplete, "adamw", 64, false, std::nullopt),
      test::make_trial(3, trial_state::kPruned, "adamw", 64, false, std::nullopt),
      test::make_trial(4, trial_state::kComplete, "adamw", 128, true, 3000),
      test::make_trial(5, trial_state::kFail, "lamb", 64, true, 100),
  };
  ts[2].values = {10};  // a smaller objective value, but the target was not reached
  auto ranked = rank_trials(ts, StudyObjective{});
  std::vector<int64_t> order;
  for (const auto& t : ranked) order.push_back(t.number);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 4, 0, 2}));

  auto lamb = rank_trials(ts, StudyObjective{}, TrialFilter::parse({"optimizer=lamb"}));
  ASSERT_EQ(lamb.size(), 2u);
  EXPECT_EQ(lamb[0].number, 1);
  auto big = rank_trials(ts, StudyObjective{}, TrialFilter::parse({"optimizer=adamw,batch=128.0"}));
  ASSERT_EQ(big.size(), 1u);
  EXPECT_EQ(big[0].number, 4);
  EXPECT_TRUE(rank_trials(ts, StudyObjective{}, TrialFilter::parse({"optimizer.name=lans"})).empty());

  // Maximizing the final accuracy: reached first, then the higher accuracy.
  for (auto& t : ts) t.final_mlm_accuracy = 0.1 * static_cast<double>(t.number);
  StudyObjective acc{"final_mlm_accuracy", false};
  order.clear();
  for (const auto& t : rank_trials(ts, acc)) order.push_back(t.number);
  EXPECT_EQ(order, (std::vector<int64_t>{4, 1, 0, 2}));
}

TEST(StudyTables, ObjectiveComesFromTheStoredStudyConfig) {
  const std::string dir = test::make_temp_dir("objective");
  StudyStore store(dir + "/study.db");
  EXPECT_EQ(StudyObjective::of_study(store, "s").metric, "samples_to_target");
  store.save_study("s", "name: s\nobjective: [final_mlm_accuracy, batch.global]\ndirection: [maximize, maximize]\n");
  auto o = StudyObjective::of_study(store, "s");
  EXPECT_EQ(o.metric, "final_mlm_accuracy");
  EXPECT_FALSE(o.minimize);
  auto p = StudyObjective::from_study_yaml("objective: seconds_to_target\n");
  EXPECT_EQ(p.metric, "seconds_to_target");
  EXPECT_TRUE(p.minimize);
}

TEST(StudyTables, WhereRejectsUnknownKeysAndMalformedTerms) {
  EXPECT_THROW(TrialFilter::parse({"optimiser=lamb"}), ConfigError);
  EXPECT_THROW(TrialFilter::parse({"lamb"}), ConfigError);
  auto f = TrialFilter::parse({"optimizer=lamb,batch=4096", "optimizer.beta2=0.999"});
  ASSERT_EQ(f.terms().size(), 3u);
  EXPECT_EQ(f.terms()[0].first, "optimizer.name");
  EXPECT_EQ(f.terms()[1].first, "batch.global");
  EXPECT_EQ(f.terms()[2].first, "optimizer.beta2");
}

TEST(StudyTables, ParetoFrontIsExactlyTheNonDominatedReachedTrials) {
  const std::string dir = test::make_temp_dir("pareto");
  StudyStore store(dir + "/study.db");
  test::fill_random_study(store, 80, 5);
  const auto trials = store.trials();
  const auto pts = reached_points(trials);
  const auto front = pareto_front(trials);
  ASSERT_FALSE(front.empty());
  auto dominates = [](const ParetoPoint& q, const ParetoPoint& p) {
    return q.batch >= p.batch && q.samples_to_target <= p.samples_to_target &&
           (q.batch > p.batch || q.samples_to_target < p.samples_to_target);
  };
  for (const auto& f : front)
    for (const auto& p : pts) EXPECT_FALSE(dominates(p, f)) << "front trial " << f.trial << " dominated by " << p.trial;
  for (const auto& p : pts) {
    bool on_front = false, covered = false;
    for (const auto& f : front) {
      on_front |= f.trial == p.trial;
      covered |= dominates(f, p) || (f.batch == p.batch && f.samples_to_target == p.samples_to_target);
    }
    EXPECT_TRUE(on_front || covered) << "trial " << p.trial;
  }
  for (std::size_t i = 1; i < front.size(); ++i) {
    EXPECT_GT(front[i].batch, front[i - 1].batch);
    EXPECT_GT(front[i].samples_to_target, front[i - 1].samples_to_target);
  }
}

TEST(StudyTables, HistoryBestSoFarIsTheRunningMinimum) {
  const std::string dir = test::make_temp_dir("history");
  StudyStore store(dir + "/study.db");
  test::fill_random_study(store, 40, 3);
  auto h = optimization_history(store.trials(), StudyObjective{});
  std::optional<double> best;
  for (const auto& p : h) {
    auto t = store.trial(p.trial);
    if (t->state == trial_state::kComplete) {
      ASSERT_TRUE(p.value.has_value());
      EXPECT_DOUBLE_EQ(*p.value, t->values[0]);
      best = best ? std::min(*best, *p.value) : *p.value;
    } else {
      EXPECT_FALSE(p.value.has_value());
    }
    EXPECT_EQ(p.best_so_far.has_value(), best.has_value());
    if (best) {
      EXPECT_DOUBLE_EQ(*p.best_so_far, *best);
    }
  }
}

TEST(ConfirmStore, RoundTripsAndSummarisesTheLatestSession) {
  const std::string dir = test::make_temp_dir("confirm");
  const std::string db = dir + "/study.db";
  { StudyStore store(db); }
  {
    ConfirmStore ro(db, false);
    EXPECT_TRUE(ro.runs().empty());
  }
  {
    SQLite::Database sql(db, SQLite::OPEN_READONLY);
    EXPECT_FALSE(sql.tableExists("bs_confirm"));  // a reader never creates the table
  }
  ConfirmStore store(db, true);
  EXPECT_EQ(store.next_session(), 1);
  std::vector<double> lamb2 = {4000, 5000, 7000};
  for (int s = 0; s < 3; ++s) store.add({1, "lamb", 3, s + 1, 0, true, 1.0e6, 1.0, 0.3, "seed: 1\n", "log"});
  for (int s = 0; s < 3; ++s) store.add({2, "lamb", 3, s + 1, 0, true, lamb2[s], 2.0, 0.3, "seed: 1\n", "log"});
  store.add({2, "lamb", 3, 4, 4, false, std::nullopt, std::nullopt, std::nullopt, "seed: 4\n", "log"});
  store.add({1, "adamw", 7, 1, 0, true, 9000, 1.0, 0.3, "seed: 1\n", "log"});
  EXPECT_EQ(store.next_session(), 3);
  auto runs = store.runs();
  ASSERT_EQ(runs.size(), 8u);
  auto summary = summarize_confirm(runs);
  ASSERT_EQ(summary.size(), 2u);
  EXPECT_EQ(summary[0].optimizer, "adamw");
  EXPECT_EQ(summary[0].samples.n, 1);
  const auto& l = summary[1];
  EXPECT_EQ(l.session, 2);
  EXPECT_EQ(l.runs, 4);
  EXPECT_EQ(l.reached, 3);
  auto r = ref_stats(lamb2);
  EXPECT_NEAR(l.samples.mean, r.mean, 1e-9);
  EXPECT_NEAR(l.samples.std, r.std, 1e-9);
}

TEST(ConfirmStore, PerBatchRunsAreGroupedByOptimizerAndBatch) {
  const std::string dir = test::make_temp_dir("confirm");
  const std::string db = dir + "/study.db";
  { StudyStore store(db); }
  ConfirmStore store(db, true);
  // One session, same optimizer and seeds, two batch sizes: neither may overwrite the other.
  for (int s = 1; s <= 2; ++s) {
    ConfirmRun a{1, "lamb", 3, s, 0, true, 1000.0 * s, 1.0, 0.3, "seed: 1\n", "log"};
    a.batch = 64;
    store.add(a);
    ConfirmRun b{1, "lamb", 5, s, 0, true, 4000.0 + 1000.0 * s, 1.0, 0.3, "seed: 1\n", "log"};
    b.batch = 256;
    store.add(b);
  }
  // A later per-optimizer session re-runs batch 64 only: batch 256 keeps its session-1 summary.
  ConfirmRun c{2, "lamb", 3, 1, 0, true, 1500.0, 1.0, 0.3, "seed: 1\n", "log"};
  c.batch = 64;
  store.add(c);
  auto runs = store.runs();
  ASSERT_EQ(runs.size(), 5u);
  auto summary = summarize_confirm(runs);
  ASSERT_EQ(summary.size(), 2u);
  EXPECT_EQ(summary[0].batch, 64);
  EXPECT_EQ(summary[0].session, 2);
  EXPECT_EQ(summary[0].runs, 1);
  EXPECT_DOUBLE_EQ(summary[0].samples.mean, 1500.0);
  EXPECT_EQ(summary[1].batch, 256);
  EXPECT_EQ(summary[1].session, 1);
  EXPECT_EQ(summary[1].source_trial, 5);
  EXPECT_DOUBLE_EQ(summary[1].samples.mean, 5500.0);
  EXPECT_NEAR(summary[1].samples.std, std::sqrt(500000.0), 1e-9);
}

// A study file whose bs_confirm was written before the batch column existed: readers see batch 0, and the
// first writer rebuilds the table with the batch in the key without losing a row.
TEST(ConfirmStore, OldTableWithoutBatchIsReadAndMigratedKeepingEveryRow) {
  const std::string dir = test::make_temp_dir("confirm");
  const std::string db = dir + "/study.db";
  { StudyStore store(db); }
  {
    SQLite::Database sql(db, SQLite::OPEN_READWRITE);
    sql.exec(
        "CREATE TABLE bs_confirm (session INTEGER NOT NULL, optimizer TEXT NOT NULL, source_trial INTEGER "
        "NOT NULL, seed INTEGER NOT NULL, exit_code INTEGER NOT NULL, reached INTEGER NOT NULL, "
        "samples_to_target REAL, seconds_to_target REAL, final_mlm_accuracy REAL, config_yaml TEXT NOT NULL, "
        "log_path TEXT, PRIMARY KEY (session, optimizer, seed))");
    sql.exec(
        "INSERT INTO bs_confirm VALUES (1, 'adam', 4, 1, 0, 1, 2048, 10, 0.08, 'seed: 1', 'l1'), "
        "(1, 'adam', 4, 2, 0, 1, 4096, 20, 0.08, 'seed: 2', 'l2')");
  }
  {
    ConfirmStore ro(db, false);
    auto runs = ro.runs();
    ASSERT_EQ(runs.size(), 2u);
    EXPECT_EQ(runs[0].batch, 0);
    EXPECT_DOUBLE_EQ(*runs[1].samples_to_target, 4096);
  }
  ConfirmStore rw(db, true);
  ConfirmRun r{1, "adam", 4, 1, 0, true, 3000.0, 1.0, 0.3, "seed: 1\n", "log"};
  r.batch = 128;
  rw.add(r);
  auto runs = rw.runs();
  ASSERT_EQ(runs.size(), 3u) << "the per-batch run must not replace the old run with the same session and seed";
  EXPECT_EQ(runs[0].batch, 0);
  EXPECT_EQ(runs[0].log_path, "l1");
  EXPECT_EQ(runs[1].batch, 0);
  EXPECT_EQ(runs[1].config_yaml, "seed: 2");
  EXPECT_EQ(runs[2].batch, 128);
  SQLite::Database sql(db, SQLite::OPEN_READONLY);
  EXPECT_FALSE(sql.tableExists("bs_confirm_v1"));
}

// E(B) = E_min (1 + B / B_crit): hand-computed cases.
TEST(CriticalBatch, ExactLineRecoversEminAndBcrit) {
  // E = 1000 (1 + B / 100): 1320, 1640, 2280, 3560 at 32..256 (two seeds at 64, same value).
  auto f = fit_critical_batch({32, 64, 64, 128, 256}, {1320, 1640, 1640, 2280, 3560});
  ASSERT_EQ(f.kind, CriticalBatchFit::Kind::kFit);
  EXPECT_NEAR(f.e_min, 1000, 1e-9);
  EXPECT_NEAR(f.s_min, 10, 1e-12);
  EXPECT_NEAR(f.b_crit, 100, 1e-9);
  EXPECT_EQ(f.points, 5);
}

TEST(CriticalBatch, LeastSquaresOnNoisyPointsMatchesTheHandSolution) {
  // x = 1,2,3, y = 1,3,2: mean 2,2; Sxy = 1, Sxx = 2 -> slope 0.5, intercept 1, B_crit 2.
  auto f = fit_critical_batch({1, 2, 3}, {1, 3, 2});
  ASSERT_EQ(f.kind, CriticalBatchFit::Kind::kFit);
  EXPECT_NEAR(f.s_min, 0.5, 1e-12);
  EXPECT_NEAR(f.e_min, 1.0, 1e-12);
  EXPECT_NEAR(f.b_crit, 2.0, 1e-12);
}

TEST(CriticalBatch, DegenerateCasesSayWhichSideOfTheRange) {
  const auto one = fit_critical_batch({64, 64}, {100, 200});  // one batch size: no line, nothing defined
  EXPECT_EQ(one.kind, CriticalBatchFit::Kind::kNone);
  EXPECT_TRUE(std::isnan(one.e_min) && std::isnan(one.s_min) && std::isnan(one.b_crit));
  EXPECT_EQ(fit_critical_batch({64}, {100}).kind, CriticalBatchFit::Kind::kNone);
  // Samples proportional to batch (a fixed number of steps): step-limited everywhere.
  EXPECT_EQ(fit_critical_batch({32, 64, 128}, {3200, 6400, 12800}).kind, CriticalBatchFit::Kind::kBelowRange);
  // Samples flat or falling with batch: no limit seen.
  EXPECT_EQ(fit_critical_batch({32, 64, 128}, {5000, 5000, 4000}).kind, CriticalBatchFit::Kind::kAboveRange);
}
