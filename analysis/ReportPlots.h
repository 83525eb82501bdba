// The report's plots: analysis/report_plots.py (matplotlib, Agg backend; Optuna's importance evaluators)
// run in the embedded interpreter. Each function writes one PNG; Python errors become std::runtime_error.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "analysis/StudyTables.h"

namespace bs::analysis {

struct Curve {
  std::string label;
  std::vector<double> samples, accuracy;
};

struct Importance {
  std::string evaluator;                               // e.g. FanovaImportanceEvaluator; empty when none
  std::vector<std::pair<std::string, double>> values;  // most important first
  std::string message;                                 // why there are none ("not enough trials ...")
  bool available() const { return !evaluator.empty(); }
};

void plot_convergence(const std::string& png, const std::vector<Curve>& curves, double target,
                      const std::string& title);
void plot_pareto(const std::string& png, const std::vector<ParetoPoint>& points, const std::vector<ParetoPoint>& front,
                 const std::string& title);
void plot_history(const std::string& png, const std::vector<HistoryPoint>& history, const std::string& metric,
                  const std::string& title);
void plot_confirm(const std::string& png, const std::vector<std::pair<std::string, std::vector<double>>>& groups,
                  const std::string& title);
struct BatchSeries {
  std::string optimizer;
  std::vector<double> batch, mean, std;
  std::vector<int> reached;  // runs behind each mean
};
// Samples to target vs batch size per optimizer, error bars of one standard deviation.
void plot_confirm_vs_batch(const std::string& png, const std::vector<BatchSeries>& series, const std::string& title);
// Samples to target and steps to target vs batch size per optimizer: two log-log panels, error bars of one
// standard deviation over the seeds (reached runs only; `reached`/`runs` label the points where some missed).
struct ScalingSeries {
  std::string optimizer;
  std::vector<double> batch, samples_mean, samples_std, steps_mean, steps_std;
  std::vector<int> reached, runs;
};
void plot_batch_scaling(const std::string& png, const std::vector<ScalingSeries>& series, const std::string& title);
// Modelled time to train vs devices per optimizer (log-log); each marker labelled with the batch it chose.
struct TrainTimeSeries {
  std::string optimizer;
  std::vector<double> devices, seconds, batch;
};
void plot_time_to_train(const std::string& png, const std::vector<TrainTimeSeries>& series, const std::string& title);
// Optuna's importances of the study stored in db_path (opened read-only, no table created); the bar chart
// goes to png only when they are available.
Importance param_importance(const std::string& db_path, const std::string& study_name, const std::string& png,
                            const std::string& title);

}  // namespace bs::analysis
