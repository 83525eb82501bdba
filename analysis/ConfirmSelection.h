// `study confirm`'s choices and its summary: which trials to re-run with several seeds (the best config of
// each optimizer, or of each optimizer and batch size), and the mean +- std of samples to target of a
// confirmation session. The runs themselves are started by search/ConfirmRuns.h (analysis starts no
// process); cli/ExportCommand.cpp wires the two.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "analysis/ConfirmSummary.h"
#include "studies/StudyStore.h"

namespace bs::analysis {

struct ConfirmChoice {
  std::string dir = "studies";
  std::string study;
  bool per_batch = false;          // the best trial of every (optimizer, batch.global), not per optimizer
  bool include_unreached = false;  // also re-run best trials that never reached the target
  bool quiet = false;              // no line for a skipped best trial
};

// The best trial of each optimizer (or optimizer and batch) that has a samples-to-target to confirm: a best
// trial that never reached the target would only spend max_samples per seed (skipped, and said so on
// `progress`, unless include_unreached); metric objectives without a target keep every one. Throws
// StudyError for an unknown study, one without a COMPLETE trial, or one where none is left.
std::vector<TrialRecord> trials_to_confirm(const ConfirmChoice& choice, std::ostream& progress);

// The summary of one session's runs in the study file `db` (summarize_confirm).
std::vector<ConfirmSummary> confirm_session_summary(const std::string& db, int64_t session);

// The summary as a text table (one line per optimizer and batch: mean +- std of samples to target).
std::string confirm_summary_text(const std::vector<ConfirmSummary>& summary);

}  // namespace bs::analysis
