// A study config (configs/studies/*.yaml, DESIGN.md "Configs"): what to search, how, and how to launch trials.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "search/SearchSpace.h"

namespace YAML {
class Emitter;
class Node;
}  // namespace YAML

namespace bs::search {

struct LauncherConfig {
  std::string kind = "local";           // local | mpirun | srun
  int ranks = 1;                        // mpirun -np / srun --ntasks
  std::string hostfile;                 // mpirun --hostfile (relative to the study config)
  std::vector<std::string> extra_args;  // appended to the mpirun/srun arguments, one argument each
  int gpus_per_trial = 0;               // GPUs given to each trial (CUDA_VISIBLE_DEVICES, device=cuda); 0: CPU trials
  // The GPU ids trials are placed on (canonical decimal text); empty: every GPU the controller sees
  // (visible_gpus() in TrialLauncher.h). Under srun these are ids within the Slurm allocation.
  std::vector<std::string> gpus;
  // Slurm (kind: srun; search/Slurm.h). cpus_per_trial also sets the threads of local/mpirun trials' ranks.
  int cpus_per_trial = 0;  // CPUs of one trial, split evenly between its ranks; 0: the CPUs there are / parallel
  int nodes = 0;           // srun --nodes; 0: not passed
  int ranks_per_node = 0;  // srun --ntasks-per-node; 0: not passed
  std::string partition;   // srun --partition; empty: the cluster's default
  std::string time_limit;  // srun --time, in Slurm's format (minutes, MM:SS, HH:MM:SS, D-HH[:MM]); empty: none
  std::string mpi;         // srun --mpi; empty: pmix when ranks > 1, else not passed
  std::string job_name = "bs-{study}-{trial}";  // {study}, {trial} (4 digits) are filled in
  double queue_timeout = 0;  // srun: seconds from launch to the trial's first event (queue + start); 0: none
};

struct StudyConfig {
  std::string name;
  // Metrics (samples_to_target, seconds_to_target, final_mlm_accuracy) or training key paths
  // (e.g. batch.global) for a multi-objective study; one direction per objective.
  std::vector<std::string> objectives = {"samples_to_target"};
  std::vector<std::string> directions = {"minimize"};
  std::string sampler = "tpe";    // tpe | cmaes | random | grid | qmc
  std::string pruner = "median";  // median | successive_halving | hyperband | none
  int n_trials = 10;
  int parallel = 1;
  int64_t seed = 0;
  int retry_failed = 0;      // re-queue a failed trial's params up to this many times
  double trial_timeout = 0;  // seconds without an event before a trial is killed; 0: none
  // Choice parameters whose every combination ("cell") gets an equal share of the trials: each new trial
  // is enqueued with the least-tried cell's values and the sampler picks the rest, so e.g. every
  // (optimizer, batch) pair is tuned instead of the sampler settling on one early. tpe/cmaes then sample
  // and the median pruner compares within the cell (OptunaBridge::ask_in_cell, search/cell_search.py).
  std::vector<std::string> stratify;
  std::string base_yaml;  // the base training config, every key explicit (canonical)
  SearchSpace space;
  LauncherConfig launcher;
  std::string source;  // the file it was read from

  // Reads a study file. `sets`: `key=value` overrides of the study config; `base.a.b=v` sets a key of the
  // base training config (after `base_config:`/`extends:` are followed). Errors name the key and file:line.
  static StudyConfig load(const std::string& path, const std::vector<std::string>& sets = {});
  static StudyConfig from_yaml(const YAML::Node& node, const std::string& source,
                               const std::vector<std::string>& sets = {});

  bool multi_objective() const { return objectives.size() > 1; }
  // The whole config as self-contained YAML (the base inline, nothing to follow); from_yaml reads it back.
  std::string to_yaml_string() const;
  // The part that defines the search (objective, sampler, pruner, seed, base, space): a study can be
  // continued with a different n_trials, parallel, timeout or launcher, but not a different search.
  std::string identity() const;
  // Every combination of the `stratify` parameters' values, in declaration order (empty when not stratified).
  std::vector<std::map<std::string, ParamValue>> strata() const;
  // The base training config (validated when the study was read).
  TrainConfig base() const;

 private:
  struct Keys;  // the table of study keys (StudyConfig.cpp): reads and writes every member, these included
  void emit(YAML::Emitter& out, bool full) const;
  std::string space_yaml_, derived_yaml_;  // as written, for to_yaml_string()
};

// Study names become folder names: [A-Za-z0-9_.-]+, not "." or "..".
bool is_valid_study_name(const std::string& name);
// The metric names that are not training keys.
bool is_metric_objective(const std::string& name);

}  // namespace bs::search
