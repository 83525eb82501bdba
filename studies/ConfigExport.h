// `study export`: choosing the best trial(s) of a study and writing their resolved training config back,
// as YAML that `bertsweep train --config` runs unchanged, or as MLPerf-style hyperparameter JSON.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/Errors.h"
#include "studies/StudyStore.h"

namespace bs {

struct TrainConfig;

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
  // `source` names the stored text in errors (a damaged copy is a StudyError).
  static StudyObjective from_study_yaml(const std::string& yaml,
                                        const std::string& source = "the stored study config (bs_study)");
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

// COMPLETE trials that pass `filter`, best first: those that reached the target before those that did not,
// then by the objective (in its direction; a missing value last), then by trial number.
std::vector<TrialRecord> rank_trials(const std::vector<TrialRecord>& trials, const StudyObjective& objective,
                                     const TrialFilter& filter = {});

// The trial's resolved config exactly as stored; with `sets` (key.path=value) it is re-read as a TrainConfig,
// overridden, validated and written back (every key explicit). Doubles in their shortest exact form
// (shorten_yaml_numbers): the values are bit-identical to the stored ones.
std::string export_yaml(const TrialRecord& t, const std::vector<std::string>& sets = {});

// MLPerf-style hyperparameters (global_batch_size, opt_base_learning_rate, ...) of a resolved config, with
// gradient accumulation, the per-device batch, the model shape, precision, MLPerf's BERT eval settings and the
// trial's provenance under "bertsweep". Pretty-printed JSON, one key per line, numbers in shortest exact form.
// One node with one device unless a layout is given (the overload below).
std::string export_mlperf_json(const TrainConfig& config, const TrialRecord& t, const std::string& study_name);

// Warmup steps and total steps as the trainer's schedule resolves them (warmup_fraction of total steps).
int64_t resolved_total_steps(const TrainConfig& config);
int64_t resolved_warmup_steps(const TrainConfig& config);

// The shortest decimal text that reads back (strtod) as exactly `v`: 0.1 -> "0.1", 1e-4 -> "0.0001",
// 3 -> "3"; "null" for NaN/inf (JSON has no spelling for them).
std::string shortest_number(double v);

// The YAML text with every double that was written at full precision (16-17 significant digits, as the
// config writer emits them) replaced by its shortest exact form; comments, order and other values unchanged.
std::string shorten_yaml_numbers(const std::string& yaml);

// How the production run is laid out: `--nodes N --gpus-per-node G`.
struct ProductionLayout {
  int64_t nodes = 1;
  int64_t gpus_per_node = 1;
  int64_t devices() const { return nodes * gpus_per_node; }
};

// The per-device batch global / (nodes * gpus_per_node); throws ConfigError naming both numbers when the
// devices do not divide the global batch.
int64_t per_device_batch(int64_t global_batch, const ProductionLayout& layout);
// The trainer's micro-steps per optimizer step: ceil(per-device batch / batch.micro).
int64_t gradient_accumulation_steps(const TrainConfig& config, const ProductionLayout& layout);

// MLPerf BERT (closed) evaluation settings: the quality target, the eval set size and the eval interval.
constexpr double kMlperfBertTargetMlmAccuracy = 0.720;
constexpr int64_t kMlperfBertEvalSamples = 10000;
// FLOOR(0.05 * (230.23 * global_batch + 3,000,000), 25,000) samples: training_rules.adoc of
// mlcommons/training_policies (benchmark quality table, BERT row: "eval_interval_samples=FLOOR(0.05*(230.23*GBS+
// 3000000), 25000), skipping 0"), i.e. rounded down to a multiple of 25,000; the first eval comes after one interval.
int64_t mlperf_bert_eval_interval_samples(int64_t global_batch);

// `--scale-lr linear|sqrt|none`: the learning rate for a production global batch, from the trial's lr at the
// trial's batch (linear: lr * prod/trial; sqrt: lr * sqrt(prod/trial); none: lr). Throws ConfigError for an
// unknown mode or a batch < 1.
double scaled_learning_rate(double lr, int64_t trial_batch, int64_t production_batch, const std::string& mode);

// MLPerf-style hyperparameters of a resolved config for a production layout; see export_mlperf_json above.
std::string export_mlperf_json(const TrainConfig& config, const TrialRecord& t, const std::string& study_name,
                               const ProductionLayout& layout);

// The shell variables NVIDIA's MLPerf BERT run_and_time.sh reads from its config_<SYSTEM>.sh (BATCHSIZE is the
// per-GPU batch of one optimizer step, GRADIENT_STEPS the micro-steps it is split into, LR, MAX_STEPS,
// WARMUP_STEPS, OPT_LAMB_BETA_1/2, WEIGHT_DECAY_RATE, EVAL_ITER_START_SAMPLES, EVAL_ITER_SAMPLES, DGXNNODES,
// DGXNGPU, SEED, ...), as `export NAME=value` lines with shell-safe quoting. Throws ConfigError when the layout
// does not divide the global batch.
std::string export_nvidia_config(const TrainConfig& config, const TrialRecord& t, const std::string& study_name,
                                 const ProductionLayout& layout);
// GRADIENT_STEPS for NVIDIA's trainer, which needs it to divide BATCHSIZE: the smallest divisor of the
// per-device batch that is >= gradient_accumulation_steps (the same number whenever that one divides).
int64_t nvidia_gradient_steps(const TrainConfig& config, const ProductionLayout& layout);

}  // namespace bs
