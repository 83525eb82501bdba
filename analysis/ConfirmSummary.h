// Summaries of `study confirm` runs (their rows: studies/ConfirmStore.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "analysis/StudyTables.h"
#include "studies/ConfirmStore.h"

namespace bs::analysis {

using bs::ConfirmRun;
using bs::ConfirmStore;

// Mean +- std of samples to target per (optimizer, batch) over the runs that reached the target, from the
// latest session that ran that pair.
struct ConfirmSummary {
  std::string optimizer;
  int64_t batch = 0;
  int64_t source_trial = -1, session = 0;
  int runs = 0, reached = 0;
  Stats samples;
};
std::vector<ConfirmSummary> summarize_confirm(const std::vector<ConfirmRun>& runs);

}  // namespace bs::analysis
