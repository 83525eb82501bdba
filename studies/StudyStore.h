// The study store: bertsweep's own tables (prefix bs_) in a study's SQLite file, beside Optuna's tables.
// Only the controller writes; report/export read. WAL mode and a busy timeout let readers (optuna CLI,
// `study status`) open the file while a study runs. Every write is its own transaction, so a finished
// trial's rows survive the controller being killed at any moment.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/TrainConfig.h"

namespace SQLite {
class Database;
}

namespace bs {

// Trial states, spelled as Optuna spells them (TrialState names).
namespace trial_state {
constexpr const char* kRunning = "RUNNING";
constexpr const char* kComplete = "COMPLETE";
constexpr const char* kPruned = "PRUNED";
constexpr const char* kFail = "FAIL";
}  // namespace trial_state

// One row of bs_trials: one run of one Optuna trial.
struct TrialRecord {
  int64_t number = -1;  // Optuna's trial number (unique within the study)
  std::string state = trial_state::kRunning;
  int64_t pid = 0;  // the launched process (process group leader)
  std::string host;
  double start_time = 0;    // unix seconds
  double end_time = 0;      // 0 while running
  int exit_code = -1;       // -1: unknown / still running; 128+N: killed by signal N
  std::string reason;       // why it failed or was pruned; empty when complete
  std::string config_yaml;  // the resolved training config (what `study export` writes back)
  std::string params_json;  // the sampled parameters, {"key.path": value, ...}
  std::string trial_dir;    // studies/NAME/trials/NNNN
  bool reached = false;     // target accuracy reached within the budget
  std::optional<double> samples_to_target, seconds_to_target, final_mlm_accuracy;
  std::vector<double> values;  // objective value(s) told to Optuna (empty unless COMPLETE)
  int attempt = 1;             // 1 + how many times these params were retried
  int64_t retry_of = -1;       // the trial this one retries, or -1
  bool retried = false;        // a retry of this failed trial was queued (its budget slot passed on)

  // config_yaml, typed, for reading results (TrainConfig::read_stored; the defaults when the row has none).
  TrainConfig config() const { return TrainConfig::read_stored(config_yaml); }
};

struct EvalPoint {
  int64_t trial = -1, step = 0, samples = 0;
  double mlm_accuracy = 0, loss = 0, seconds = 0;
};

struct ThroughputPoint {
  int64_t trial = -1, step = 0, samples = 0;
  double samples_per_s = 0, tokens_per_s = 0, padding_waste = 0, imbalance = 0, overlap = 0, step_seconds = 0;
};

struct RankLoadPoint {
  int64_t trial = -1, step = 0;
  std::string json;  // the event line as written by the trainer (per-rank arrays)
};

class StudyStore {
 public:
  enum class Mode {
    kReadWrite,  // the controller: creates the file and the bs_ tables when absent
    kReadOnly,   // status, export, report, refused commands: never creates, migrates or writes anything
  };
  // Read-only opening fails (std::runtime_error naming the file) when the file is missing or holds no
  // bertsweep study (e.g. 0 bytes, or another SQLite file); tables added by later versions read as empty.
  explicit StudyStore(const std::string& db_path, Mode mode = Mode::kReadWrite);
  ~StudyStore();
  StudyStore(const StudyStore&) = delete;
  StudyStore& operator=(const StudyStore&) = delete;

  const std::string& path() const { return path_; }
  bool read_only() const { return mode_ == Mode::kReadOnly; }

  // A read-only SQLite connection that leaves no trace: while no WAL file exists (no controller is writing,
  // none died mid-write) the file is opened immutable, so SQLite creates no -wal/-shm beside it; otherwise a
  // plain read-only connection reads the WAL the writer keeps. Throws SQLite::Exception.
  static std::unique_ptr<SQLite::Database> open_read_only(const std::string& db_path);

  // An online copy of the study file (SQLite's backup API, so a consistent snapshot even of a WAL file) to
  // `db_path`.bak, taken by a writing session before its first write; the previous copies move to .bak.1 ..
  // .bak.(keep-1). Written to a temporary file and renamed, so a kill never leaves a half copy as .bak.
  // Returns the copy's path. Throws std::runtime_error naming the file.
  static std::string backup(const std::string& db_path, int keep = 3);

  // bs_study: the study's name and its config as given (to check that a continued study is the same).
  // Inserts the row, or updates only its config when it differs (`created` is kept).
  void save_study(const std::string& name, const std::string& config_yaml);
  std::optional<std::string> study_config(const std::string& name) const;
  std::vector<std::string> study_names() const;

  // bs_environment: key/value facts of each controller session (versions, host, cores, git commit...).
  // Returns the session number.
  int64_t record_environment(const std::map<std::string, std::string>& facts);
  std::map<std::string, std::string> environment(int64_t session = -1) const;  // -1: the latest

  // bs_trials
  // A new row; StudyError (exit 7) when the number is taken: a finished result is never overwritten.
  void insert_trial(const TrialRecord& t);
  // Writes the whole row of a RUNNING trial (inserting it when absent); StudyError when the stored row is
  // COMPLETE, PRUNED or FAIL.
  void update_trial(const TrialRecord& t);
  void mark_retried(int64_t number);
  std::optional<TrialRecord> trial(int64_t number) const;
  std::vector<TrialRecord> trials() const;  // by number
  std::vector<TrialRecord> trials_in_state(const std::string& state) const;

  // Curves
  void add_eval(const EvalPoint& e);
  void add_throughput(const ThroughputPoint& p);
  void add_rank_load(const RankLoadPoint& p);
  std::vector<EvalPoint> evals(int64_t trial = -1) const;  // -1: every trial
  std::vector<ThroughputPoint> throughput(int64_t trial = -1) const;
  std::vector<RankLoadPoint> rank_load(int64_t trial = -1) const;

 private:
  bool has_table(const std::string& table) const;

  std::string path_;
  Mode mode_;
  std::unique_ptr<SQLite::Database> db_;
};

}  // namespace bs
