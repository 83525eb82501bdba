// The study store on a real SQLite file: rows written are read back after reopening, WAL mode is on.
#include <gtest/gtest.h>

#include <SQLiteCpp/SQLiteCpp.h>

#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "common/Errors.h"
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

namespace {
std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
}  // namespace

// Read-only opening (status, export, report, refused commands) never creates, migrates or writes: a missing
// file stays missing, a 0-byte file stays 0 bytes, a foreign SQLite file keeps its bytes.
TEST(StudyStore, ReadOnlyOpeningNeverCreatesOrWrites) {
  const std::string dir = test::make_temp_dir("store-ro");
  EXPECT_THROW(StudyStore(dir + "/missing.db", StudyStore::Mode::kReadOnly), std::runtime_error);
  EXPECT_FALSE(std::filesystem::exists(dir + "/missing.db"));

  std::ofstream(dir + "/empty.db").close();
  try {
    StudyStore s(dir + "/empty.db", StudyStore::Mode::kReadOnly);
    ADD_FAILURE() << "a 0-byte file was opened as a study";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("0 bytes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::filesystem::file_size(dir + "/empty.db"), 0u);

  {
    SQLite::Database other(dir + "/other.db", SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    other.exec("CREATE TABLE notes(x TEXT); INSERT INTO notes VALUES ('mine')");
  }
  const std::string other_bytes = file_bytes(dir + "/other.db");
  try {
    StudyStore s(dir + "/other.db", StudyStore::Mode::kReadOnly);
    ADD_FAILURE() << "a foreign SQLite file was opened as a study";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not a bertsweep study"), std::string::npos) << e.what();
  }
  EXPECT_EQ(file_bytes(dir + "/other.db"), other_bytes);

  // A real study read back read-only; writing through it fails instead of changing the file.
  {
    StudyStore s(dir + "/study.db");
    s.save_study("demo", "name: demo\n");
  }
  const std::string study_bytes = file_bytes(dir + "/study.db");
  {
    StudyStore s(dir + "/study.db", StudyStore::Mode::kReadOnly);
    EXPECT_EQ(s.study_config("demo").value_or(""), "name: demo\n");
    EXPECT_TRUE(s.rank_load().empty());
    EXPECT_ANY_THROW(s.save_study("demo", "name: changed\n"));
  }
  EXPECT_EQ(file_bytes(dir + "/study.db"), study_bytes);
  std::filesystem::remove_all(dir);
}

// Saving the same study again (what `study run`/`resume` do) keeps the row's creation time.
TEST(StudyStore, SavingTheStudyAgainKeepsItsCreationTime) {
  const std::string db = test::make_temp_dir("store-created") + "/study.db";
  StudyStore s(db);
  s.save_study("demo", "name: demo\n");
  {
    SQLite::Database raw(db, SQLite::OPEN_READWRITE);
    raw.exec("UPDATE bs_study SET created = 1000 WHERE name = 'demo'");
  }
  s.save_study("demo", "name: demo\n");
  s.save_study("demo", "name: demo\nn_trials: 3\n");
  SQLite::Database raw(db, SQLite::OPEN_READONLY);
  SQLite::Statement q(raw, "SELECT created, config_yaml FROM bs_study WHERE name = 'demo'");
  ASSERT_TRUE(q.executeStep());
  EXPECT_EQ(q.getColumn(0).getDouble(), 1000.0);
  EXPECT_EQ(q.getColumn(1).getString(), "name: demo\nn_trials: 3\n");
}

// A stored result is never overwritten: a new row under a taken number and a rewrite of a finished row are
// refused (StudyError, exit 7) and leave the stored row as it was; a RUNNING row is rewritten.
TEST(StudyStore, FinishedTrialRowsAreNeverOverwritten) {
  std::string db = test::make_temp_dir("store-keep") + "/study.db";
  StudyStore s(db);
  TrialRecord t;
  t.number = 0;
  t.config_yaml = "optimizer: {name: lamb}\n";
  s.insert_trial(t);
  t.state = trial_state::kComplete;
  t.values = {512};
  s.update_trial(t);  // RUNNING -> COMPLETE
  TrialRecord other;
  other.number = 0;
  other.config_yaml = "optimizer: {name: adam}\n";
  try {
    s.insert_trial(other);
    ADD_FAILURE() << "a taken number was inserted again";
  } catch (const StudyError& e) {
    EXPECT_NE(std::string(e.what()).find("trial 0 is already stored (COMPLETE)"), std::string::npos) << e.what();
  }
  for (const char* state : {trial_state::kRunning, trial_state::kFail, trial_state::kComplete}) {
    other.state = state;
    try {
      s.update_trial(other);
      ADD_FAILURE() << "a COMPLETE row was overwritten by a " << state << " one";
    } catch (const StudyError& e) {
      EXPECT_NE(std::string(e.what()).find("trial 0 is already COMPLETE"), std::string::npos) << e.what();
    }
  }
  auto kept = s.trial(0).value();
  EXPECT_EQ(kept.state, trial_state::kComplete);
  EXPECT_EQ(kept.values, std::vector<double>{512});
  EXPECT_EQ(kept.config_yaml, "optimizer: {name: lamb}\n");
  TrialRecord fresh;  // update_trial of a row not there yet (a dead controller's trial) inserts it
  fresh.number = 7;
  fresh.state = trial_state::kFail;
  s.update_trial(fresh);
  EXPECT_EQ(s.trial(7).value().state, trial_state::kFail);
}

// The backup is a readable copy taken with SQLite's backup API; older copies rotate to .bak.1, .bak.2 and
// the oldest beyond `keep` is dropped. The copy restores a study that is then damaged.
TEST(StudyStore, BackupRotatesAndRestoresADamagedStudy) {
  std::string dir = test::make_temp_dir("store-backup"), db = dir + "/study.db";
  {
    StudyStore s(db);
    s.save_study("demo", "name: demo\n");
    for (int i = 0; i < 4; ++i) {
      TrialRecord t;
      t.number = i;
      s.insert_trial(t);
      EXPECT_EQ(StudyStore::backup(db, 3), db + ".bak");
    }
  }
  EXPECT_FALSE(std::filesystem::exists(db + ".bak.tmp"));
  EXPECT_FALSE(std::filesystem::exists(db + ".bak.3"));
  // .bak has the 4 rows of the last copy, .bak.1 three, .bak.2 two.
  for (auto [file, rows] : {std::pair<std::string, size_t>{db + ".bak", 4}, {db + ".bak.1", 3}, {db + ".bak.2", 2}})
    EXPECT_EQ(StudyStore(file, StudyStore::Mode::kReadOnly).trials().size(), rows) << file;
  {
    std::ofstream damage(db, std::ios::binary | std::ios::in | std::ios::out);
    damage.seekp(0);
    damage << "garbage, not a SQLite header";
  }
  std::filesystem::remove(db + "-wal");
  std::filesystem::remove(db + "-shm");
  EXPECT_THROW(StudyStore(db, StudyStore::Mode::kReadOnly), std::runtime_error);
  std::filesystem::copy_file(db + ".bak", db, std::filesystem::copy_options::overwrite_existing);
  StudyStore restored(db, StudyStore::Mode::kReadOnly);
  EXPECT_EQ(restored.trials().size(), 4u);
  EXPECT_EQ(restored.study_config("demo").value(), "name: demo\n");
}
