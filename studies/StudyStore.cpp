#include "studies/StudyStore.h"

#include "studies/SqlValues.h"

#include "common/Errors.h"

#include <SQLiteCpp/SQLiteCpp.h>
#include <SQLiteCpp/Backup.h>
#include <SQLiteCpp/VariadicBind.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <stdexcept>

namespace bs {

namespace {
using sql::bind_opt;
using sql::opt;

const char* kSchema = R"SQL(
CREATE TABLE IF NOT EXISTS bs_study (
  name TEXT PRIMARY KEY,
  config_yaml TEXT NOT NULL,
  created REAL NOT NULL DEFAULT (strftime('%s','now'))
);
CREATE TABLE IF NOT EXISTS bs_environment (
  session INTEGER NOT NULL,
  key TEXT NOT NULL,
  value TEXT NOT NULL,
  PRIMARY KEY (session, key)
);
CREATE TABLE IF NOT EXISTS bs_trials (
  number INTEGER PRIMARY KEY,
  state TEXT NOT NULL,
  pid INTEGER,
  host TEXT,
  start_time REAL,
  end_time REAL,
  exit_code INTEGER,
  reason TEXT,
  config_yaml TEXT,
  params_json TEXT,
  trial_dir TEXT,
  reached INTEGER NOT NULL DEFAULT 0,
  samples_to_target REAL,
  seconds_to_target REAL,
  final_mlm_accuracy REAL,
  value REAL,
  values_text TEXT,
  attempt INTEGER NOT NULL DEFAULT 1,
  retry_of INTEGER NOT NULL DEFAULT -1,
  retried INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS bs_evals (
  trial INTEGER NOT NULL,
  step INTEGER NOT NULL,
  samples INTEGER NOT NULL,
  mlm_accuracy REAL,
  loss REAL,
  seconds REAL
);
CREATE INDEX IF NOT EXISTS bs_evals_trial ON bs_evals(trial);
CREATE TABLE IF NOT EXISTS bs_throughput (
  trial INTEGER NOT NULL,
  step INTEGER NOT NULL,
  samples INTEGER NOT NULL,
  samples_per_s REAL,
  tokens_per_s REAL,
  padding_waste REAL,
  imbalance REAL,
  overlap REAL,
  step_seconds REAL
);
CREATE INDEX IF NOT EXISTS bs_throughput_trial ON bs_throughput(trial);
CREATE TABLE IF NOT EXISTS bs_rank_load (
  trial INTEGER NOT NULL,
  step INTEGER NOT NULL,
  json TEXT NOT NULL
);
)SQL";

std::string values_to_text(const std::vector<double>& v) {
  std::ostringstream os;
  os.precision(17);
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  return os.str();
}
std::vector<double> values_from_text(const std::string& s) {
  std::vector<double> out;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, ',');)
    if (!p.empty()) out.push_back(std::stod(p));
  return out;
}

const char* kTrialColumns =
    "number, state, pid, host, start_time, end_time, exit_code, reason, config_yaml, params_json, trial_dir, "
    "reached, samples_to_target, seconds_to_target, final_mlm_accuracy, value, values_text, attempt, retry_of, "
    "retried";

// "state = excluded.state, ...": every column but the key, for the upsert of a running trial's row.
std::string trial_updates() {
  std::string out;
  std::stringstream ss(kTrialColumns);
  for (std::string c; std::getline(ss, c, ',');) {
    c.erase(0, c.find_first_not_of(' '));
    if (c == "number") continue;
    out += (out.empty() ? "" : ", ") + c + " = excluded." + c;
  }
  return out;
}

TrialRecord read_trial(SQLite::Statement& q) {
  TrialRecord t;
  t.number = q.getColumn(0).getInt64();
  t.state = q.getColumn(1).getString();
  t.pid = q.getColumn(2).getInt64();
  t.host = q.getColumn(3).getString();
  t.start_time = q.getColumn(4).getDouble();
  t.end_time = q.getColumn(5).getDouble();
  t.exit_code = q.getColumn(6).isNull() ? -1 : q.getColumn(6).getInt();
  t.reason = q.getColumn(7).getString();
  t.config_yaml = q.getColumn(8).getString();
  t.params_json = q.getColumn(9).getString();
  t.trial_dir = q.getColumn(10).getString();
  t.reached = q.getColumn(11).getInt() != 0;
  t.samples_to_target = opt(q.getColumn(12));
  t.seconds_to_target = opt(q.getColumn(13));
  t.final_mlm_accuracy = opt(q.getColumn(14));
  t.values = values_from_text(q.getColumn(16).getString());
  t.attempt = q.getColumn(17).getInt();
  t.retry_of = q.getColumn(18).getInt64();
  t.retried = q.getColumn(19).getInt() != 0;
  return t;
}

}  // namespace

