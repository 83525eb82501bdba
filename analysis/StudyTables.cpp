#include "analysis/StudyTables.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

namespace bs::analysis {

Stats stats_of(const std::vector<double>& xs, bool minimize) {
  Stats s;
  s.n = static_cast<int>(xs.size());
  if (xs.empty()) return s;
  s.min = *std::min_element(xs.begin(), xs.end());
  s.max = *std::max_element(xs.begin(), xs.end());
  s.best = minimize ? s.min : s.max;
  double sum = 0;
  for (double x : xs) sum += x;
  s.mean = sum / s.n;
  if (s.n > 1) {
    double ss = 0;
    for (double x : xs) ss += (x - s.mean) * (x - s.mean);
    s.std = std::sqrt(ss / (s.n - 1));
  }
  return s;
}

std::string trial_optimizer(const TrialRecord& t) { return t.config_yaml.empty() ? "?" : t.config().optimizer.name; }

int64_t trial_batch(const TrialRecord& t) { return t.config_yaml.empty() ? -1 : t.config().batch.global; }

std::vector<GroupRow> optimizer_batch_table(const std::vector<TrialRecord>& trials) {
  std::map<std::pair<std::string, int64_t>, GroupRow> rows;
  std::map<std::pair<std::string, int64_t>, std::vector<std::pair<double, int64_t>>> samples;
  for (const auto& t : trials) {
    auto key = std::make_pair(trial_optimizer(t), trial_batch(t));
    GroupRow& r = rows[key];
    r.optimizer = key.first;
    r.batch = key.second;
    ++r.trials;
    if (t.state == trial_state::kComplete) {
      ++r.complete;
      if (t.reached && t.samples_to_target) {
        ++r.reached;
        samples[key].emplace_back(*t.samples_to_target, t.number);
      }
    } else if (t.state == trial_state::kPruned) {
      ++r.pruned;
    } else if (t.state == trial_state::kFail) {
      ++r.failed;
    }
  }
  std::vector<GroupRow> out;
  for (auto& [key, r] : rows) {
    auto& v = samples[key];
    std::vector<double> xs;
    for (auto& p : v) xs.push_back(p.first);
    r.samples = stats_of(xs, true);
    if (!v.empty()) r.best_trial = std::min_element(v.begin(), v.end())->second;
    out.push_back(r);
  }
  return out;
}

StateCounts count_states(const std::vector<TrialRecord>& trials) {
  StateCounts c;
  for (const auto& t : trials) {
    ++c.total;
    if (t.state == trial_state::kComplete) {
      ++c.complete;
      if (t.reached) ++c.reached;
    } else if (t.state == trial_state::kPruned) {
      ++c.pruned;
    } else if (t.state == trial_state::kFail) {
      ++c.failed;
    } else if (t.state == trial_state::kRunning) {
      ++c.running;
    }
  }
  return c;
}

std::vector<ParetoPoint> reached_points(const std::vector<TrialRecord>& trials) {
  std::vector<ParetoPoint> pts;
  for (const auto& t : trials)
    if (t.state == trial_state::kComplete && t.reached && t.samples_to_target)
      pts.push_back({t.number, trial_batch(t), *t.samples_to_target, trial_optimizer(t)});
  return pts;
}

std::vector<ParetoPoint> pareto_front(const std::vector<TrialRecord>& trials) {
  auto pts = reached_points(trials);
  std::vector<ParetoPoint> front;
  for (const auto& p : pts) {
    bool dominated = false;
    for (const auto& q : pts) {
      bool no_worse = q.batch >= p.batch && q.samples_to_target <= p.samples_to_target;
      bool better = q.batch > p.batch || q.samples_to_target < p.samples_to_target;
      if (no_worse && better) {
        dominated = true;
        break;
      }
    }
    // Equal points: keep only the lowest trial number.
    bool duplicate = false;
    for (const auto& f : front)
      if (f.batch == p.batch && f.samples_to_target == p.samples_to_target) duplicate = true;
    if (!dominated && !duplicate) front.push_back(p);
  }
  std::sort(front.begin(), front.end(), [](const ParetoPoint& a, const ParetoPoint& b) {
    return a.batch != b.batch ? a.batch < b.batch : a.trial < b.trial;
  });
  return front;
}

std::vector<TrialRecord> best_per_optimizer(const std::vector<TrialRecord>& trials, const StudyObjective& objective) {
  std::map<std::string, TrialRecord> best;
  for (const auto& t : rank_trials(trials, objective)) {
    std::string opt = trial_optimizer(t);
    if (!best.count(opt)) best.emplace(opt, t);
  }
  std::vector<TrialRecord> out;
  for (auto& kv : best) out.push_back(kv.second);
  return out;
}

std::vector<TrialRecord> best_per_optimizer_and_batch(const std::vector<TrialRecord>& trials,
                                                      const StudyObjective& objective) {
  std::map<std::pair<std::string, int64_t>, TrialRecord> best;
  for (const auto& t : rank_trials(trials, objective))
    best.emplace(std::make_pair(trial_optimizer(t), trial_batch(t)), t);
  std::vector<TrialRecord> out;
  for (auto& kv : best) out.push_back(kv.second);
  return out;
}

std::vector<HistoryPoint> optimization_history(const std::vector<TrialRecord>& trials,
                                               const StudyObjective& objective) {
  std::vector<HistoryPoint> out;
  std::optional<double> best;
  for (const auto& t : trials) {
    if (t.state == trial_state::kRunning) continue;
    HistoryPoint h;
    h.trial = t.number;
    h.state = t.state;
    if (t.state == trial_state::kComplete) {
      h.value = objective_value(t, objective);
      if (h.value && (!best || (objective.minimize ? *h.value < *best : *h.value > *best))) best = h.value;
    }
    h.best_so_far = best;
    out.push_back(h);
  }
  return out;
}

CriticalBatchFit fit_critical_batch(const std::vector<double>& batch, const std::vector<double>& samples) {
  CriticalBatchFit f;
  const size_t n = std::min(batch.size(), samples.size());
  f.points = static_cast<int>(n);
  if (n < 2) return f;
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) mx += batch[i], my += samples[i];
  mx /= n, my /= n;
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) sxx += (batch[i] - mx) * (batch[i] - mx), sxy += (batch[i] - mx) * (samples[i] - my);
  if (sxx <= 0) return f;  // one batch size only
  const double b = sxy / sxx, a = my - b * mx;
  f.e_min = a;
  f.s_min = b;
  const double tol = 1e-9 * std::abs(my);  // rounding must not turn "proportional" into a tiny B_crit
  if (b * mx <= tol) f.kind = CriticalBatchFit::Kind::kAboveRange;
  else if (a <= tol)
    f.kind = CriticalBatchFit::Kind::kBelowRange;
  else {
    f.kind = CriticalBatchFit::Kind::kFit;
    f.b_crit = a / b;
  }
  return f;
}

}  // namespace bs::analysis
