#include "analysis/Report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "analysis/BatchScaling.h"
#include "analysis/ConfirmSummary.h"
#include "analysis/ReportPlots.h"
#include "analysis/StudyTables.h"
#include "studies/ConfigExport.h"
#include "studies/StudyStore.h"

namespace bs::analysis {
namespace fs = std::filesystem;

std::string format_number(double v) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  if (std::fabs(v) < 1e15 && v == std::floor(v)) std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string warmup_text(const ScheduleConfig& schedule) {
  if (schedule.warmup_steps >= 0) return std::to_string(schedule.warmup_steps) + " steps";
  return format_number(schedule.warmup_fraction) + " of the schedule";
}

std::string base64(const std::string& bytes) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    unsigned n = (unsigned char)bytes[i] << 16 | (unsigned char)bytes[i + 1] << 8 | (unsigned char)bytes[i + 2];
    out += {t[n >> 18], t[(n >> 12) & 63], t[(n >> 6) & 63], t[n & 63]};
  }
  if (i + 1 == bytes.size()) {
    unsigned n = (unsigned char)bytes[i] << 16;
    out += {t[n >> 18], t[(n >> 12) & 63], '=', '='};
  } else if (i + 2 == bytes.size()) {
    unsigned n = (unsigned char)bytes[i] << 16 | (unsigned char)bytes[i + 1] << 8;
    out += {t[n >> 18], t[(n >> 12) & 63], t[(n >> 6) & 63], '='};
  }
  return out;
}

namespace {

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string md_cell(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '|' ? std::string("\\|") : std::string(1, c);
  return o;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string opt_num(const std::optional<double>& v) { return v ? format_number(*v) : "-"; }

// One document written twice: Markdown and HTML, in step.
class Document {
 public:
  explicit Document(std::string out_dir) : out_dir_(std::move(out_dir)) {}
  void heading(int level, const std::string& text) {
    md_ += "\n" + std::string(level, '#') + " " + text + "\n\n";
    html_ += "<h" + std::to_string(level) + ">" + html_escape(text) + "</h" + std::to_string(level) + ">\n";
  }
  void para(const std::string& text) {
    md_ += text + "\n\n";
    html_ += "<p>" + html_escape(text) + "</p>\n";
  }
  void table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
    auto md_row = [&](const std::vector<std::string>& r) {
      md_ += "|";
      for (const auto& c : r) md_ += " " + md_cell(c) + " |";
      md_ += "\n";
    };
    md_row(header);
    md_ += "|";
    for (std::size_t i = 0; i < header.size(); ++i) md_ += " --- |";
    md_ += "\n";
    for (const auto& r : rows) md_row(r);
    md_ += "\n";
    html_ += "<table>\n<tr>";
    for (const auto& h : header) html_ += "<th>" + html_escape(h) + "</th>";
    html_ += "</tr>\n";
    for (const auto& r : rows) {
      html_ += "<tr>";
      for (const auto& c : r) html_ += "<td>" + html_escape(c) + "</td>";
      html_ += "</tr>\n";
    }
    html_ += "</table>\n";
  }
  // The PNG is a file next to the report; the HTML embeds it (self-contained) and links the file.
  void image(const std::string& file, const std::string& alt) {
    md_ += "![" + alt + "](" + file + ")\n\n";
    html_ += "<p><a href=\"" + html_escape(file) + "\"><img alt=\"" + html_escape(alt) + "\" data-file=\"" +
             html_escape(file) + "\" src=\"data:image/png;base64," + base64(read_bytes(out_dir_ + "/" + file)) +
             "\"></a></p>\n";
  }
  std::string markdown(const std::string& title) const { return "# " + title + "\n" + md_; }
  std::string html(const std::string& title) const {
    return "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + html_escape(title) +
           "</title>\n<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;}"
           "table{border-collapse:collapse;margin:1em 0;}td,th{border:1px solid #bbb;padding:3px 8px;"
           "text-align:right;}th{background:#eee;}img{max-width:100%;}</style></head><body>\n<h1>" +
           html_escape(title) + "</h1>\n" + html_ + "</body></html>\n";
  }

 private:
  std::string out_dir_, md_, html_;
};

// One study's part of the report: what each section reads, written in the order the sections appear.
struct StudyContext {
  Document& doc;
  const std::string& name;
  const std::string& db;
  const std::string& out_dir;
  ReportFiles& files;
  StudyStore& store;
  const StudyObjective& objective;
  const std::vector<TrialRecord>& trials;
  const ClusterModel& cluster;

