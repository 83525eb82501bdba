#include "analysis/BatchScaling.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>

#include "analysis/Report.h"

namespace bs::analysis {
namespace fs = std::filesystem;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void finish_cell(ScalingCell& c, const std::vector<double>& seconds) {
  std::vector<double> steps;
  for (double s : c.samples) steps.push_back(s / static_cast<double>(c.batch));
  c.samples_stats = stats_of(c.samples, true);
  c.steps_stats = stats_of(steps, true);
  c.seconds_stats = stats_of(seconds, true);
}

}  // namespace

std::vector<ScalingCell> scaling_cells(const std::vector<ConfirmRun>& runs) {
  using Key = std::pair<std::string, int64_t>;
  std::map<Key, int64_t> latest;
  for (const auto& r : runs) {
    auto it = latest.find({r.optimizer, r.batch});
    if (it == latest.end()) latest[{r.optimizer, r.batch}] = r.session;
    else
      it->second = std::max(it->second, r.session);
  }
  std::map<Key, ScalingCell> cells;
  std::map<Key, std::vector<double>> seconds;
  for (const auto& r : runs) {
    const Key key{r.optimizer, r.batch};
    if (r.batch <= 0 || r.session != latest[key]) continue;
    ScalingCell& c = cells[key];
    if (c.runs++ == 0) {
      c.optimizer = r.optimizer;
      c.batch = r.batch;
      c.source_trial = r.source_trial;
      c.config_yaml = r.config_yaml;
    }
    if (!r.reached || !r.samples_to_target) continue;
    ++c.reached;
    c.samples.push_back(*r.samples_to_target);
    if (r.seconds_to_target && *r.seconds_to_target > 0) {
      seconds[key].push_back(*r.seconds_to_target);
      c.samples_sum += *r.samples_to_target;
      c.seconds_sum += *r.seconds_to_target;
    }
  }
  std::vector<ScalingCell> out;
  for (auto& [key, c] : cells) {
    finish_cell(c, seconds[key]);
    out.push_back(std::move(c));
  }
  return out;
}

bool several_batches(const std::vector<ScalingCell>& cells) {
  std::map<std::string, int> batches;
  for (const auto& c : cells)
    if (c.reached > 0 && ++batches[c.optimizer] > 1) return true;
  return false;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const double h = q * static_cast<double>(v.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(h));
  const double w = h - static_cast<double>(lo);
  if (lo + 1 >= v.size() || w == 0) return v[lo];
  if (std::isinf(v[lo]) || std::isinf(v[lo + 1])) return std::isinf(v[lo]) ? v[lo] : v[lo + 1];
  return v[lo] + w * (v[lo + 1] - v[lo]);
}

namespace {

// B_crit of one fit as the interval orders it: +inf for no batch penalty, 0 for E_min <= 0.
double b_crit_value(const CriticalBatchFit& f) {
  switch (f.kind) {
    case CriticalBatchFit::Kind::kFit: return f.b_crit;
    case CriticalBatchFit::Kind::kAboveRange: return kInf;
    case CriticalBatchFit::Kind::kBelowRange: return 0;
    case CriticalBatchFit::Kind::kNone: break;
  }
  return std::nan("");
}

CriticalBatchFit fit_groups(const std::vector<double>& batches, const std::vector<std::vector<double>>& samples) {
  std::vector<double> xs, ys;
  for (std::size_t i = 0; i < batches.size(); ++i)
    for (double y : samples[i]) xs.push_back(batches[i]), ys.push_back(y);
  return fit_critical_batch(xs, ys);
}

}  // namespace

