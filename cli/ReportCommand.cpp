// `report`: parse options, call analysis/Report.
#include <cmath>
#include <iostream>

#include "analysis/Report.h"
#include "cli/Args.h"
#include "cli/Commands.h"
#include "common/Errors.h"
#include "common/TrainConfig.h"
#include "studies/ConfigExport.h"

namespace bs::cli {

namespace {
const char* kHelp = R"(usage: bertsweep report NAME [NAME...] --out DIR [--dir studies/]
                        [--link-gbytes-per-s 25] [--link-latency-us 10] [--min-local-batch 4]

Writes DIR/report.md and DIR/report.html for the named studies, with PNG plots as files in DIR
(NAME-convergence.png, NAME-pareto.png, NAME-history.png, NAME-importance.png, NAME-confirm.png, and for a
study confirmed per batch NAME-batch-scaling.png and NAME-time-to-train.png).
report.md links the PNG files; report.html embeds each PNG as base64 (self-contained: it can be mailed
alone) and links the file next to it.

Per study: trial counts by state (complete, reached, pruned, failed); per optimizer x batch size the best,
mean and standard deviation of samples to target; the best trial per optimizer and its convergence curve
(eval accuracy vs samples); the Pareto front of samples to target vs batch size; the optimisation history;
Optuna's hyperparameter importance (fANOVA, else mean decrease impurity, else the reason there is none);
the `study confirm` results (mean +- std over seeds) when present; the environment of the latest session.

A study confirmed at several batch sizes per optimizer (`study confirm --per-batch`) also gets: samples and
steps to target vs batch size; the critical batch per optimizer with a 95% bootstrap interval over seeds;
the measured seconds to target and per-process throughput; a modelled data-parallel time to train on N
devices (each as fast as the measured process, ring allreduce of the gradients); and whether the best
Adam-family optimizer needs no more samples than the best LAMB-family one.

  --link-gbytes-per-s X  the modelled allreduce bandwidth per device, GB/s (default 25: 200 Gb/s HDR)
  --link-latency-us X    the modelled latency per allreduce message, microseconds (default 10)
  --min-local-batch N    model only N devices with global batch / N >= this (default 4)

exit codes: 0 ok, 2 usage error, 7 unknown study
)";

// A number option of at least `min` (above it unless `inclusive`), or `fallback` when absent.
double number_option(const Args& a, const std::string& name, double fallback, double min, bool inclusive) {
  if (!a.has(name)) return fallback;
  double v = 0;
  try {
    std::size_t n = 0;
    v = std::stod(a.get(name), &n);
    if (n != a.get(name).size()) throw std::invalid_argument("trailing");
  } catch (...) {
    throw UsageError("option --" + name + " must be a number, got '" + a.get(name) + "'");
  }
  if (!std::isfinite(v) || v < min || (!inclusive && v == min))
    throw UsageError("option --" + name + " must be " + (inclusive ? "at least " : "above ") +
                     analysis::format_number(min) + ", got " + a.get(name));
  return v;
}

}  // namespace

int report_command(const Argv& args) {
  Args a(args, {"help"});
  if (a.has("help")) {
    std::cout << kHelp;
    return exit_code::kOk;
  }
  a.allow_only({"out", "dir", "help", "link-gbytes-per-s", "link-latency-us", "min-local-batch"});
  if (a.positional().empty()) throw UsageError("give at least one study NAME");
  analysis::ReportOptions o;
  o.studies = a.positional();
  o.dir = a.get("dir", "studies");
  o.out_dir = a.require("out");
  o.cluster.link_bytes_per_s = 1e9 * number_option(a, "link-gbytes-per-s", o.cluster.link_bytes_per_s / 1e9, 0, false);
  o.cluster.latency_s = 1e-6 * number_option(a, "link-latency-us", o.cluster.latency_s * 1e6, 0, true);
  o.cluster.min_local_batch = a.get_int("min-local-batch", o.cluster.min_local_batch);
  if (o.cluster.min_local_batch < 1)
    throw UsageError("option --min-local-batch must be at least 1, got " + a.get("min-local-batch"));
  try {
    const auto files = analysis::write_report(o);
    std::cerr << "bertsweep report: wrote " << files.markdown << ", " << files.html << " and " << files.images.size()
              << " plot(s)\n";
    std::cout << files.html << "\n";
  } catch (const Error& e) {  // an unknown study (7), a bad option or config (2)
    std::cerr << describe(e, "bertsweep report") << "\n";
    return e.exit_code();
  } catch (const std::runtime_error& e) {  // a damaged study file (fs errors name the path)
    std::cerr << "bertsweep report: " << e.what() << "\n";
    return exit_code::kStudy;
  } catch (const std::invalid_argument& e) {  // a stored value that is not a number
    std::cerr << "bertsweep report: a stored value could not be read (" << e.what() << "); the study file is damaged\n";
    return exit_code::kStudy;
  }
  return exit_code::kOk;
}

}  // namespace bs::cli