  std::string png(const std::string& what) const { return name + "-" + what + ".png"; }
  // The path of a plot file in out_dir, recorded in files.images.
  std::string written(const std::string& file) const {
    files.images.push_back((fs::path(out_dir) / file).string());
    return (fs::path(out_dir) / file).string();
  }
};

void overview_section(const StudyContext& s) {
  const auto counts = count_states(s.trials);
  s.doc.heading(2, "Study " + s.name);
  s.doc.para("File: " + s.db + ". Objective: " + s.objective.metric + " (" +
             (s.objective.minimize ? "minimize" : "maximize") + ").");
  s.doc.table({"trials", "complete", "reached target", "pruned", "failed", "running"},
              {{std::to_string(counts.total), std::to_string(counts.complete), std::to_string(counts.reached),
                std::to_string(counts.pruned), std::to_string(counts.failed), std::to_string(counts.running)}});
}

void optimizer_batch_section(const StudyContext& s) {
  s.doc.heading(3, "Samples to target per optimizer and batch size");
  s.doc.para("Over the COMPLETE trials that reached the target: best, mean and sample standard deviation.");
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : optimizer_batch_table(s.trials)) {
    const bool any = r.samples.n > 0;
    rows.push_back({r.optimizer, r.batch < 0 ? "?" : std::to_string(r.batch), std::to_string(r.trials),
                    std::to_string(r.complete), std::to_string(r.reached), std::to_string(r.pruned),
                    std::to_string(r.failed), any ? format_number(r.samples.best) : "-",
                    any ? format_number(r.samples.mean) : "-", any ? format_number(r.samples.std) : "-",
                    r.best_trial < 0 ? "-" : std::to_string(r.best_trial)});
  }
  s.doc.table({"optimizer", "batch", "trials", "complete", "reached", "pruned", "failed", "best samples", "mean", "std",
               "best trial"},
              rows);
}

// Tuned per batch size (the paper's question): what each cell's best trial chose. Only when some optimizer
// has more than one batch size (more cells than optimizers).
void best_per_cell_section(const StudyContext& s, std::size_t optimizers) {
  const auto cells = best_per_optimizer_and_batch(s.trials, s.objective);
  if (cells.size() <= optimizers) return;
  s.doc.heading(3, "Best trial per optimizer and batch size");
  s.doc.para(
      "The hyperparameters each (optimizer, batch) cell's best trial chose; `study confirm --per-batch` "
      "re-runs these with several seeds.");
  std::vector<std::vector<std::string>> rows;
  for (const auto& t : cells) {
    const TrainConfig c = t.config();
    rows.push_back({trial_optimizer(t), std::to_string(trial_batch(t)), std::to_string(t.number),
                    format_number(c.optimizer.lr), format_number(c.optimizer.beta2),
                    format_number(c.optimizer.weight_decay), warmup_text(c.schedule), t.reached ? "yes" : "no",
                    opt_num(t.samples_to_target)});
  }
  s.doc.table({"optimizer", "batch", "trial", "lr", "beta2", "weight decay", "warmup", "reached", "samples to target"},
              rows);
}

