// Batch-size scaling of a study confirmed per batch (`study confirm --per-batch`): samples and steps to target
// per (optimizer, batch), the critical batch with a bootstrap interval over seeds, the measured time to target,
// a modelled data-parallel time to train, and the Adam-family vs LAMB-family statement. Computation only (no
// file, no Python): analysis/Report.cpp renders it.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "analysis/StudyTables.h"
#include "studies/ConfirmStore.h"
#include "studies/StudyStore.h"

namespace bs::analysis {

// One confirmed (optimizer, batch) cell: the runs of the latest confirm session of that pair (batch > 0).
// Runs that did not reach the target count in `runs` only; the statistics are over the `reached` ones.
struct ScalingCell {
  std::string optimizer;
  int64_t batch = 0, source_trial = -1;
  int runs = 0, reached = 0;
  std::vector<double> samples;              // samples_to_target of each reached run
  Stats samples_stats, steps_stats;         // steps = samples / batch
  Stats seconds_stats;                      // seconds_to_target of the reached runs that have one
  double samples_sum = 0, seconds_sum = 0;  // over the reached runs with both values
  std::string config_yaml;                  // what the cell's first run trained (seed aside)
};
std::vector<ScalingCell> scaling_cells(const std::vector<ConfirmRun>& runs);  // by optimizer, batch
// True when some optimizer has reached runs at two or more batch sizes (a critical batch can be fitted).
bool several_batches(const std::vector<ScalingCell>& cells);

// The critical batch fit (fit_critical_batch) of one optimizer with a percentile bootstrap interval over seeds:
// each replicate resamples the reached runs with replacement within each batch (every batch keeps its count)
// and refits. A replicate whose slope is <= 0 has an unbounded B_crit (+inf, counted in `unbounded`); one with
// E_min <= 0 (samples grow at least in proportion to the batch) takes B_crit = 0 (counted in `below`).
struct BootstrapOptions {
  int replicates = 2000;
  uint64_t seed = 20181214;  // fixed: the report is deterministic
  double level = 0.95;
};
struct Interval {
  double lo = 0, hi = 0;
};
struct CriticalBatchInterval {
  CriticalBatchFit point;
  int replicates = 0, unbounded = 0, below = 0;
  double level = 0.95, smallest_batch = 0, largest_batch = 0;
  Interval b_crit, e_min, s_min;  // b_crit.hi is +inf when the upper percentile falls among unbounded replicates
};
// batches[i] holds samples[i] (one value per reached run); batches with no value are skipped.
CriticalBatchInterval bootstrap_critical_batch(const std::vector<double>& batches,
                                               const std::vector<std::vector<double>>& samples,
                                               const BootstrapOptions& options = {});
// The cells of one optimizer, fitted and bootstrapped.
CriticalBatchInterval critical_batch_of(const std::vector<ScalingCell>& cells, const std::string& optimizer,
                                        const BootstrapOptions& options = {});
// Percentile with linear interpolation between order statistics (numpy's default); +inf propagates.
double percentile(std::vector<double> values, double q);
// "[410, > 1024]": +inf as "> largest batch", 0 from E_min <= 0 replicates as "< smallest batch".
std::string format_b_crit(double v, const CriticalBatchInterval& c);
std::string format_b_crit_interval(const CriticalBatchInterval& c);

// Data-parallel cluster model: N devices, each processing its local batch B/N at the measured per-process
// throughput r, then a ring allreduce of the gradients: 2 (N-1)/N G / bw + 2 (N-1) alpha.
struct ClusterModel {
  double link_bytes_per_s = 25e9;  // per device: 200 Gb/s InfiniBand HDR
  double latency_s = 10e-6;        // alpha, per message
  int64_t min_local_batch = 4;     // only N with B/N >= this (and N dividing B)
};
double ring_allreduce_seconds(int64_t devices, double grad_bytes, const ClusterModel& m);
double modelled_step_seconds(int64_t batch, int64_t devices, double samples_per_s, double grad_bytes,
                             const ClusterModel& m);

// Parameters of BertForPretraining for `m` (m.vocab_size > 0): embeddings, encoder layers, MLM head (decoder
// tied to the word embeddings, own bias) and NSP head.
int64_t bert_parameter_count(const ModelConfig& m);
// The model's vocab: model.vocab_size, or (0: taken from the data) the lines of data.dir/vocab.txt, as the
// trainer counts them. nullopt when neither is known; `where` says what was read or why not.
std::optional<int64_t> vocab_size_of(const TrainConfig& c, std::string& where);
// Bytes per gradient value in the allreduce: distributed.grad_dtype fp32 = 4; compute = the precision's
// (bf16/fp16 2, fp32 4; auto is taken as fp32).
int grad_bytes_per_value(const TrainConfig& c);

// Per-process training throughput of a trial from its stored throughput windows: each row reports its own
// window (samples_per_s over that window; `samples` is the running total at its end), so the rate is the
// total samples over the total window time, sum(dS) / sum(dS / samples_per_s). nullopt when no window has
// a positive rate.
std::optional<double> stored_samples_per_s(const std::vector<ThroughputPoint>& points, int* windows = nullptr);

// What the report measures of one cell: the per-process throughput (the source trial's stored windows, else the
// confirm runs' samples over seconds to target) and the gradient size of its config (the first run's, else the
// source trial's).
struct CellMeasure {
  std::optional<double> samples_per_s;
  std::string rate_source;  // which of the two, in words
  std::optional<int64_t> parameters;
  std::string parameters_source;  // where the vocab size came from, or why the count is unknown
  int grad_value_bytes = 4;
  std::string grad_dtype = "fp32";
};
CellMeasure measure_cell(const ScalingCell& c, const StudyStore& store);

// What the time model needs of one cell (measured on this machine).
struct CellTiming {
  std::string optimizer;
  int64_t batch = 0;
  double steps = 0;          // mean steps to target
  double samples_per_s = 0;  // per process
  double grad_bytes = 0;     // parameters x bytes per gradient value
};
struct TrainTimeChoice {
  int64_t batch = 0;
  double step_seconds = 0, seconds = 0;
};
struct TrainTimeRow {
  int64_t devices = 1;
  std::map<std::string, TrainTimeChoice> best;  // per optimizer: its fastest allowed batch (absent: none allowed)
  std::string winner;
};
// N = 1, 2, 4, ... up to the largest N that some cell allows.
std::vector<TrainTimeRow> model_time_to_train(const std::vector<CellTiming>& cells, const ClusterModel& m);

// Adam family (adam, adamw) vs LAMB family (lamb, nvlamb, lans): at the largest batch both families confirmed
// and at each family's best batch (fewest mean samples), does the best Adam-family optimizer need no more
// samples than the best LAMB-family one? One paragraph; mean +- std ranges that overlap are inconclusive.
std::string family_statement(const std::vector<ScalingCell>& cells,
                             const std::map<std::string, CriticalBatchInterval>& critical);

}  // namespace bs::analysis
