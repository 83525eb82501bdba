#include "analysis/ReportPlots.h"

#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include <stdexcept>

#include "analysis/ReportPlotsSource.h"
#include "search/OptunaBridge.h"

namespace py = pybind11;

namespace bs::analysis {

namespace {

// The module, loaded once from the compiled-in source (kept alive for the process: never destroyed after
// the interpreter, which would crash at exit).
py::object& plots_module() {
  static py::object* mod = [] {
    bs::search::ensure_python();
    py::object m = py::module_::import("types").attr("ModuleType")("bs_report_plots");
    py::exec(report_plots_source(), m.attr("__dict__"));
    return new py::object(m);
  }();
  return *mod;
}

template <class F>
auto guarded(const std::string& what, F&& f) -> decltype(f()) {
  try {
    plots_module();  // the interpreter must run before any Python object is made
    return f();
  } catch (const py::error_already_set& e) {
    throw std::runtime_error("report plot '" + what + "' failed in Python: " + std::string(e.what()) +
                             " (needs python3-matplotlib; run scripts/bootstrap)");
  }
}

py::object optional_list(const std::vector<HistoryPoint>& h, bool best) {
  py::list out;
  for (const auto& p : h) {
    const auto& v = best ? p.best_so_far : p.value;
    if (v) out.append(*v);
    else
      out.append(py::none());
  }
  return out;
}

}  // namespace

void plot_convergence(const std::string& png, const std::vector<Curve>& curves, double target,
                      const std::string& title) {
  guarded("convergence", [&] {
    py::list cs;
    for (const auto& c : curves) {
      py::dict d;
      d["label"] = c.label;
      d["samples"] = c.samples;
      d["accuracy"] = c.accuracy;
      cs.append(d);
    }
    plots_module().attr("convergence")(png, cs, target, title);
  });
}

void plot_pareto(const std::string& png, const std::vector<ParetoPoint>& points, const std::vector<ParetoPoint>& front,
                 const std::string& title) {
  guarded("pareto", [&] {
    py::list pts, fr;
    for (const auto& p : points) pts.append(py::make_tuple(p.batch, p.samples_to_target, p.optimizer));
    for (const auto& p : front) fr.append(py::make_tuple(p.batch, p.samples_to_target));
    plots_module().attr("pareto")(png, pts, fr, title);
  });
}

void plot_history(const std::string& png, const std::vector<HistoryPoint>& history, const std::string& metric,
                  const std::string& title) {
  guarded("history", [&] {
    py::list trials, states;
    for (const auto& p : history) {
      trials.append(p.trial);
      states.append(p.state);
    }
    plots_module().attr("history")(png, trials, states, optional_list(history, false), optional_list(history, true),
                                   metric, title);
  });
}

void plot_confirm(const std::string& png, const std::vector<std::pair<std::string, std::vector<double>>>& groups,
                  const std::string& title) {
  guarded("confirm", [&] {
    py::list gs;
    for (const auto& g : groups) gs.append(py::make_tuple(g.first, g.second));
    plots_module().attr("confirm")(png, gs, title);
  });
}

void plot_confirm_vs_batch(const std::string& png, const std::vector<BatchSeries>& series, const std::string& title) {
  guarded("confirm_vs_batch", [&] {
    py::list ss;
    for (const auto& s : series) ss.append(py::make_tuple(s.optimizer, s.batch, s.mean, s.std, s.reached));
    plots_module().attr("confirm_vs_batch")(png, ss, title);
  });
}

void plot_batch_scaling(const std::string& png, const std::vector<ScalingSeries>& series, const std::string& title) {
  guarded("batch_scaling", [&] {
    py::list ss;
    for (const auto& s : series) {
      py::dict d;
      d["optimizer"] = s.optimizer;
      d["batch"] = s.batch;
      d["samples_mean"] = s.samples_mean;
      d["samples_std"] = s.samples_std;
      d["steps_mean"] = s.steps_mean;
      d["steps_std"] = s.steps_std;
      d["reached"] = s.reached;
      d["runs"] = s.runs;
      ss.append(d);
    }
    plots_module().attr("batch_scaling")(png, ss, title);
  });
}

void plot_time_to_train(const std::string& png, const std::vector<TrainTimeSeries>& series, const std::string& title) {
  guarded("time_to_train", [&] {
    py::list ss;
    for (const auto& s : series) ss.append(py::make_tuple(s.optimizer, s.devices, s.seconds, s.batch));
    plots_module().attr("time_to_train")(png, ss, title);
  });
}

Importance param_importance(const std::string& db_path, const std::string& study_name, const std::string& png,
                            const std::string& title) {
  return guarded("importance", [&] {
    Importance imp;
    py::dict r = plots_module().attr("importance")(db_path, study_name, png, title);
    if (r.contains("message")) {
      imp.message = r["message"].cast<std::string>();
      return imp;
    }
    imp.evaluator = r["evaluator"].cast<std::string>();
    imp.values = r["importances"].cast<std::vector<std::pair<std::string, double>>>();
    return imp;
  });
}

}  // namespace bs::analysis