void best_per_optimizer_section(const StudyContext& s, const std::vector<TrialRecord>& best) {
  s.doc.heading(3, "Best trial per optimizer");
  std::vector<std::vector<std::string>> rows;
  std::vector<Curve> curves;
  double target = 0;
  for (const auto& t : best) {
    rows.push_back({trial_optimizer(t), std::to_string(t.number), std::to_string(trial_batch(t)),
                    format_number(t.config().optimizer.lr), t.reached ? "yes" : "no", opt_num(t.samples_to_target),
                    opt_num(t.seconds_to_target), opt_num(t.final_mlm_accuracy)});
    Curve c;
    c.label =
        trial_optimizer(t) + " (trial " + std::to_string(t.number) + ", batch " + std::to_string(trial_batch(t)) + ")";
    for (const auto& e : s.store.evals(t.number)) {
      c.samples.push_back(static_cast<double>(e.samples));
      c.accuracy.push_back(e.mlm_accuracy);
    }
    curves.push_back(c);
    target = t.config().target.mlm_accuracy;
  }
  if (rows.empty()) {
    s.doc.para("No COMPLETE trial yet.");
    return;
  }
  s.doc.table(
      {"optimizer", "trial", "batch", "lr", "reached", "samples to target", "seconds to target", "final accuracy"},
      rows);
  plot_convergence(s.written(s.png("convergence")), curves, target, s.name + ": convergence of the best trials");
  s.doc.image(s.png("convergence"), "eval accuracy vs samples of the best trial per optimizer");
}

void pareto_section(const StudyContext& s) {
  s.doc.heading(3, "Pareto front: samples to target vs batch size");
  const auto points = reached_points(s.trials);
  const auto front = pareto_front(s.trials);
  if (points.empty()) {
    s.doc.para("No trial reached the target.");
    return;
  }
  s.doc.para(
      "A larger batch is better (more parallelism) unless it needs more samples; the front keeps the "
      "trials no other trial beats on both.");
  std::vector<std::vector<std::string>> rows;
  for (const auto& p : front)
    rows.push_back({std::to_string(p.batch), format_number(p.samples_to_target), p.optimizer, std::to_string(p.trial)});
  s.doc.table({"batch", "samples to target", "optimizer", "trial"}, rows);
  plot_pareto(s.written(s.png("pareto")), points, front, s.name + ": samples to target vs batch size");
  s.doc.image(s.png("pareto"), "Pareto front of samples to target vs batch size");
}

void history_section(const StudyContext& s) {
  s.doc.heading(3, "Optimisation history");
  const auto history = optimization_history(s.trials, s.objective);
  if (history.empty()) {
    s.doc.para("No finished trial.");
    return;
  }
  plot_history(s.written(s.png("history")), history, s.objective.metric, s.name + ": optimisation history");
  s.doc.image(s.png("history"), "objective per trial and best so far");
}

void importance_section(const StudyContext& s) {
  s.doc.heading(3, "Hyperparameter importance");
  const std::string imp_png = (fs::path(s.out_dir) / s.png("importance")).string();
  Importance imp = param_importance(fs::absolute(s.db).string(), s.name, imp_png, s.name + ": parameter importance");
  if (!imp.available()) {
    s.doc.para("Not available: " + imp.message + ".");
    return;
  }
  s.files.images.push_back(imp_png);
  std::vector<std::vector<std::string>> rows;
  for (const auto& [k, v] : imp.values) rows.push_back({k, format_number(v)});
  s.doc.para("Optuna's " + imp.evaluator + " over the COMPLETE trials.");
  s.doc.table({"parameter", "importance"}, rows);
  s.doc.image(s.png("importance"), "parameter importance");
}

// The confirmation runs grouped for the plots: per summary row its samples to target, and per optimizer the
// mean +- std series over batch sizes.
struct ConfirmGroups {
  std::vector<std::pair<std::string, std::vector<double>>> groups;
  std::map<std::string, BatchSeries> series;
};

