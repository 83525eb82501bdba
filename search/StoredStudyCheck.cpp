#include "search/StoredStudyCheck.h"

#include <SQLiteCpp/SQLiteCpp.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <vector>

#include "common/Errors.h"
#include "search/StudyConfig.h"
#include "studies/StudyStore.h"

namespace bs::search {

namespace fs = std::filesystem;

namespace {

struct OptunaSide {
  bool has_tables = false;
  bool found = false;
  std::vector<std::string> other_names;  // the studies the file does hold
  std::vector<std::string> directions;   // lower case, by objective
  struct Trial {
    std::string state;
    std::map<int, double> values;  // by objective
  };
  std::map<int64_t, Trial> trials;  // by number
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Optuna's schema (optuna/storages/_rdb/models.py): studies, study_directions, trials, trial_values.
OptunaSide read_optuna_side(SQLite::Database& db, const std::string& name) {
  OptunaSide o;
  o.has_tables = db.tableExists("studies") && db.tableExists("trials") && db.tableExists("study_directions");
  if (!o.has_tables) return o;
  int64_t study_id = -1;
  {
    SQLite::Statement q(db, "SELECT study_id, study_name FROM studies ORDER BY study_id");
    while (q.executeStep()) {
      if (q.getColumn(1).getString() == name) study_id = q.getColumn(0).getInt64();
      else
        o.other_names.push_back(q.getColumn(1).getString());
    }
  }
  if (study_id < 0) return o;
  o.found = true;
  {
    SQLite::Statement q(db, "SELECT direction FROM study_directions WHERE study_id = ? ORDER BY objective");
    q.bind(1, study_id);
    while (q.executeStep()) o.directions.push_back(lower(q.getColumn(0).getString()));
  }
  std::map<int64_t, int64_t> number_of;  // trial_id -> number
  {
    SQLite::Statement q(db, "SELECT trial_id, number, state FROM trials WHERE study_id = ?");
    q.bind(1, study_id);
    while (q.executeStep()) {
      const int64_t number = q.getColumn(1).isNull() ? -1 : q.getColumn(1).getInt64();
      number_of[q.getColumn(0).getInt64()] = number;
      o.trials[number].state = q.getColumn(2).getString();
    }
  }
  if (db.tableExists("trial_values")) {
    SQLite::Statement q(db,
                        "SELECT v.trial_id, v.objective, v.value FROM trial_values v JOIN trials t "
                        "ON t.trial_id = v.trial_id WHERE t.study_id = ?");
    q.bind(1, study_id);
    while (q.executeStep()) {
      auto it = number_of.find(q.getColumn(0).getInt64());
      if (it == number_of.end() || q.getColumn(2).isNull()) continue;
      o.trials[it->second].values[q.getColumn(1).getInt()] = q.getColumn(2).getDouble();
    }
  }
  return o;
}

bool finished(const std::string& state) {
  return state == trial_state::kComplete || state == trial_state::kPruned || state == trial_state::kFail;
}

bool same_value(double a, double b) {
  return a == b || std::fabs(a - b) <= 1e-12 * std::max(std::fabs(a), std::fabs(b));
}

// What disagrees, one line each (empty: they agree).
std::vector<std::string> disagreements(const std::vector<TrialRecord>& rows, const OptunaSide& o,
                                       const StudyConfig& config) {
  std::vector<std::string> out;
  if (!o.has_tables) {
    if (!rows.empty())
      out.push_back("Optuna's tables (studies, trials) are missing, but bs_trials holds " +
                    std::to_string(rows.size()) + " trial(s)");
    return out;
  }
  if (!o.found) {
    bool optuna_has_trials = !o.other_names.empty();
    if (!rows.empty() || optuna_has_trials) {
      std::string others;
      for (const auto& n : o.other_names) others += (others.empty() ? "'" : ", '") + n + "'";
      out.push_back("Optuna holds no study named '" + config.name + "'" +
                    (others.empty() ? std::string() : " (it holds " + others + ": renamed or made by another tool?)") +
                    ", but bs_trials holds " + std::to_string(rows.size()) + " trial(s) of it");
    }
    return out;
  }
  if (o.directions != config.directions) {
    std::string got;
    for (const auto& d : o.directions) got += (got.empty() ? "" : ",") + d;
    std::string want;
    for (const auto& d : config.directions) want += (want.empty() ? "" : ",") + d;
    out.push_back("Optuna's study direction is " + (got.empty() ? std::string("missing") : got) +
                  ", the study config's is " + want);
  }
  std::map<int64_t, const TrialRecord*> by_number;
  for (const auto& r : rows) by_number[r.number] = &r;
  for (const auto& r : rows) {
    auto it = o.trials.find(r.number);
    const std::string n = "trial " + std::to_string(r.number);
    if (it == o.trials.end()) {
      out.push_back(n + " is " + r.state + " in bs_trials but not in Optuna's study");
      continue;
    }
    const auto& ot = it->second;
    if (!finished(r.state) || ot.state == trial_state::kRunning) continue;  // a lost second write: recovered
    if (ot.state != r.state) {
      out.push_back(n + " is " + r.state + " in bs_trials but " + ot.state + " in Optuna's study");
      continue;
    }
    if (r.state == trial_state::kComplete) {
      bool same = ot.values.size() == r.values.size();
      for (size_t i = 0; same && i < r.values.size(); ++i) {
        auto v = ot.values.find(static_cast<int>(i));
        same = v != ot.values.end() && same_value(v->second, r.values[i]);
      }
      if (!same) out.push_back(n + ": its objective value in Optuna's study differs from bs_trials'");
    }
  }
  for (const auto& kv : o.trials) {
    if (by_number.count(kv.first)) continue;
    const std::string& s = kv.second.state;
    if (s == trial_state::kRunning || s == trial_state::kFail || s == "WAITING") continue;
    out.push_back("trial " + std::to_string(kv.first) + " is " + s + " in Optuna's study but has no bs_trials row");
  }
  return out;
}

}  // namespace

std::string damaged_study_help(const std::string& db_path) {
  std::string help = "restore the last copy taken before a run (" + db_path + ".bak";
  if (fs::exists(db_path + ".bak.1")) help += ", older ones " + db_path + ".bak.1...";
  return help + ") with `cp " + db_path + ".bak " + db_path + "`, or rebuild what SQLite can read with `sqlite3 " +
         db_path + " .recover | sqlite3 recovered.db`";
}

void check_stored_study_agrees(const std::string& db_path, const StudyConfig& config, const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(db_path, ec)) return;
  StudyStore store(db_path, StudyStore::Mode::kReadOnly);  // throws for a file that holds no bertsweep study
  std::vector<TrialRecord> rows;
  OptunaSide optuna;
  try {
    if (auto stored = store.study_config(config.name)) {
      const StudyConfig old =
          StudyConfig::from_yaml(yaml::load_stored(*stored, db_path + " (bs_study, study '" + config.name + "')"),
                                 db_path + " (stored study config)");
      if (old.identity() != config.identity())
        throw ConfigError(config.source + ": study '" + config.name + "' already exists in " + dir +
                          " with a different search (objective, sampler, pruner, seed, base or space differ); "
                          "give a new --name, or run `bertsweep study resume " +
                          config.name + "` to continue it");
    }
    rows = store.trials();
    auto db = StudyStore::open_read_only(db_path);
    optuna = read_optuna_side(*db, config.name);
  } catch (const SQLite::Exception& e) {
    throw StudyError(db_path + ": cannot read the study database (" + e.what() + "); nothing was written; " +
                     damaged_study_help(db_path));
  }
  const auto what = disagreements(rows, optuna, config);
  if (what.empty()) return;
  std::ostringstream os;
  os << db_path << ": Optuna's study and bertsweep's tables in this file do not describe the same study, so "
     << "continuing would renumber trials over finished results; nothing was written:";
  const size_t shown = std::min<size_t>(what.size(), 5);
  for (size_t i = 0; i < shown; ++i) os << "\n  - " << what[i];
  if (what.size() > shown) os << "\n  - ... and " << (what.size() - shown) << " more";
  os << "\nIf the file was edited by hand or by Optuna's API (e.g. a renamed study), undo that edit, or "
     << damaged_study_help(db_path) << "; or start a new study with another --name";
  throw StudyError(os.str());
}

}  // namespace bs::search
