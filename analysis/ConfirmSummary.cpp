#include <algorithm>
#include <map>

#include "analysis/ConfirmSummary.h"

namespace bs::analysis {

std::vector<ConfirmSummary> summarize_confirm(const std::vector<ConfirmRun>& runs) {
  using Key = std::pair<std::string, int64_t>;
  std::map<Key, int64_t> latest;
  for (const auto& r : runs) {
    auto& l = latest[{r.optimizer, r.batch}];
    l = std::max(l, r.session);
  }
  std::map<Key, ConfirmSummary> groups;
  std::map<Key, std::vector<double>> samples;
  for (const auto& r : runs) {
    const Key key{r.optimizer, r.batch};
    if (r.session != latest[key]) continue;
    ConfirmSummary& s = groups[key];
    s.optimizer = r.optimizer;
    s.batch = r.batch;
    s.source_trial = r.source_trial;
    s.session = r.session;
    ++s.runs;
    if (r.reached && r.samples_to_target) {
      ++s.reached;
      samples[key].push_back(*r.samples_to_target);
    }
  }
  std::vector<ConfirmSummary> out;
  for (auto& [key, s] : groups) {
    s.samples = stats_of(samples[key], true);
    out.push_back(s);
  }
  return out;
}

}  // namespace bs::analysis