CriticalBatchInterval bootstrap_critical_batch(const std::vector<double>& batches_in,
                                               const std::vector<std::vector<double>>& samples_in,
                                               const BootstrapOptions& o) {
  std::vector<double> batches;
  std::vector<std::vector<double>> samples;
  for (std::size_t i = 0; i < batches_in.size() && i < samples_in.size(); ++i)
    if (!samples_in[i].empty()) batches.push_back(batches_in[i]), samples.push_back(samples_in[i]);
  CriticalBatchInterval c;
  c.level = o.level;
  c.point = fit_groups(batches, samples);
  if (batches.empty() || c.point.kind == CriticalBatchFit::Kind::kNone) return c;
  c.smallest_batch = *std::min_element(batches.begin(), batches.end());
  c.largest_batch = *std::max_element(batches.begin(), batches.end());
  std::mt19937_64 rng(o.seed);
  std::vector<double> crit, e_min, s_min;
  std::vector<std::vector<double>> draw(samples.size());
  for (int r = 0; r < o.replicates; ++r) {
    for (std::size_t i = 0; i < samples.size(); ++i) {
      draw[i].resize(samples[i].size());
      for (auto& x : draw[i]) x = samples[i][rng() % samples[i].size()];
    }
    const CriticalBatchFit f = fit_groups(batches, draw);
    crit.push_back(b_crit_value(f));
    e_min.push_back(f.e_min);
    s_min.push_back(f.s_min);
    c.unbounded += f.kind == CriticalBatchFit::Kind::kAboveRange;
    c.below += f.kind == CriticalBatchFit::Kind::kBelowRange;
  }
  c.replicates = o.replicates;
  const double tail = (1 - o.level) / 2;
  c.b_crit = {percentile(crit, tail), percentile(crit, 1 - tail)};
  c.e_min = {percentile(e_min, tail), percentile(e_min, 1 - tail)};
  c.s_min = {percentile(s_min, tail), percentile(s_min, 1 - tail)};
  return c;
}

CriticalBatchInterval critical_batch_of(const std::vector<ScalingCell>& cells, const std::string& optimizer,
                                        const BootstrapOptions& o) {
  std::vector<double> batches;
  std::vector<std::vector<double>> samples;
  for (const auto& c : cells)
    if (c.optimizer == optimizer && c.reached > 0) {
      batches.push_back(static_cast<double>(c.batch));
      samples.push_back(c.samples);
    }
  return bootstrap_critical_batch(batches, samples, o);
}

std::string format_b_crit(double v, const CriticalBatchInterval& c) {
  if (std::isinf(v)) return "> " + format_number(c.largest_batch);
  if (v <= 0) return "< " + format_number(c.smallest_batch);
  return format_number(std::round(v));
}

std::string format_b_crit_interval(const CriticalBatchInterval& c) {
  if (c.replicates == 0) return "-";
  return "[" + format_b_crit(c.b_crit.lo, c) + ", " + format_b_crit(c.b_crit.hi, c) + "]";
}

double ring_allreduce_seconds(int64_t devices, double grad_bytes, const ClusterModel& m) {
  if (devices <= 1) return 0;
  const double n = static_cast<double>(devices);
  return 2 * (n - 1) / n * grad_bytes / m.link_bytes_per_s + 2 * (n - 1) * m.latency_s;
}

double modelled_step_seconds(int64_t batch, int64_t devices, double samples_per_s, double grad_bytes,
                             const ClusterModel& m) {
  const double local = static_cast<double>(batch) / static_cast<double>(devices);
  return local / samples_per_s + ring_allreduce_seconds(devices, grad_bytes, m);
}

int64_t bert_parameter_count(const ModelConfig& m) {
  const int64_t H = m.hidden, I = m.intermediate, V = m.vocab_size;
  const int64_t embeddings = (V + m.max_position + m.type_vocab_size) * H + 2 * H;  // + LayerNorm
  // qkv 3H^2+3H, output H^2+H, FFN 2HI+I+H, two LayerNorms 4H
  const int64_t layer = 4 * H * H + 2 * H * I + 9 * H + I;
  const int64_t mlm = H * H + H + 2 * H + V;  // transform, LayerNorm, decoder bias (weight tied)
  const int64_t nsp = H * H + H + 2 * H + 2;  // pooler, classifier
  return embeddings + m.layers * layer + mlm + nsp;
}

std::optional<int64_t> vocab_size_of(const TrainConfig& c, std::string& where) {
  if (c.model.vocab_size > 0) {
    where = "model.vocab_size";
    return c.model.vocab_size;
  }
  if (c.data.dir.empty()) {
    where = "model.vocab_size is 0 (from the data) and data.dir is not set";
    return std::nullopt;
  }
  const std::string path = (fs::path(c.data.dir) / "vocab.txt").string();
  std::ifstream in(path);
  if (!in) {
    where = "model.vocab_size is 0 (from the data) and " + path + " cannot be read";
    return std::nullopt;
  }
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  where = path;
  return n;
}