StudyStore::StudyStore(const std::string& db_path, Mode mode) : path_(db_path), mode_(mode) {
  if (mode == Mode::kReadOnly) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(db_path, ec))
      throw std::runtime_error(db_path + ": no study database here (check the study name and --dir)");
    if (std::filesystem::file_size(db_path, ec) == 0)
      throw std::runtime_error(db_path +
                               ": the study database is empty (0 bytes), not a bertsweep study; "
                               "restore it from a backup or start a new study with `bertsweep study run`");
    // Opened immutable while no WAL exists; a controller that starts meanwhile makes the WAL appear, and then
    // a plain read-only connection (which follows the writer's WAL) is tried once more.
    for (int attempt = 0;; ++attempt) {
      const bool had_wal = std::filesystem::exists(db_path + "-wal", ec);
      try {
        db_ = open_read_only(db_path);
        if (!has_table("bs_study") || !has_table("bs_trials"))
          throw std::runtime_error(db_path +
                                   ": a SQLite file without bertsweep's bs_study/bs_trials tables, "
                                   "not a bertsweep study");
        break;
      } catch (const SQLite::Exception& e) {
        db_.reset();
        if (attempt == 0 && !had_wal && std::filesystem::exists(db_path + "-wal", ec)) continue;
        throw std::runtime_error(db_path + ": cannot read the study database: " + e.what() +
                                 " (a damaged or foreign file, or one being rewritten: if a study is running, "
                                 "try again)");
      }
    }
    return;
  }
  try {
    db_ = std::make_unique<SQLite::Database>(db_path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE,
                                             /*busy timeout ms=*/30000);
    // WAL: readers (optuna CLI, status) never block the controller's writes; the mode is kept in the file.
    db_->exec("PRAGMA journal_mode=WAL");
    db_->exec("PRAGMA synchronous=NORMAL");
    SQLite::Transaction tx(*db_);
    db_->exec(kSchema);
    tx.commit();
  } catch (const SQLite::Exception& e) {
    throw std::runtime_error(db_path + ": cannot open the study database: " + e.what() +
                             " (check that the folder exists and is writable)");
  }
}

std::unique_ptr<SQLite::Database> StudyStore::open_read_only(const std::string& db_path) {
  std::error_code ec;
  if (std::filesystem::exists(db_path + "-wal", ec))
    return std::make_unique<SQLite::Database>(db_path, SQLite::OPEN_READONLY, /*busy timeout ms=*/30000);
  // file: URI of the absolute path, every byte outside the unreserved set percent-encoded.
  const std::string abs = std::filesystem::absolute(db_path, ec).string();
  std::string uri = "file:";
  for (unsigned char c : abs) {
    if (std::isalnum(c) || c == '/' || c == '.' || c == '_' || c == '-' || c == '~') {
      uri += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      uri += buf;
    }
  }
  uri += "?immutable=1";
  return std::make_unique<SQLite::Database>(uri, SQLite::OPEN_READONLY | SQLite::OPEN_URI, /*busy timeout ms=*/30000);
}