void add_confirm_summary(const ConfirmSummary& s, const std::vector<ConfirmRun>& runs, ConfirmGroups& g) {
  std::vector<double> xs;
  for (const auto& r : runs)
    if (r.optimizer == s.optimizer && r.batch == s.batch && r.session == s.session && r.reached && r.samples_to_target)
      xs.push_back(*r.samples_to_target);
  g.groups.emplace_back(s.batch > 0 ? s.optimizer + " b" + std::to_string(s.batch) : s.optimizer, xs);
  if (s.samples.n > 0 && s.batch > 0) {
    BatchSeries& b = g.series[s.optimizer];
    b.optimizer = s.optimizer;
    b.batch.push_back(static_cast<double>(s.batch));
    b.mean.push_back(s.samples.mean);
    b.std.push_back(s.samples.std);
    b.reached.push_back(s.reached);
  }
}

std::string mean_pm(const Stats& x) { return x.n ? format_number(x.mean) + " +- " + format_number(x.std) : "-"; }
std::string k_of_n(int k, int n) { return std::to_string(k) + " of " + std::to_string(n); }

// Samples and steps to target per (optimizer, batch) over the seeds, as a table and two log-log panels.
void scaling_part(const StudyContext& s, const std::vector<ScalingCell>& cells) {
  s.doc.heading(4, "Samples and steps to target vs batch size");
  s.doc.para(
      "Per confirmed (optimizer, batch) cell: mean +- sample standard deviation over the confirmation seeds; "
      "steps = samples / global batch. Runs that did not reach the target are counted in \"reached\" (k of n) "
      "and left out of the means.");
  std::vector<std::vector<std::string>> rows;
  std::map<std::string, ScalingSeries> series;
  for (const auto& c : cells) {
    rows.push_back({c.optimizer, std::to_string(c.batch), k_of_n(c.reached, c.runs), mean_pm(c.samples_stats),
                    mean_pm(c.steps_stats)});
    if (c.reached == 0) continue;
    ScalingSeries& x = series[c.optimizer];
    x.optimizer = c.optimizer;
    x.batch.push_back(static_cast<double>(c.batch));
    x.samples_mean.push_back(c.samples_stats.mean);
    x.samples_std.push_back(c.samples_stats.std);
    x.steps_mean.push_back(c.steps_stats.mean);
    x.steps_std.push_back(c.steps_stats.std);
    x.reached.push_back(c.reached);
    x.runs.push_back(c.runs);
  }
  s.doc.table({"optimizer", "batch", "reached", "samples to target (mean +- std)", "steps to target (mean +- std)"},
              rows);
  std::vector<ScalingSeries> list;
  for (auto& [opt, x] : series) list.push_back(x);
  plot_batch_scaling(s.written(s.png("batch-scaling")), list, s.name + ": samples and steps to target vs batch size");
  s.doc.image(s.png("batch-scaling"), "samples and steps to target vs batch size per optimizer, mean +- std");
}

std::string point_b_crit(const CriticalBatchInterval& c) {
  switch (c.point.kind) {
    case CriticalBatchFit::Kind::kNone: return "- (one batch size)";
    case CriticalBatchFit::Kind::kFit: return format_number(c.point.b_crit);
    case CriticalBatchFit::Kind::kBelowRange: return "below " + format_number(c.smallest_batch) + " (E_min <= 0)";
    case CriticalBatchFit::Kind::kAboveRange: return "> " + format_number(c.largest_batch) + " (slope <= 0)";
  }
  return "-";
}

std::string interval(const Interval& i) { return "[" + format_number(i.lo) + ", " + format_number(i.hi) + "]"; }

