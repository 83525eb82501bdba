// `study confirm`'s runs: re-runs chosen trials of a study with several seeds (`bertsweep train --config <cfg>
// --set seed=S`) through TrialPool, so that they run as the study's trials did: under the study's stored
// launcher (ranks, cpus_per_rank, mpirun/srun, GPU slots), held to its trial_timeout and
// launcher.queue_timeout, stopped and killed the controller's way, and drained on Ctrl-C. Each run is
// written to bs_confirm (studies/ConfirmStore.h) as it ends. Which trials to confirm is the caller's
// choice (analysis/ConfirmSelection.h picks them; cli/ExportCommand.cpp wires the two), since search does
// not depend on analysis.
//
// What is stored, so that bs_confirm only holds what a config did when it was given its chance:
//  - a run that ended by itself: its exit code, reached, samples/seconds to target, accuracy;
//  - a run stopped for the study's limits (no event for trial_timeout s, or its Slurm job not started
//    within launcher.queue_timeout): its exit code, not reached, and the reason ("timeout: ...");
//  - Ctrl-C (first SIGINT/SIGTERM): no new run starts; running ones finish and are stored; runs that never
//    started are not stored (nothing ran);
//  - a second signal stops the running runs (SIGTERM, killed after the grace period): one that still
//    finished (exit 0 with its done event) is stored, the others are not (they were cut short by the user,
//    so "not reached" would be untrue); their folders and logs stay under the session folder;
//  - a third signal kills `study confirm` at once (the default action).
// A drained confirmation returns drained = true; the CLI exits exit_code::kTerminated, as `study run` does.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "studies/ConfirmStore.h"
#include "studies/StudyStore.h"

namespace bs::search {

// One trial to confirm, as the caller chose it.
struct ConfirmSource {
  TrialRecord trial;
  std::string optimizer;  // its optimizer.name and batch.global (they name the runs and their folders)
  int64_t batch = 0;
};

struct ConfirmRunOptions {
  std::string dir = "studies";
  std::string study;
  std::string trainer_exe;  // the bertsweep executable that runs `train`
  std::vector<ConfirmSource> sources;
  std::vector<int64_t> seeds;     // one run per source and seed
  bool per_batch = false;         // the sources are (optimizer, batch) pairs (for the progress lines)
  int parallel = 1;               // runs at a time; threads per rank as the controller computes them for it
  int cores = 0;                  // cores shared by the parallel runs; 0: all of this machine's
  double kill_grace_s = 10;       // after the graceful stop, killed after this long
  std::vector<std::string> sets;  // key=value overrides applied to every exported config
  bool quiet = false;
  // Continue the latest session instead of starting a new one: only the (source, seed) runs it has not
  // stored are run, into that session (a confirmation stopped by a signal or a lost machine goes on where it
  // was). Refused, before anything runs, when that session stored a run of another trial or config for one
  // of them (the study's best changed since, or other --set or --mllog-dir).
  bool resume = false;
  // Non-empty: each run also writes its MLLOG (`--set log.mllog=...`) as
  // DIR/<optimizer>-b<batch>/bert/result_N.txt, N = 0, 1, ... over the seeds in the order given: the
  // results/<system>/<benchmark>/result_N.txt layout MLPerf's package and RCP checkers read, one "system"
  // folder per confirmed (optimizer, batch). Refused before any run when one of those files exists already.
  std::string mllog_dir;
};

// The MLLOG file of the `index`-th seed of an (optimizer, batch) pair under ConfirmRunOptions::mllog_dir.
std::string confirm_mllog_path(const std::string& mllog_dir, const std::string& optimizer, int64_t batch,
                               std::size_t index);

struct ConfirmRunsResult {
  std::string db;  // the study file
  int64_t session = 0;
  std::vector<ConfirmRun> runs;     // the runs stored, in the order they ended
  std::vector<ConfirmRun> earlier;  // resume: the session's runs stored before, not run again
  bool drained = false;             // stopped by a signal before every planned run had ended
};

// Throws StudyError for an unknown study, ConfigError for a run config that does not validate or a
// launcher this machine cannot serve, both before anything is written. Progress goes to `progress`.
ConfirmRunsResult run_confirmations(const ConfirmRunOptions& options, std::ostream& progress);

}  // namespace bs::search
