// The study store on a real SQLite file: rows written are read back after reopening, WAL mode is on.
#include <gtest/gtest.h>

#include <SQLiteCpp/SQLiteCpp.h>

#include "TestUtil.h"
#include "studies/StudyStore.h"

using namespace bs;

TEST(StudyStore, TrialsCurvesAndEnvironmentSurviveReopening) {
  std::string db = test::make_temp_dir("store") + "/study.db";
  {
    StudyStore s(db);
    s.save_study("demo", "name: demo\n");
    EXPECT_EQ(s.record_environment({{"host", "h1"}, {"cores", "2"}}), 1);
    EXPECT_EQ(s.record_environment({{"host", "h2"}}), 2);
    TrialRecord t;
    t.number = 3;
    t.pid = 1234;
    t.config_yaml = "optimizer: {name: lamb}\n";
    s.insert_trial(t);
    t.state = trial_state::kComplete;
    t.reached = true;
    t.samples_to_target = 4096;
    t.values = {4096, 64};
    t.exit_code = 0;
    s.update_trial(t);
    TrialRecord f;
    f.number = 4;
    f.state = trial_state::kFail;
    f.reason = "exit 4 (NaN/inf loss)";
    f.exit_code = 4;
    s.insert_trial(f);
    s.mark_retried(4);
    for (int i = 1; i <= 3; ++i) s.add_eval({3, i * 10, i * 320, 0.1 * i, 7.0 - i, 1.5 * i});
    s.add_throughput({3, 10, 320, 100.5, 12000, 0.25, 1.1, 0.6, 0.3});
    s.add_rank_load({3, 10, "{\"event\":\"rank_load\",\"tokens\":[1,2]}"});
  }
  StudyStore s(db);
  EXPECT_EQ(s.study_config("demo").value(), "name: demo\n");
  EXPECT_FALSE(s.study_config("other").has_value());
  EXPECT_EQ(s.environment().at("host"), "h2");
  EXPECT_EQ(s.environment(1).at("cores"), "2");
  auto trials = s.trials();
  ASSERT_EQ(trials.size(), 2u);
  EXPECT_EQ(trials[0].state, "COMPLETE");
  EXPECT_EQ(trials[0].values, (std::vector<double>{4096, 64}));
  EXPECT_EQ(trials[0].samples_to_target.value(), 4096);
  EXPECT_FALSE(trials[0].seconds_to_target.has_value());
  EXPECT_EQ(trials[0].pid, 1234);
  EXPECT_EQ(trials[0].config_yaml, "optimizer: {name: lamb}\n");
  EXPECT_TRUE(trials[1].retried);
  EXPECT_EQ(trials[1].exit_code, 4);
  EXPECT_EQ(s.trials_in_state("FAIL").size(), 1u);
  auto ev = s.evals(3);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_DOUBLE_EQ(ev[2].mlm_accuracy, 0.1 * 3);
  EXPECT_EQ(ev[2].samples, 960);
  EXPECT_EQ(s.evals(4).size(), 0u);
  EXPECT_DOUBLE_EQ(s.throughput(3).at(0).imbalance, 1.1);
  EXPECT_EQ(s.rank_load().at(0).json, "{\"event\":\"rank_load\",\"tokens\":[1,2]}");

  SQLite::Database raw(db, SQLite::OPEN_READONLY);
  EXPECT_EQ(raw.execAndGet("PRAGMA journal_mode").getString(), "wal");
  EXPECT_EQ(raw.execAndGet("SELECT COUNT(*) FROM bs_evals").getInt(), 3);
}

TEST(StudyStore, UnwritablePathIsAClearError) {
  try {
    StudyStore s("/nonexistent-dir/x/study.db");
    FAIL() << "opened a database in a missing folder";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x/study.db"), std::string::npos);
  }
}