// Critical batch size per optimizer with its bootstrap interval, and the plot over batch sizes.
std::map<std::string, CriticalBatchInterval> critical_batch_part(const StudyContext& s,
                                                                 const std::vector<ScalingCell>& cells,
                                                                 const ConfirmGroups& g) {
  const BootstrapOptions boot;
  s.doc.heading(4, "Critical batch size");
  s.doc.para(
      "E(B) = E_min (1 + B / B_crit) fitted by least squares to the samples to target of every confirmation run "
      "that reached the target (McCandlish et al. 2018). S_min = E_min / B_crit is the fewest optimizer steps; "
      "past B_crit a larger batch mostly buys fewer steps at the cost of more samples. Intervals: " +
      format_number(100 * boot.level) + "% percentile bootstrap over seeds, " + std::to_string(boot.replicates) +
      " replicates (fixed RNG seed " + std::to_string(boot.seed) +
      ") that resample the reached runs with replacement within each batch and refit. A replicate with slope "
      "<= 0 (no measurable batch penalty) has an unbounded B_crit, written \"> largest batch\".");
  std::map<std::string, CriticalBatchInterval> out;
  std::vector<std::vector<std::string>> rows;
  for (const auto& [opt, series] : g.series) {
    const CriticalBatchInterval c = critical_batch_of(cells, opt, boot);
    out[opt] = c;
    const bool boot_ok = c.replicates > 0;
    rows.push_back({opt, std::to_string(c.point.points), format_number(c.point.e_min),
                    boot_ok ? interval(c.e_min) : "-", format_number(c.point.s_min), boot_ok ? interval(c.s_min) : "-",
                    point_b_crit(c), format_b_crit_interval(c), boot_ok ? k_of_n(c.unbounded, c.replicates) : "-"});
  }
  s.doc.table({"optimizer", "runs fitted", "E_min (samples)", "E_min interval", "S_min (steps)", "S_min interval",
               "B_crit", "B_crit interval", "unbounded replicates"},
              rows);
  std::vector<BatchSeries> list;
  for (const auto& [opt, b] : g.series) list.push_back(b);
  plot_confirm_vs_batch(s.written(s.png("confirm")), list, s.name + ": samples to target vs batch size over seeds");
  s.doc.image(s.png("confirm"), "samples to target vs batch size per optimizer, mean +- std over seeds");
  return out;
}

// What the time model takes from the measured part, and what it says about the gradient size.
struct TimingInputs {
  std::vector<CellTiming> cells;
  std::set<std::string> gradients;  // "P parameters x b bytes (dtype)"
  std::set<std::string> unknown;    // why a cell's parameter count is unknown
};

void add_timing(const ScalingCell& c, const CellMeasure& m, TimingInputs& t) {
  if (!m.parameters) {
    t.unknown.insert(c.optimizer + " batch " + std::to_string(c.batch) + ": " + m.parameters_source);
    return;
  }
  if (!m.samples_per_s || c.reached == 0) return;
  const double bytes = static_cast<double>(*m.parameters) * m.grad_value_bytes;
  t.gradients.insert(format_number(static_cast<double>(*m.parameters)) + " parameters x " +
                     std::to_string(m.grad_value_bytes) + " bytes (" + m.grad_dtype +
                     ") = " + format_number(bytes / 1e6) + " MB");
  t.cells.push_back({c.optimizer, c.batch, c.steps_stats.mean, *m.samples_per_s, bytes});
}

// Measured on this machine: seconds to target of the confirmation runs and the per-process throughput.
TimingInputs measured_time_part(const StudyContext& s, const std::vector<ScalingCell>& cells) {
  s.doc.heading(4, "Time to train: measured on this machine");
  s.doc.para(
      "Measured, not modelled: seconds to target of the confirmation runs (mean +- std over the seeds that "
      "reached, evals included) and the per-process training throughput, from the study's stored throughput "
      "windows of the cell's source trial (total samples over total window time) or, where it has none, from "
      "the confirmation runs' samples to target over seconds to target; the last column says which.");
  TimingInputs t;
  std::vector<std::vector<std::string>> rows;
  for (const auto& c : cells) {
    const CellMeasure m = measure_cell(c, s.store);
    rows.push_back({c.optimizer, std::to_string(c.batch), k_of_n(c.reached, c.runs), mean_pm(c.seconds_stats),
                    m.samples_per_s ? format_number(*m.samples_per_s) : "-", m.rate_source});
    add_timing(c, m, t);
  }
  s.doc.table(
      {"optimizer", "batch", "reached", "seconds to target (mean +- std)", "samples/s per process", "throughput from"},
      rows);
  return t;
}

