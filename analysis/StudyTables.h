// The numbers of a study report, computed in C++ from the study store (so tests can check them against
// their own SQL): per optimizer x batch statistics, the Pareto front, best trials, optimisation history.
#pragma once
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "studies/ConfigExport.h"
#include "studies/StudyStore.h"

namespace bs::analysis {

// Summary of a sample: n, best (min or max by direction), mean, sample standard deviation (n-1; 0 for n=1).
struct Stats {
  int n = 0;
  double best = 0, mean = 0, std = 0, min = 0, max = 0;
};
Stats stats_of(const std::vector<double>& xs, bool minimize = true);

// Optimizer and global batch of a trial, from its resolved config ("?" / -1 when it has none).
std::string trial_optimizer(const TrialRecord& t);
int64_t trial_batch(const TrialRecord& t);

// One row per (optimizer, batch.global) that has any trial. `samples` are the samples_to_target of the
// COMPLETE trials that reached the target; `best_trial` is the trial with the best of them (-1: none).
struct GroupRow {
  std::string optimizer;
  int64_t batch = -1;
  int trials = 0, complete = 0, reached = 0, pruned = 0, failed = 0;
  Stats samples;
  int64_t best_trial = -1;
};
std::vector<GroupRow> optimizer_batch_table(const std::vector<TrialRecord>& trials);  // by optimizer, batch

struct StateCounts {
  int total = 0, complete = 0, reached = 0, pruned = 0, failed = 0, running = 0;
};
StateCounts count_states(const std::vector<TrialRecord>& trials);

// Reached COMPLETE trials not dominated in (larger batch, fewer samples to target): a larger batch is
// better (more parallelism) unless it costs more samples. Sorted by batch ascending.
struct ParetoPoint {
  int64_t trial = -1, batch = 0;
  double samples_to_target = 0;
  std::string optimizer;
};
std::vector<ParetoPoint> reached_points(const std::vector<TrialRecord>& trials);
std::vector<ParetoPoint> pareto_front(const std::vector<TrialRecord>& trials);

// The best trial (rank_trials order) of each optimizer, by optimizer name.
std::vector<TrialRecord> best_per_optimizer(const std::vector<TrialRecord>& trials, const StudyObjective& objective);
// The same per (optimizer, batch.global) pair, ordered by optimizer then batch.
std::vector<TrialRecord> best_per_optimizer_and_batch(const std::vector<TrialRecord>& trials,
                                                      const StudyObjective& objective);

// Per finished trial in number order: its objective value (COMPLETE only) and the best value so far.
struct HistoryPoint {
  int64_t trial = -1;
  std::string state;
  std::optional<double> value, best_so_far;
};
std::vector<HistoryPoint> optimization_history(const std::vector<TrialRecord>& trials, const StudyObjective& objective);

// Critical batch size from samples to target E at several batch sizes B (McCandlish et al. 2018, "An
// Empirical Model of Large-Batch Training"): E(B) = E_min (1 + B / B_crit), a line a + b B fitted by least
// squares, so E_min = a, S_min = b (the fewest optimizer steps) and B_crit = a / b. Below B_crit a larger
// batch costs few extra samples; above it, samples grow with the batch and steps stop falling.
struct CriticalBatchFit {
  enum class Kind { kNone, kFit, kBelowRange, kAboveRange };
  Kind kind = Kind::kNone;  // kNone: fewer than 2 distinct batch sizes
  // kBelowRange: a <= 0 (samples grow in proportion to the batch: step-limited at every batch tried);
  // kAboveRange: b <= 0 (samples do not grow with the batch: no sign of a limit in the range tried).
  // NaN where undefined: all three for kNone, b_crit for the out-of-range kinds (tables then write "-").
  double e_min = std::nan(""), s_min = std::nan(""), b_crit = std::nan("");
  int points = 0;
};
CriticalBatchFit fit_critical_batch(const std::vector<double>& batch, const std::vector<double>& samples);

}  // namespace bs::analysis
