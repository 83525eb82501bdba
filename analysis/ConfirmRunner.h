// `study confirm`: re-runs the best config of each optimizer (or of each optimizer and batch size) with
// several seeds (`bertsweep train
// --config <cfg> --set seed=S --events fd:3 --quiet` as child processes, through search/TrialLauncher),
// stores each run in bs_confirm and summarises samples to target per optimizer (mean +- std).
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "analysis/ConfirmSummary.h"

namespace bs::analysis {

struct ConfirmOptions {
  std::string dir = "studies";
  std::string study;
  std::string trainer_exe;         // the bertsweep executable that runs `train`
  std::vector<int64_t> seeds;      // one run per optimizer (and batch) and seed
  bool per_batch = false;          // the best trial of every (optimizer, batch.global), not per optimizer
  bool include_unreached = false;  // also re-run best trials that never reached the target
  int parallel = 1;                // runs at a time; each gets cores/parallel threads
  std::vector<std::string> sets;   // key=value overrides applied to every exported config
  bool quiet = false;
  // Non-empty: each run also writes its MLLOG (`--set log.mllog=...`) as
  // DIR/<optimizer>-b<batch>/bert/result_N.txt, N = 0, 1, ... over the seeds in the order given: the
  // results/<system>/<benchmark>/result_N.txt layout MLPerf's package and RCP checkers read, one "system"
  // folder per confirmed (optimizer, batch). Refused before any run when one of those files exists already.
  std::string mllog_dir;
};

// The MLLOG file of the `index`-th seed of an (optimizer, batch) pair under ConfirmOptions::mllog_dir.
std::string confirm_mllog_path(const std::string& mllog_dir, const std::string& optimizer, int64_t batch,
                               std::size_t index);

struct ConfirmResult {
  int64_t session = 0;
  std::vector<ConfirmRun> runs;
  std::vector<ConfirmSummary> summary;
};

// Throws StudyError for an unknown study or one without a COMPLETE trial. Progress goes to `progress`.
ConfirmResult run_confirm(const ConfirmOptions& options, std::ostream& progress);

// The summary as a text table (one line per optimizer and batch: mean +- std of samples to target).
std::string confirm_summary_text(const std::vector<ConfirmSummary>& summary);

}  // namespace bs::analysis