std::string StudyStore::backup(const std::string& db_path, int keep) {
  namespace fs = std::filesystem;
  const std::string bak = db_path + ".bak", tmp = db_path + ".bak.tmp";
  std::error_code ec;
  fs::remove(tmp, ec);
  try {
    auto src = open_read_only(db_path);
    {
      SQLite::Database dst(tmp, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
      SQLite::Backup copy(dst, *src);
      copy.executeStep(-1);
    }
  } catch (const SQLite::Exception& e) {
    fs::remove(tmp, ec);
    throw std::runtime_error(db_path + ": cannot copy the study database to " + bak + " before writing to it (" +
                             e.what() + "); nothing was written (check free space and that the folder is writable)");
  }
  // .bak.(keep-2) -> .bak.(keep-1), ..., .bak -> .bak.1, then the new copy becomes .bak.
  for (int i = keep - 1; i >= 1; --i) {
    const std::string from = i == 1 ? bak : bak + "." + std::to_string(i - 1);
    if (fs::exists(from, ec)) fs::rename(from, bak + "." + std::to_string(i), ec);
  }
  fs::rename(tmp, bak);
  return bak;
}

bool StudyStore::has_table(const std::string& table) const {
  SQLite::Statement q(*db_, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?");
  q.bind(1, table);
  return q.executeStep();
}

StudyStore::~StudyStore() = default;

void StudyStore::save_study(const std::string& name, const std::string& config_yaml) {
  SQLite::Statement s(*db_,
                      "INSERT INTO bs_study(name, config_yaml) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET "
                      "config_yaml = excluded.config_yaml WHERE config_yaml IS NOT excluded.config_yaml");
  s.bind(1, name);
  s.bind(2, config_yaml);
  s.exec();
}

std::optional<std::string> StudyStore::study_config(const std::string& name) const {
  SQLite::Statement q(*db_, "SELECT config_yaml FROM bs_study WHERE name = ?");
  q.bind(1, name);
  if (q.executeStep()) return q.getColumn(0).getString();
  return std::nullopt;
}

std::vector<std::string> StudyStore::study_names() const {
  SQLite::Statement q(*db_, "SELECT name FROM bs_study ORDER BY name");
  std::vector<std::string> out;
  while (q.executeStep()) out.push_back(q.getColumn(0).getString());
  return out;
}

int64_t StudyStore::record_environment(const std::map<std::string, std::string>& facts) {
  SQLite::Transaction tx(*db_);
  SQLite::Statement q(*db_, "SELECT COALESCE(MAX(session), 0) + 1 FROM bs_environment");
  q.executeStep();
  int64_t session = q.getColumn(0).getInt64();
  SQLite::Statement s(*db_, "INSERT INTO bs_environment(session, key, value) VALUES (?, ?, ?)");
  for (const auto& kv : facts) {
    s.bind(1, session);
    s.bind(2, kv.first);
    s.bind(3, kv.second);
    s.exec();
    s.reset();
  }
  tx.commit();
  return session;
}

std::map<std::string, std::string> StudyStore::environment(int64_t session) const {
  if (!has_table("bs_environment")) return {};
  if (session < 0) {
    SQLite::Statement q(*db_, "SELECT COALESCE(MAX(session), 0) FROM bs_environment");
    q.executeStep();
    session = q.getColumn(0).getInt64();
  }
  SQLite::Statement q(*db_, "SELECT key, value FROM bs_environment WHERE session = ?");
  q.bind(1, session);
  std::map<std::string, std::string> out;
  while (q.executeStep()) out[q.getColumn(0).getString()] = q.getColumn(1).getString();
  return out;
}

namespace {

void bind_trial(SQLite::Statement& s, const TrialRecord& t) {
  s.bind(1, t.number);
  s.bind(2, t.state);
  s.bind(3, t.pid);
  s.bind(4, t.host);
  s.bind(5, t.start_time);
  s.bind(6, t.end_time);
  if (t.exit_code >= 0) s.bind(7, t.exit_code);
  else
    s.bind(7);
  s.bind(8, t.reason);
  s.bind(9, t.config_yaml);
  s.bind(10, t.params_json);
  s.bind(11, t.trial_dir);
  s.bind(12, t.reached ? 1 : 0);
  bind_opt(s, 13, t.samples_to_target);
  bind_opt(s, 14, t.seconds_to_target);
  bind_opt(s, 15, t.final_mlm_accuracy);
  if (!t.values.empty()) s.bind(16, t.values[0]);
  else
    s.bind(16);
  s.bind(17, values_to_text(t.values));
  s.bind(18, t.attempt);
  s.bind(19, t.retry_of);
  s.bind(20, t.retried ? 1 : 0);
}

}  // namespace

void StudyStore::insert_trial(const TrialRecord& t) {
  if (auto row = trial(t.number))
    throw StudyError(path_ + ": trial " + std::to_string(t.number) + " is already stored (" + row->state +
                     "); bertsweep never overwrites a stored trial (Optuna and bs_trials disagree: see "
                     "`bertsweep study status`)");
  SQLite::Statement s(*db_, std::string("INSERT INTO bs_trials(") + kTrialColumns +
                                ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  bind_trial(s, t);
  s.exec();
}

void StudyStore::update_trial(const TrialRecord& t) {
  // Only a RUNNING row is rewritten; the WHERE makes that hold in the one statement.
  SQLite::Statement s(*db_,
                      std::string("INSERT INTO bs_trials(") + kTrialColumns +
                          ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(number) DO UPDATE SET " +
                          trial_updates() + " WHERE bs_trials.state = 'RUNNING'");
  bind_trial(s, t);
  if (s.exec() == 0) {
    auto row = trial(t.number);
    throw StudyError(path_ + ": trial " + std::to_string(t.number) + " is already " +
                     (row ? row->state : std::string("stored")) +
                     "; bertsweep never overwrites a finished trial (this " + t.state + " result was not written)");
  }
}

void StudyStore::mark_retried(int64_t number) {
  SQLite::Statement s(*db_, "UPDATE bs_trials SET retried = 1 WHERE number = ?");
  s.bind(1, number);
  s.exec();
}

std::optional<TrialRecord> StudyStore::trial(int64_t number) const {
  SQLite::Statement q(*db_, std::string("SELECT ") + kTrialColumns + " FROM bs_trials WHERE number = ?");
  q.bind(1, number);
  if (q.executeStep()) return read_trial(q);
  return std::nullopt;
}

std::vector<TrialRecord> StudyStore::trials() const {
  SQLite::Statement q(*db_, std::string("SELECT ") + kTrialColumns + " FROM bs_trials ORDER BY number");
  std::vector<TrialRecord> out;
  while (q.executeStep()) out.push_back(read_trial(q));
  return out;
}

std::vector<TrialRecord> StudyStore::trials_in_state(const std::string& state) const {
  SQLite::Statement q(*db_, std::string("SELECT ") + kTrialColumns + " FROM bs_trials WHERE state = ? ORDER BY number");
  q.bind(1, state);
  std::vector<TrialRecord> out;
  while (q.executeStep()) out.push_back(read_trial(q));
  return out;
}

void StudyStore::add_eval(const EvalPoint& e) {
  SQLite::Statement s(*db_,
                      "INSERT INTO bs_evals(trial, step, samples, mlm_accuracy, loss, seconds) VALUES (?,?,?,?,?,?)");
  SQLite::bind(s, e.trial, e.step, e.samples, e.mlm_accuracy, e.loss, e.seconds);
  s.exec();
}

void StudyStore::add_throughput(const ThroughputPoint& p) {
  SQLite::Statement s(*db_,
                      "INSERT INTO bs_throughput(trial, step, samples, samples_per_s, tokens_per_s, padding_waste, "
                      "imbalance, overlap, step_seconds) VALUES (?,?,?,?,?,?,?,?,?)");
  SQLite::bind(s, p.trial, p.step, p.samples, p.samples_per_s, p.tokens_per_s, p.padding_waste, p.imbalance, p.overlap,
               p.step_seconds);
  s.exec();
}

void StudyStore::add_rank_load(const RankLoadPoint& p) {
  SQLite::Statement s(*db_, "INSERT INTO bs_rank_load(trial, step, json) VALUES (?,?,?)");
  SQLite::bind(s, p.trial, p.step, p.json);
  s.exec();
}

std::vector<EvalPoint> StudyStore::evals(int64_t trial) const {
  if (read_only() && !has_table("bs_evals")) return {};
  SQLite::Statement q(*db_, trial < 0 ? "SELECT trial, step, samples, mlm_accuracy, loss, seconds FROM bs_evals "
                                        "ORDER BY trial, samples"
                                      : "SELECT trial, step, samples, mlm_accuracy, loss, seconds FROM bs_evals "
                                        "WHERE trial = ? ORDER BY samples");
  if (trial >= 0) q.bind(1, trial);
  std::vector<EvalPoint> out;
  while (q.executeStep())
    out.push_back({q.getColumn(0).getInt64(), q.getColumn(1).getInt64(), q.getColumn(2).getInt64(),
                   q.getColumn(3).getDouble(), q.getColumn(4).getDouble(), q.getColumn(5).getDouble()});
  return out;
}

std::vector<ThroughputPoint> StudyStore::throughput(int64_t trial) const {
  if (read_only() && !has_table("bs_throughput")) return {};
  std::string sql =
      "SELECT trial, step, samples, samples_per_s, tokens_per_s, padding_waste, imbalance, overlap, step_seconds "
      "FROM bs_throughput";
  sql += trial < 0 ? " ORDER BY trial, samples" : " WHERE trial = ? ORDER BY samples";
  SQLite::Statement q(*db_, sql);
  if (trial >= 0) q.bind(1, trial);
  std::vector<ThroughputPoint> out;
  while (q.executeStep()) {
    ThroughputPoint p;
    p.trial = q.getColumn(0).getInt64();
    p.step = q.getColumn(1).getInt64();
    p.samples = q.getColumn(2).getInt64();
    p.samples_per_s = q.getColumn(3).getDouble();
    p.tokens_per_s = q.getColumn(4).getDouble();
    p.padding_waste = q.getColumn(5).getDouble();
    p.imbalance = q.getColumn(6).getDouble();
    p.overlap = q.getColumn(7).getDouble();
    p.step_seconds = q.getColumn(8).getDouble();
    out.push_back(p);
  }
  return out;
}

std::vector<RankLoadPoint> StudyStore::rank_load(int64_t trial) const {
  if (read_only() && !has_table("bs_rank_load")) return {};
  SQLite::Statement q(*db_, trial < 0 ? "SELECT trial, step, json FROM bs_rank_load ORDER BY trial, step"
                                      : "SELECT trial, step, json FROM bs_rank_load WHERE trial = ? ORDER BY step");
  if (trial >= 0) q.bind(1, trial);
  std::vector<RankLoadPoint> out;
  while (q.executeStep())
    out.push_back({q.getColumn(0).getInt64(), q.getColumn(1).getInt64(), q.getColumn(2).getString()});
  return out;
}

}  // namespace bs
