// `study export`: choosing the best trial(s) of a study and writing their resolved training config back,
// as YAML that `bertsweep train --config` runs unchanged, or as MLPerf-style hyperparameter JSON.
#pragma once
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "studies/StudyStore.h"

namespace bs {

struct TrainConfig;

// A problem with a study (unknown study, no complete trial, a filter that matches nothing): exit code kStudy.
struct StudyError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// studies/NAME/study.db; throws StudyError naming the path (and the studies found in `dir`) when absent,
// and for a NAME that `study run` would refuse ([A-Za-z0-9_.-]+, not "." or "..").
std::string existing_study_db(const std::string& dir, const std::string& name);

// Refuses (StudyError) an output path that is a study's own file or lies inside a study folder (any folder
// above it holds a study.db): an export or report must never overwrite what a study stores. `flag` names
// the option in the message (e.g. "--out").
void refuse_output_in_study(const std::string& path, const std::string& flag);

// What "best" means for a study: its first objective (a metric) and direction, read from bs_study.
struct StudyObjective {
  std::string metric = "samples_to_target";  // samples_to_target | seconds_to_target | final_mlm_accuracy
  bool minimize = true;

  // From the stored study config YAML (`objective:` string or list, `direction:` string or list).
  static StudyObjective from_study_yaml(const std::string& yaml);
  // From the store: the config saved under `name` (or the only one saved); defaults when none is stored.
  static StudyObjective of_study(const StudyStore& store, const std::string& name);
};

// The trial's value of the objective metric (the stored metric column, else the first value told to Optuna).
std::optional<double> objective_value(const TrialRecord& t, const StudyObjective& objective);

// `--where optimizer=lamb,batch.global=4096`: every term must hold on the trial's resolved config.
// Short names: optimizer -> optimizer.name, batch -> batch.global, lr -> optimizer.lr, sampler -> data.sampler.
// Numbers compare by value (4096 == 4096.0), everything else as text.
class TrialFilter {
 public:
  // Each spec is "k=v[,k=v...]"; throws ConfigError for a malformed term or an unknown key path.
  static TrialFilter parse(const std::vector<std::string>& specs);
  bool empty() const { return terms_.empty(); }
  bool matches(const TrialRecord& t) const;
  std::string describe() const;  // "optimizer.name=lamb, batch.global=4096"
  const std::vector<std::pair<std::string, std::string>>& terms() const { return terms_; }

 private:
  std::vector<std::pair<std::string, std::string>> terms_;  // (key path, wanted value)
};

// The value of a training key path in a trial's resolved config, as YAML text ("lamb", "4096", "[32, 64]").
std::string config_value(const std::string& config_yaml, const std::string& key_path);

// COMPLETE trials that pass `filter`, best first: those that reached the target before those that did not,
// then by the objective (in its direction; a missing value last), then by trial number.
std::vector<TrialRecord> rank_trials(const std::vector<TrialRecord>& trials, const StudyObjective& objective,
                                     const TrialFilter& filter = {});

// The trial's resolved config exactly as stored; with `sets` (key.path=value) it is re-read as a TrainConfig,
// overridden, validated and written back (every key explicit, doubles with 17 significant digits).
std::string export_yaml(const TrialRecord& t, const std::vector<std::string>& sets = {});

// MLPerf-style hyperparameters (global_batch_size, opt_base_learning_rate, ...) of a resolved config,
// with the trial's provenance under "bertsweep". Pretty-printed JSON, one key per line.
std::string export_mlperf_json(const TrainConfig& config, const TrialRecord& t, const std::string& study_name);

// Warmup steps and total steps as the trainer's schedule resolves them (warmup_fraction of total steps).
int64_t resolved_total_steps(const TrainConfig& config);
int64_t resolved_warmup_steps(const TrainConfig& config);

}  // namespace bs