std::string joined(const std::set<std::string>& xs) {
  std::string out;
  for (const auto& x : xs) out += (out.empty() ? "" : "; ") + x;
  return out;
}

std::string model_assumptions(const ClusterModel& m, const TimingInputs& t) {
  return "Modelled, not measured: N devices, each as fast per sample as the measured process (r samples/s of "
         "its cell, assumed constant in the local batch), data parallel with the global batch B split into "
         "local batches B/N (only N dividing B with B/N >= " +
         std::to_string(m.min_local_batch) +
         "), and the steps to target of B unchanged. Step time(N) = (B/N)/r + 2 (N-1)/N G/bw + 2 (N-1) alpha "
         "(ring allreduce, no overlap with compute) with G = " +
         joined(t.gradients) + ", bw = " + format_number(m.link_bytes_per_s / 1e9) +
         " GB/s per device, alpha = " + format_number(m.latency_s * 1e6) +
         " us; time to train(N) = mean steps to target(B) x step time(N), at each optimizer's fastest batch.";
}

void modelled_time_part(const StudyContext& s, const TimingInputs& t) {
  s.doc.heading(4, "Time to train: modelled data-parallel cluster");
  if (!t.unknown.empty()) s.doc.para("Not modelled (parameter count unknown): " + joined(t.unknown) + ".");
  const auto rows = model_time_to_train(t.cells, s.cluster);
  if (rows.empty()) {
    s.doc.para("No cell has a throughput, a gradient size and a batch of at least " +
               std::to_string(s.cluster.min_local_batch) + " to model.");
    return;
  }
  s.doc.para(model_assumptions(s.cluster, t));
  std::set<std::string> optimizers;
  for (const auto& c : t.cells) optimizers.insert(c.optimizer);
  std::vector<std::string> header = {"devices N"};
  for (const auto& o : optimizers) header.push_back(o + ": seconds (batch)");
  header.push_back("fastest");
  std::map<std::string, TrainTimeSeries> series;
  std::vector<std::vector<std::string>> table;
  for (const auto& r : rows) {
    std::vector<std::string> cells = {std::to_string(r.devices)};
    for (const auto& o : optimizers) {
      auto it = r.best.find(o);
      if (it == r.best.end()) {
        cells.push_back("-");
        continue;
      }
      cells.push_back(format_number(it->second.seconds) + " (" + std::to_string(it->second.batch) + ")");
      TrainTimeSeries& x = series[o];
      x.optimizer = o;
      x.devices.push_back(static_cast<double>(r.devices));
      x.seconds.push_back(it->second.seconds);
      x.batch.push_back(static_cast<double>(it->second.batch));
    }
    cells.push_back(r.winner);
    table.push_back(cells);
  }
  s.doc.table(header, table);
  std::vector<TrainTimeSeries> list;
  for (auto& [o, x] : series) list.push_back(x);
  plot_time_to_train(s.written(s.png("time-to-train")), list, s.name + ": modelled time to train vs devices");
  s.doc.image(s.png("time-to-train"), "modelled time to train vs devices per optimizer, labelled with the batch");
}

// The sections of a study confirmed at several batch sizes per optimizer.
void batch_scaling_section(const StudyContext& s, const std::vector<ScalingCell>& cells, const ConfirmGroups& g) {
  scaling_part(s, cells);
  const auto critical = critical_batch_part(s, cells, g);
  modelled_time_part(s, measured_time_part(s, cells));
  s.doc.heading(4, "Adam family vs LAMB family");
  s.doc.para(family_statement(cells, critical));
}