int grad_bytes_per_value(const TrainConfig& c) {
  if (c.distributed.grad_dtype == "compute" && (c.precision == "bf16" || c.precision == "fp16")) return 2;
  return 4;
}

std::optional<double> stored_samples_per_s(const std::vector<ThroughputPoint>& points, int* windows) {
  std::vector<ThroughputPoint> p = points;
  std::stable_sort(p.begin(), p.end(), [](const auto& a, const auto& b) { return a.samples < b.samples; });
  double samples = 0, seconds = 0;
  int64_t prev = 0;
  int n = 0;
  for (const auto& t : p) {
    const int64_t d = t.samples - prev;
    prev = t.samples;
    if (d <= 0 || !(t.samples_per_s > 0) || !std::isfinite(t.samples_per_s)) continue;
    samples += static_cast<double>(d);
    seconds += static_cast<double>(d) / t.samples_per_s;
    ++n;
  }
  if (windows) *windows = n;
  if (n == 0 || seconds <= 0) return std::nullopt;
  return samples / seconds;
}

CellMeasure measure_cell(const ScalingCell& c, const StudyStore& store) {
  CellMeasure m;
  int windows = 0;
  if (auto r = stored_samples_per_s(store.throughput(c.source_trial), &windows)) {
    m.samples_per_s = r;
    m.rate_source = "study trial " + std::to_string(c.source_trial) + " (" + std::to_string(windows) + " windows)";
  } else if (c.seconds_sum > 0) {
    m.samples_per_s = c.samples_sum / c.seconds_sum;
    m.rate_source = "confirm runs (samples / seconds to target)";
  } else {
    m.rate_source = "none stored";
  }
  std::string yaml = c.config_yaml;
  if (yaml.empty())
    if (auto t = store.trial(c.source_trial)) yaml = t->config_yaml;
  if (yaml.empty()) {
    m.parameters_source = "no stored config";
    return m;
  }
  TrainConfig cfg = TrainConfig::read_stored(yaml);
  if (auto v = vocab_size_of(cfg, m.parameters_source)) {
    cfg.model.vocab_size = *v;
    m.parameters = bert_parameter_count(cfg.model);
  }
  m.grad_value_bytes = grad_bytes_per_value(cfg);
  if (m.grad_value_bytes == 2) m.grad_dtype = cfg.precision;
  return m;
}

namespace {

int64_t largest_devices(const std::vector<CellTiming>& cells, const ClusterModel& m) {
  int64_t most = 0;
  for (const auto& c : cells)
    for (int64_t n = 1; c.batch % n == 0 && c.batch / n >= m.min_local_batch; n *= 2) most = std::max(most, n);
  return most;
}

}  // namespace

std::vector<TrainTimeRow> model_time_to_train(const std::vector<CellTiming>& cells, const ClusterModel& m) {
  std::vector<CellTiming> usable;
  for (const auto& c : cells)
    if (c.batch > 0 && c.steps > 0 && c.samples_per_s > 0) usable.push_back(c);
  std::vector<TrainTimeRow> rows;
  const int64_t most = largest_devices(usable, m);
  for (int64_t n = 1; most > 0 && n <= most; n *= 2) {
    TrainTimeRow row;
    row.devices = n;
    for (const auto& c : usable) {
      if (c.batch % n != 0 || c.batch / n < m.min_local_batch) continue;
      const double step = modelled_step_seconds(c.batch, n, c.samples_per_s, c.grad_bytes, m);
      const TrainTimeChoice t{c.batch, step, c.steps * step};
      auto it = row.best.find(c.optimizer);
      if (it == row.best.end() || t.seconds < it->second.seconds) row.best[c.optimizer] = t;
    }
    double best = kInf;
    for (const auto& [opt, t] : row.best)
      if (t.seconds < best) best = t.seconds, row.winner = opt;
    rows.push_back(row);
  }
  return rows;
}

