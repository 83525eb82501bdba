#include "analysis/ConfirmSelection.h"

#include <cstdio>
#include <ostream>
#include <sstream>

#include "analysis/Report.h"
#include "analysis/StudyTables.h"
#include "common/Errors.h"
#include "studies/ConfigExport.h"

namespace bs::analysis {

std::vector<TrialRecord> trials_to_confirm(const ConfirmChoice& o, std::ostream& progress) {
  const std::string db = existing_study_db(o.dir, o.study);
  StudyStore store(db, StudyStore::Mode::kReadOnly);
  const auto objective = StudyObjective::of_study(store, o.study);
  const auto candidates = o.per_batch ? best_per_optimizer_and_batch(store.trials(), objective)
                                      : best_per_optimizer(store.trials(), objective);
  if (candidates.empty())
    throw StudyError("study '" + o.study + "' (" + db + ") has no COMPLETE trial to confirm yet " +
                     "(see bertsweep study status " + o.study + ")");
  std::vector<TrialRecord> best;
  for (const auto& t : candidates) {
    if (objective.metric == "final_mlm_accuracy" || t.reached || o.include_unreached) {
      best.push_back(t);
    } else if (!o.quiet) {
      progress << "study confirm " << o.study << ": skipping " << trial_optimizer(t)
               << (o.per_batch ? " batch " + std::to_string(trial_batch(t)) : std::string()) << ": its best trial "
               << t.number << " did not reach the target (--include-unreached runs it anyway)\n";
    }
  }
  if (best.empty())
    throw StudyError("study '" + o.study + "': no trial reached the target yet, so there is no samples-to-target " +
                     "to confirm (run more trials, or pass --include-unreached)");
  return best;
}

std::vector<ConfirmSummary> confirm_session_summary(const std::string& db, int64_t session) {
  std::vector<ConfirmRun> session_runs;
  for (const auto& r : ConfirmStore(db, /*writable=*/false).runs())
    if (r.session == session) session_runs.push_back(r);
  return summarize_confirm(session_runs);
}

std::string confirm_summary_text(const std::vector<ConfirmSummary>& summary) {
  std::ostringstream os;
  os << "optimizer    batch  trial  runs  reached  samples to target (mean +- std)\n";
  for (const auto& s : summary) {
    char head[160];
    std::snprintf(head, sizeof head, "%-12s %5lld  %5lld %5d %8d  ", s.optimizer.c_str(),
                  static_cast<long long>(s.batch), static_cast<long long>(s.source_trial), s.runs, s.reached);
    os << head
       << (s.samples.n ? format_number(s.samples.mean) + " +- " + format_number(s.samples.std) : std::string("-"))
       << "\n";
  }
  return os.str();
}

}  // namespace bs::analysis
