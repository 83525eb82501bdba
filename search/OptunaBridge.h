// Optuna through pybind11's embedded interpreter: one study in `sqlite:///<dir>/<name>/study.db`,
// ask/tell, intermediate reports and pruning, re-queued trials, and a stratified study's per-cell sampling
// and median pruning (search/cell_search.py). All calls happen on the controller's thread. Python errors
// become std::runtime_error carrying the Python traceback text.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "search/SearchSpace.h"

namespace bs::search {

struct StudyConfig;

// Starts the embedded interpreter once per process (Debian's /usr/bin/python3 prefix, environment
// ignored so that a pyenv PYTHONHOME/PYTHONPATH cannot break it) and returns optuna.__version__.
std::string ensure_python();
// The embedded interpreter's version ("3.11.2").
std::string python_version();

struct OptunaTrialInfo {
  int64_t number = -1;
  std::string state;  // COMPLETE | PRUNED | FAIL | RUNNING | WAITING
  std::vector<double> values;
  std::map<std::string, ParamValue> params;
  std::map<std::string, std::string> user_attrs;  // as text
};

class OptunaBridge {
 public:
  // Creates the study or loads it (load_if_exists). The sampler's seed is `seed + trials already in the
  // study`, so a resumed random/qmc sampler does not repeat the first session's points. A stratified
  // study's `median` pruner compares a trial with the COMPLETE trials of its own cell only.
  OptunaBridge(const std::string& db_path, const StudyConfig& config);
  ~OptunaBridge();
  OptunaBridge(const OptunaBridge&) = delete;
  OptunaBridge& operator=(const OptunaBridge&) = delete;

  // A new trial (a WAITING re-queued one first, as Optuna does), its parameters sampled from `space`.
  struct Asked {
    int64_t number = -1;
    std::map<std::string, ParamValue> params;
    std::map<std::string, std::string> user_attrs;
  };
  Asked ask(const SearchSpace& space, const TrainConfig& base);
  // A new trial in `cell` ({stratify key: value}, a stratified study). tpe/cmaes: a fresh sampler of that
  // kind draws the rest over an in-memory study of the cell's finished trials only, seeded by the study
  // seed, the cell and the cell's trial count; the values are then enqueued into this study and asked, so
  // the study file records every parameter. random/qmc: the cell is enqueued and `ask` draws the rest.
  Asked ask_in_cell(const SearchSpace& space, const TrainConfig& base, const std::map<std::string, ParamValue>& cell);

  void report(int64_t number, double value, int64_t step);
  bool should_prune(int64_t number);
  void tell_complete(int64_t number, const std::vector<double>& values);
  void tell_pruned(int64_t number);
  void tell_fail(int64_t number);
  void set_user_attr(int64_t number, const std::string& key, const std::string& value);
  // Queues the same parameters again (retry); `user_attrs` are attached to the new trial.
  void enqueue(const std::map<std::string, ParamValue>& params, const std::map<std::string, std::string>& user_attrs);

  std::vector<OptunaTrialInfo> trials() const;
  std::map<std::string, int> count_by_state() const;
  std::optional<int64_t> best_trial_number() const;  // single-objective; nullopt when none complete
  std::vector<int64_t> pareto_front() const;         // multi-objective best_trials

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bs::search