void confirm_section(const StudyContext& s) {
  ConfirmStore confirm(s.db, /*writable=*/false);
  const auto runs = confirm.runs();
  if (runs.empty()) return;
  s.doc.heading(3, "Confirmation runs (study confirm)");
  s.doc.para(
      "The best config of each optimizer (or of each optimizer and batch size, `study confirm "
      "--per-batch`) re-run with several seeds: samples to target over the seeds that reached the target "
      "(latest confirm session of each pair; batch 0 = a run recorded before batches were stored).");
  std::vector<std::vector<std::string>> rows;
  ConfirmGroups g;
  for (const auto& c : summarize_confirm(runs)) {
    rows.push_back({c.optimizer, std::to_string(c.batch), std::to_string(c.source_trial), std::to_string(c.runs),
                    std::to_string(c.reached), mean_pm(c.samples), c.samples.n ? format_number(c.samples.min) : "-",
                    c.samples.n ? format_number(c.samples.max) : "-"});
    add_confirm_summary(c, runs, g);
  }
  s.doc.table({"optimizer", "batch", "source trial", "runs", "reached", "samples mean +- std", "min", "max"}, rows);
  const auto cells = scaling_cells(runs);
  if (several_batches(cells)) {
    batch_scaling_section(s, cells, g);
  } else {
    plot_confirm(s.written(s.png("confirm")), g.groups, s.name + ": samples to target over seeds");
    s.doc.image(s.png("confirm"), "samples to target per optimizer over seeds");
  }
}

void environment_section(const StudyContext& s) {
  s.doc.heading(3, "Environment");
  std::vector<std::vector<std::string>> rows;
  for (const auto& [k, v] : s.store.environment()) rows.push_back({k, v});
  if (rows.empty()) s.doc.para("No environment recorded.");
  else
    s.doc.table({"key", "value"}, rows);
}

void study_section(Document& doc, const std::string& name, const ReportOptions& o, ReportFiles& files) {
  const std::string db = existing_study_db(o.dir, name);
  StudyStore store(db, StudyStore::Mode::kReadOnly);
  const auto objective = StudyObjective::of_study(store, name);
  const auto trials = store.trials();
  const StudyContext s{doc, name, db, o.out_dir, files, store, objective, trials, o.cluster};
  overview_section(s);
  optimizer_batch_section(s);
  const auto best = best_per_optimizer(trials, objective);
  best_per_cell_section(s, best.size());
  best_per_optimizer_section(s, best);
  pareto_section(s);
  history_section(s);
  importance_section(s);
  confirm_section(s);
  environment_section(s);
}

}  // namespace

ReportFiles write_report(const ReportOptions& options) {
  if (options.studies.empty()) throw std::invalid_argument("report: name at least one study");
  // Fail before writing anything: every study present and readable, the output outside every study folder.
  for (const auto& n : options.studies) StudyStore(existing_study_db(options.dir, n), StudyStore::Mode::kReadOnly);
  refuse_output_in_study(options.out_dir, "--out");
  std::error_code ec;
  if (fs::exists(options.out_dir, ec) && !fs::is_directory(options.out_dir, ec))
    throw StudyError("--out " + options.out_dir + " exists and is not a folder; give a folder for the report");
  fs::create_directories(options.out_dir);
  ReportFiles files;
  Document doc(options.out_dir);
  std::string names;
  for (const auto& n : options.studies) names += (names.empty() ? "" : ", ") + n;
  const std::string title = "bertsweep report: " + names;
  for (const auto& n : options.studies) study_section(doc, n, options, files);
  files.markdown = (fs::path(options.out_dir) / "report.md").string();
  files.html = (fs::path(options.out_dir) / "report.html").string();
  std::ofstream(files.markdown) << doc.markdown(title);
  std::ofstream(files.html) << doc.html(title);
  return files;
}

}  // namespace bs::analysis