namespace {

bool adam_family(const std::string& o) { return o == "adam" || o == "adamw"; }
bool lamb_family(const std::string& o) { return o == "lamb" || o == "nvlamb" || o == "lans"; }

// The family's cell with the fewest mean samples at `batch` (0: at any batch); nullptr when none reached.
const ScalingCell* best_of(const std::vector<ScalingCell>& cells, bool (*family)(const std::string&), int64_t batch) {
  const ScalingCell* best = nullptr;
  for (const auto& c : cells)
    if (family(c.optimizer) && (batch == 0 || c.batch == batch) && c.reached > 0 &&
        (!best || c.samples_stats.mean < best->samples_stats.mean))
      best = &c;
  return best;
}

std::string describe(const ScalingCell& c, bool with_batch) {
  return c.optimizer + (with_batch ? " at batch " + std::to_string(c.batch) : std::string()) + " " +
         format_number(c.samples_stats.mean) + " +- " + format_number(c.samples_stats.std) + " (" +
         std::to_string(c.reached) + " of " + std::to_string(c.runs) + " reached)";
}

// Whether a (Adam family) needs no more samples than l (LAMB family), by their mean +- std ranges.
std::string verdict(const ScalingCell& a, const ScalingCell& l) {
  if (a.reached < 2 || l.reached < 2) return "inconclusive: fewer than 2 runs reached the target";
  const Stats &x = a.samples_stats, &y = l.samples_stats;
  if (x.mean - x.std <= y.mean + y.std && y.mean - y.std <= x.mean + x.std) return "inconclusive: intervals overlap";
  return x.mean < y.mean ? "holds on this proxy" : "does not hold on this proxy";
}

// The largest batch at which both families have confirmation runs; 0 when there is none.
int64_t largest_common_batch(const std::vector<ScalingCell>& cells) {
  std::set<int64_t> adam, lamb;
  for (const auto& c : cells) {
    if (adam_family(c.optimizer)) adam.insert(c.batch);
    if (lamb_family(c.optimizer)) lamb.insert(c.batch);
  }
  int64_t best = 0;
  for (int64_t b : adam)
    if (lamb.count(b)) best = std::max(best, b);
  return best;
}

std::string at_largest_batch(const std::vector<ScalingCell>& cells) {
  const int64_t b = largest_common_batch(cells);
  if (b == 0) return "No batch size has confirmation runs of both families. ";
  const ScalingCell *a = best_of(cells, adam_family, b), *l = best_of(cells, lamb_family, b);
  std::string s = "At the largest batch both families were confirmed at (" + std::to_string(b) + "): ";
  if (a && l) return s + describe(*a, false) + " vs " + describe(*l, false) + ": " + verdict(*a, *l) + ". ";
  if (a) return s + describe(*a, false) + "; no LAMB-family run reached the target: holds on this proxy. ";
  if (l) return s + describe(*l, false) + "; no Adam-family run reached the target: does not hold on this proxy. ";
  return s + "no run of either family reached the target: inconclusive. ";
}

std::string critical_of(const std::string& opt, const std::map<std::string, CriticalBatchInterval>& critical) {
  auto it = critical.find(opt);
  if (it == critical.end() || it->second.replicates == 0) return opt + " - (one batch size)";
  const auto& c = it->second;
  return opt + " " + format_b_crit(b_crit_value(c.point), c) + " " + format_b_crit_interval(c);
}

}  // namespace

std::string family_statement(const std::vector<ScalingCell>& cells,
                             const std::map<std::string, CriticalBatchInterval>& critical) {
  const ScalingCell *a = best_of(cells, adam_family, 0), *l = best_of(cells, lamb_family, 0);
  std::string s =
      "Does the best Adam-family optimizer (adam, adamw) need no more samples to target than the best LAMB-family "
      "one (lamb, nvlamb, lans)? Criterion: mean +- std over the seeds that reached the target; overlapping "
      "ranges are inconclusive. ";
  if (!a || !l)
    return s + "Not answered: no " + std::string(!a ? "Adam-family" : "LAMB-family") +
           " confirmation run reached the target.";
  s += at_largest_batch(cells);
  s += "At each family's best batch (fewest mean samples): " + describe(*a, true) + " vs " + describe(*l, true) + ": " +
       verdict(*a, *l) + ". ";
  auto it = critical.find(a->optimizer);
  const double level = it != critical.end() ? it->second.level : BootstrapOptions{}.level;
  s += "Critical batch B_crit, fit [" + format_number(100 * level) +
       "% bootstrap interval over seeds]: " + critical_of(a->optimizer, critical) + "; " +
       critical_of(l->optimizer, critical) + ".";
  return s;
}

}  // namespace bs::analysis
