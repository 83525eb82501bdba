#include "analysis/Report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

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
                    format_number(static_cast<double>(c.schedule.warmup_steps)), t.reached ? "yes" : "no",
                    opt_num(t.samples_to_target)});
  }
  s.doc.table({"optimizer", "batch", "trial", "lr", "beta2", "warmup steps", "reached", "samples to target"}, rows);
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

// The confirmation runs grouped for the plots: per summary row its samples to target, and per optimizer
// the (batch, samples) points of the critical-batch fit and the mean +- std series over batch sizes.
struct ConfirmGroups {
  std::vector<std::pair<std::string, std::vector<double>>> groups;
  std::map<std::string, BatchSeries> series;
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> fit_points;  // batch, samples
};

void add_confirm_summary(const ConfirmSummary& s, const std::vector<ConfirmRun>& runs, ConfirmGroups& g) {
  std::vector<double> xs;
  for (const auto& r : runs)
    if (r.optimizer == s.optimizer && r.batch == s.batch && r.session == s.session && r.reached && r.samples_to_target)
      xs.push_back(*r.samples_to_target);
  if (s.batch > 0)
    for (double x : xs) {
      g.fit_points[s.optimizer].first.push_back(static_cast<double>(s.batch));
      g.fit_points[s.optimizer].second.push_back(x);
    }
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

// Critical batch size per optimizer, and the plot over batch sizes.
void critical_batch_part(const StudyContext& s, ConfirmGroups& g) {
  s.doc.para(
      "Critical batch size per optimizer: E(B) = E_min (1 + B / B_crit) fitted by least squares to the "
      "samples to target of every confirmation run that reached the target (McCandlish et al. 2018). "
      "S_min = E_min / B_crit is the fewest optimizer steps; past B_crit a larger batch mostly buys "
      "fewer steps at the cost of more samples.");
  std::vector<std::vector<std::string>> fit_rows;
  for (const auto& [opt, b] : g.series) {
    const auto& [bs, es] = g.fit_points[opt];
    const auto f = fit_critical_batch(bs, es);
    std::string crit;
    switch (f.kind) {
      case CriticalBatchFit::Kind::kNone: crit = "- (one batch size)"; break;
      case CriticalBatchFit::Kind::kFit: crit = format_number(f.b_crit); break;
      case CriticalBatchFit::Kind::kBelowRange:
        crit = "below " + format_number(*std::min_element(bs.begin(), bs.end())) + " (samples grow with B)";
        break;
      case CriticalBatchFit::Kind::kAboveRange:
        crit = "above " + format_number(*std::max_element(bs.begin(), bs.end())) + " (no growth seen)";
        break;
    }
    fit_rows.push_back({opt, std::to_string(f.points), format_number(f.e_min), format_number(f.s_min), crit});
  }
  s.doc.table({"optimizer", "runs fitted", "E_min (samples)", "S_min (steps)", "B_crit"}, fit_rows);
  std::vector<BatchSeries> list;
  for (auto& [opt, b] : g.series) list.push_back(b);
  plot_confirm_vs_batch(s.written(s.png("confirm")), list, s.name + ": samples to target vs batch size over seeds");
  s.doc.image(s.png("confirm"), "samples to target vs batch size per optimizer, mean +- std over seeds");
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
                    std::to_string(c.reached),
                    c.samples.n ? format_number(c.samples.mean) + " +- " + format_number(c.samples.std) : "-",
                    c.samples.n ? format_number(c.samples.min) : "-",
                    c.samples.n ? format_number(c.samples.max) : "-"});
    add_confirm_summary(c, runs, g);
  }
  s.doc.table({"optimizer", "batch", "source trial", "runs", "reached", "samples mean +- std", "min", "max"}, rows);
  bool several_batches = false;
  for (const auto& [opt, b] : g.series) several_batches = several_batches || b.batch.size() > 1;
  if (several_batches) {
    critical_batch_part(s, g);
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

void study_section(Document& doc, const std::string& name, const std::string& dir, const std::string& out_dir,
                   ReportFiles& files) {
  const std::string db = existing_study_db(dir, name);
  StudyStore store(db, StudyStore::Mode::kReadOnly);
  const auto objective = StudyObjective::of_study(store, name);
  const auto trials = store.trials();
  const StudyContext s{doc, name, db, out_dir, files, store, objective, trials};
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
  for (const auto& n : options.studies) study_section(doc, n, options.dir, options.out_dir, files);
  files.markdown = (fs::path(options.out_dir) / "report.md").string();
  files.html = (fs::path(options.out_dir) / "report.html").string();
  std::ofstream(files.markdown) << doc.markdown(title);
  std::ofstream(files.html) << doc.html(title);
  return files;
}

}  // namespace bs::analysis
