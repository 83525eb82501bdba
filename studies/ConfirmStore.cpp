#include "studies/ConfirmStore.h"

#include "studies/SqlValues.h"
#include "studies/StudyStore.h"

#include <SQLiteCpp/SQLiteCpp.h>

#include <stdexcept>

namespace bs {

namespace {
using sql::bind_opt;
using sql::opt;

const char* kSchema = R"SQL(
CREATE TABLE IF NOT EXISTS bs_confirm (
  session INTEGER NOT NULL,
  optimizer TEXT NOT NULL,
  source_trial INTEGER NOT NULL,
  seed INTEGER NOT NULL,
  exit_code INTEGER NOT NULL,
  reached INTEGER NOT NULL,
  samples_to_target REAL,
  seconds_to_target REAL,
  final_mlm_accuracy REAL,
  config_yaml TEXT NOT NULL,
  log_path TEXT,
  batch INTEGER NOT NULL DEFAULT 0,
  reason TEXT,
  PRIMARY KEY (session, optimizer, batch, seed)
);
)SQL";

bool has_column(SQLite::Database& db, const char* table, const char* column) {
  SQLite::Statement q(db, std::string("PRAGMA table_info(") + table + ")");
  while (q.executeStep())
    if (q.getColumn(1).getString() == column) return true;
  return false;
}

// Tables made before confirm runs recorded their batch have the key (session, optimizer, seed): a per-batch
// session would overwrite its own runs there, so the table is rebuilt with the batch in the key, all rows
// kept (batch 0), in one transaction.
void migrate_add_batch(SQLite::Database& db) {
  SQLite::Transaction tx(db);
  db.exec("ALTER TABLE bs_confirm RENAME TO bs_confirm_v1");
  db.exec(kSchema);
  db.exec(
      "INSERT INTO bs_confirm(session, optimizer, source_trial, seed, exit_code, reached, samples_to_target, "
      "seconds_to_target, final_mlm_accuracy, config_yaml, log_path, batch) SELECT session, optimizer, "
      "source_trial, seed, exit_code, reached, samples_to_target, seconds_to_target, final_mlm_accuracy, "
      "config_yaml, log_path, 0 FROM bs_confirm_v1");
  db.exec("DROP TABLE bs_confirm_v1");
  tx.commit();
}

}  // namespace

ConfirmStore::ConfirmStore(const std::string& db_path, bool writable) {
  try {
    db_ = writable ? std::make_unique<SQLite::Database>(db_path, SQLite::OPEN_READWRITE, /*busy timeout ms=*/30000)
                   : StudyStore::open_read_only(db_path);
    if (writable) {
      if (db_->tableExists("bs_confirm") && !has_column(*db_, "bs_confirm", "batch")) migrate_add_batch(*db_);
      db_->exec(kSchema);
      // Tables made before runs could be stopped by the confirm's limits: the reason column is added (NULL).
      if (!has_column(*db_, "bs_confirm", "reason")) db_->exec("ALTER TABLE bs_confirm ADD COLUMN reason TEXT");
      has_table_ = true;
    } else {
      has_table_ = db_->tableExists("bs_confirm");
    }
    has_batch_ = has_table_ && has_column(*db_, "bs_confirm", "batch");
    has_reason_ = has_table_ && has_column(*db_, "bs_confirm", "reason");
  } catch (const SQLite::Exception& e) {
    throw std::runtime_error(db_path + ": cannot open the study database for the confirm table: " + e.what());
  }
}

ConfirmStore::~ConfirmStore() = default;

int64_t ConfirmStore::next_session() const {
  if (!has_table_) return 1;
  SQLite::Statement q(*db_, "SELECT COALESCE(MAX(session), 0) + 1 FROM bs_confirm");
  q.executeStep();
  return q.getColumn(0).getInt64();
}

void ConfirmStore::add(const ConfirmRun& r) {
  if (!has_table_) throw std::logic_error("ConfirmStore::add on a read-only store");
  SQLite::Statement s(*db_,
                      "INSERT OR REPLACE INTO bs_confirm(session, optimizer, source_trial, seed, exit_code, reached, "
                      "samples_to_target, seconds_to_target, final_mlm_accuracy, config_yaml, log_path, batch, reason) "
                      "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)");
  s.bind(1, r.session);
  s.bind(2, r.optimizer);
  s.bind(3, r.source_trial);
  s.bind(4, r.seed);
  s.bind(5, r.exit_code);
  s.bind(6, r.reached ? 1 : 0);
  bind_opt(s, 7, r.samples_to_target);
  bind_opt(s, 8, r.seconds_to_target);
  bind_opt(s, 9, r.final_mlm_accuracy);
  s.bind(10, r.config_yaml);
  s.bind(11, r.log_path);
  s.bind(12, r.batch);
  if (r.reason.empty()) s.bind(13);
  else
    s.bind(13, r.reason);
  s.exec();
}

std::vector<ConfirmRun> ConfirmStore::runs() const {
  std::vector<ConfirmRun> out;
  if (!has_table_) return out;
  SQLite::Statement q(*db_,
                      std::string("SELECT session, optimizer, source_trial, seed, exit_code, reached, "
                                  "samples_to_target, seconds_to_target, final_mlm_accuracy, config_yaml, log_path, ") +
                          (has_batch_ ? "batch" : "0") + ", " + (has_reason_ ? "reason" : "NULL") +
                          " FROM bs_confirm ORDER BY session, optimizer, 12, seed");
  while (q.executeStep()) {
    ConfirmRun r;
    r.session = q.getColumn(0).getInt64();
    r.optimizer = q.getColumn(1).getString();
    r.source_trial = q.getColumn(2).getInt64();
    r.seed = q.getColumn(3).getInt64();
    r.exit_code = q.getColumn(4).getInt();
    r.reached = q.getColumn(5).getInt() != 0;
    r.samples_to_target = opt(q.getColumn(6));
    r.seconds_to_target = opt(q.getColumn(7));
    r.final_mlm_accuracy = opt(q.getColumn(8));
    r.config_yaml = q.getColumn(9).getString();
    r.log_path = q.getColumn(10).getString();
    r.batch = q.getColumn(11).getInt64();
    r.reason = q.getColumn(12).isNull() ? "" : q.getColumn(12).getString();
    out.push_back(r);
  }
  return out;
}

}  // namespace bs
