// `study confirm` results: table bs_confirm in the study's SQLite file, written only by `study confirm`.
// Each invocation is a session; analysis/ConfirmSummary.h summarises the latest session of each (optimizer, batch).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace SQLite {
class Database;
}

namespace bs {

struct ConfirmRun {
  int64_t session = 0;
  std::string optimizer;
  int64_t source_trial = -1;  // the study trial whose config was re-run
  int64_t seed = 0;
  int exit_code = -1;  // of `bertsweep train`; 128+N when killed by signal N
  bool reached = false;
  std::optional<double> samples_to_target, seconds_to_target, final_mlm_accuracy;
  std::string config_yaml;  // exactly what was trained (the trial's config with the seed)
  std::string log_path;     // the run's stdout/stderr
  int64_t batch = 0;        // global batch of the run (0: recorded before batches were stored)
  // Why it was stopped when `study confirm` stopped it ("timeout: no event for 600 s", "queue timeout: ...");
  // empty when it ended by itself (and in rows written before the column existed).
  std::string reason{};  // (an initializer: aggregate initialisations may leave it out)
};

class ConfirmStore {
 public:
  // `writable`: create the table when absent (only `study confirm`); readers never change the file.
  ConfirmStore(const std::string& db_path, bool writable);
  ~ConfirmStore();

  int64_t next_session() const;
  void add(const ConfirmRun& r);
  std::vector<ConfirmRun> runs() const;  // every session, by session, optimizer, seed; empty when no table

 private:
  std::unique_ptr<SQLite::Database> db_;
  bool has_table_ = false;
  bool has_batch_ = false;   // files written before the batch column read as batch 0
  bool has_reason_ = false;  // and before the reason column as no reason
};

}  // namespace bs
