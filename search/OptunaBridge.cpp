#include "search/OptunaBridge.h"

#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include <filesystem>
#include <stdexcept>

#include "common/BuildInfo.h"
#include "search/StudyConfig.h"

namespace py = pybind11;

namespace bs::search {

namespace {

// The Python traceback of the error being handled, as text.
std::string python_error_text(py::error_already_set& e) {
  try {
    py::object tb = py::module_::import("traceback");
    py::list lines = tb.attr("format_exception")(e.type(), e.value(), e.trace());
    std::string out;
    for (auto l : lines) out += l.cast<std::string>();
    return out;
  } catch (...) {
    return e.what();
  }
}

// Runs `f`, turning a Python exception into std::runtime_error("<what>: <traceback>").
template <typename F>
auto guarded(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (py::error_already_set& e) {
    throw std::runtime_error("Optuna (" + what + ") raised:\n" + python_error_text(e));
  }
}

py::object to_python(const ParamValue& v) {
  struct V {
    py::object operator()(int64_t x) const { return py::int_(x); }
    py::object operator()(double x) const { return py::float_(x); }
    py::object operator()(bool x) const { return py::bool_(x); }
    py::object operator()(const std::string& x) const { return py::str(x); }
  };
  return std::visit(V{}, v);
}

ParamValue from_python(const py::handle& o) {
  if (py::isinstance<py::bool_>(o)) return o.cast<bool>();
  if (py::isinstance<py::int_>(o)) return o.cast<int64_t>();
  if (py::isinstance<py::float_>(o)) return o.cast<double>();
  return py::str(o).cast<std::string>();
}

std::string text_of(const py::handle& o) {
  if (py::isinstance<py::str>(o)) return o.cast<std::string>();
  return py::str(o).cast<std::string>();
}

}  // namespace

std::string ensure_python() {
  static const std::string version = [] {
    if (!Py_IsInitialized()) {
      PyConfig config;
      // Isolated: PYTHONHOME/PYTHONPATH of a pyenv shell must not redirect Debian's interpreter.
      PyConfig_InitIsolatedConfig(&config);
      config.install_signal_handlers = 0;  // SIGINT/SIGTERM stay the controller's
      // Compute sys.prefix as /usr/bin/python3 would: its stdlib and dist-packages (optuna).
      PyConfig_SetBytesString(&config, &config.program_name, BERTSWEEP_PYTHON);
      py::initialize_interpreter(&config, 0, nullptr, false);
    }
    return guarded("import optuna", [] {
      py::module_ warnings = py::module_::import("warnings");
      py::module_ optuna = py::module_::import("optuna");
      warnings.attr("filterwarnings")("ignore",
                                      py::arg("category") = optuna.attr("exceptions").attr("ExperimentalWarning"));
      optuna.attr("logging").attr("set_verbosity")(optuna.attr("logging").attr("WARNING"));
      return optuna.attr("__version__").cast<std::string>();
    });
  }();
  return version;
}

std::string python_version() {
  ensure_python();
  std::string v = Py_GetVersion();
  return v.substr(0, v.find(' '));
}

// Hidden, as pybind11 declares its own types: a visible struct holding py::objects warns (-Wattributes).
struct __attribute__((visibility("hidden"))) OptunaBridge::Impl {
  py::module_ optuna;
  py::object study;
  py::object trial_state;              // optuna.trial.TrialState
  std::map<int64_t, py::object> live;  // trials asked in this session
};

OptunaBridge::OptunaBridge(const std::string& db_path, const StudyConfig& config) : impl_(new Impl) {
  ensure_python();
  guarded("create_study", [&] {
    auto& I = *impl_;
    I.optuna = py::module_::import("optuna");
    I.trial_state = I.optuna.attr("trial").attr("TrialState");
    std::string url = "sqlite:///" + std::filesystem::absolute(db_path).string();
    py::dict connect_args;
    connect_args["timeout"] = 30;
    py::dict engine_kwargs;
    engine_kwargs["connect_args"] = connect_args;
    py::object storage =
        I.optuna.attr("storages").attr("RDBStorage")(py::arg("url") = url, py::arg("engine_kwargs") = engine_kwargs);
    // Seed offset by the trials already stored, so that a continued study samples new points.
    int64_t existing = 0;
    try {
      py::object s = I.optuna.attr("load_study")(py::arg("study_name") = config.name, py::arg("storage") = storage);
      existing = py::len(s.attr("get_trials")(py::arg("deepcopy") = false));
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_KeyError)) throw;
    }
    py::int_ seed(config.seed + existing);
    py::object samplers = I.optuna.attr("samplers");
    py::object sampler;
    if (config.sampler == "tpe")
      sampler = samplers.attr("TPESampler")(py::arg("multivariate") = true, py::arg("seed") = seed,
                                            py::arg("constant_liar") = config.parallel > 1);
    else if (config.sampler == "cmaes")
      sampler = samplers.attr("CmaEsSampler")(py::arg("seed") = seed);
    else if (config.sampler == "random")
      sampler = samplers.attr("RandomSampler")(py::arg("seed") = seed);
    else if (config.sampler == "qmc")
      sampler = samplers.attr("QMCSampler")(py::arg("seed") = seed);
    else if (config.sampler == "grid") {
      py::dict grid;
      for (const auto& p : config.space.params()) {
        py::list values;
        for (const auto& v : p.grid_values()) values.append(to_python(v));
        grid[py::str(p.key)] = values;
      }
      sampler = samplers.attr("GridSampler")(grid, py::arg("seed") = seed);
    } else {
      throw std::runtime_error("unknown sampler '" + config.sampler + "'");
    }
    py::object pruners = I.optuna.attr("pruners");
    py::object pruner;
    if (config.pruner == "median")
      pruner = pruners.attr("MedianPruner")(py::arg("n_startup_trials") = 2, py::arg("n_warmup_steps") = 0);
    else if (config.pruner == "successive_halving")
      pruner = pruners.attr("SuccessiveHalvingPruner")();
    else if (config.pruner == "hyperband")
      pruner = pruners.attr("HyperbandPruner")();
    else
      pruner = pruners.attr("NopPruner")();
    py::list directions;
    for (const auto& d : config.directions) directions.append(d);
    I.study = I.optuna.attr("create_study")(py::arg("study_name") = config.name, py::arg("storage") = storage,
                                            py::arg("sampler") = sampler, py::arg("pruner") = pruner,
                                            py::arg("directions") = directions, py::arg("load_if_exists") = true);
  });
}

OptunaBridge::~OptunaBridge() {
  py::gil_scoped_acquire gil;
  impl_.reset();
}

OptunaBridge::Asked OptunaBridge::ask(const SearchSpace& space, const TrainConfig& base) {
  return guarded("ask", [&] {
    py::object trial = impl_->study.attr("ask")();
    Asked a;
    a.number = trial.attr("number").cast<int64_t>();
    impl_->live[a.number] = trial;
    a.params = space.sample(base, [&](const SpaceParam& p) -> ParamValue {
      py::str name(p.key);
      switch (p.kind) {
        case SpaceParam::Kind::kChoice: {
          py::list choices;
          for (const auto& c : p.choices) choices.append(to_python(c));
          return from_python(trial.attr("suggest_categorical")(name, choices));
        }
        case SpaceParam::Kind::kUniform: return from_python(trial.attr("suggest_float")(name, p.low, p.high));
        case SpaceParam::Kind::kLogUniform:
          return from_python(trial.attr("suggest_float")(name, p.low, p.high, py::arg("log") = true));
        case SpaceParam::Kind::kInt:
          if (p.pow2) {
            py::list choices;
            for (const auto& c : p.choices) choices.append(to_python(c));
            return from_python(trial.attr("suggest_categorical")(name, choices));
          }
          return from_python(trial.attr("suggest_int")(name, static_cast<int64_t>(p.low), static_cast<int64_t>(p.high),
                                                       py::arg("step") = p.step, py::arg("log") = p.log));
      }
      throw std::logic_error("unhandled parameter kind");
    });
    for (auto kv : py::dict(trial.attr("user_attrs"))) a.user_attrs[text_of(kv.first)] = text_of(kv.second);
    return a;
  });
}

void OptunaBridge::report(int64_t number, double value, int64_t step) {
  guarded("report", [&] {
    auto it = impl_->live.find(number);
    if (it == impl_->live.end()) throw std::logic_error("report: trial " + std::to_string(number) + " not live");
    it->second.attr("report")(value, py::arg("step") = step);
  });
}

bool OptunaBridge::should_prune(int64_t number) {
  return guarded("should_prune", [&] {
    auto it = impl_->live.find(number);
    if (it == impl_->live.end()) return false;
    return it->second.attr("should_prune")().cast<bool>();
  });
}

namespace {
// GridSampler.after_trial calls study.stop() once the grid is exhausted, which Optuna only allows inside
// study.optimize(); with ask/tell we mark the thread as in the loop (the stop flag is then just unused).
void allow_stop_outside_optimize(py::object& study) {
  py::object local = study.attr("_thread_local");
  if (py::hasattr(local, "in_optimize_loop")) local.attr("in_optimize_loop") = true;
}
}  // namespace

void OptunaBridge::tell_complete(int64_t number, const std::vector<double>& values) {
  guarded("tell", [&] {
    allow_stop_outside_optimize(impl_->study);
    py::list v;
    for (double x : values) v.append(x);
    impl_->study.attr("tell")(number, v);
    impl_->live.erase(number);
  });
}

void OptunaBridge::tell_pruned(int64_t number) {
  guarded("tell pruned", [&] {
    allow_stop_outside_optimize(impl_->study);
    impl_->study.attr("tell")(number, py::arg("state") = impl_->trial_state.attr("PRUNED"));
    impl_->live.erase(number);
  });
}

void OptunaBridge::tell_fail(int64_t number) {
  guarded("tell fail", [&] {
    allow_stop_outside_optimize(impl_->study);
    impl_->study.attr("tell")(number, py::arg("state") = impl_->trial_state.attr("FAIL"));
    impl_->live.erase(number);
  });
}

void OptunaBridge::set_user_attr(int64_t number, const std::string& key, const std::string& value) {
  guarded("set_user_attr", [&] {
    auto it = impl_->live.find(number);
    if (it != impl_->live.end()) {
      it->second.attr("set_user_attr")(key, value);
      return;
    }
    // A trial of an earlier session: through the storage by its id.
    py::object storage = impl_->study.attr("_storage");
    py::object study_id = impl_->study.attr("_study_id");
    py::object trial_id = storage.attr("get_trial_id_from_study_id_trial_number")(study_id, number);
    storage.attr("set_trial_user_attr")(trial_id, key, value);
  });
}

void OptunaBridge::enqueue(const std::map<std::string, ParamValue>& params,
                           const std::map<std::string, std::string>& user_attrs) {
  guarded("enqueue_trial", [&] {
    py::dict p, u;
    for (const auto& kv : params) p[py::str(kv.first)] = to_python(kv.second);
    for (const auto& kv : user_attrs) u[py::str(kv.first)] = kv.second;
    impl_->study.attr("enqueue_trial")(p, py::arg("user_attrs") = u);
  });
}

std::vector<OptunaTrialInfo> OptunaBridge::trials() const {
  return guarded("get_trials", [&] {
    std::vector<OptunaTrialInfo> out;
    for (auto t : impl_->study.attr("get_trials")(py::arg("deepcopy") = false)) {
      OptunaTrialInfo i;
      i.number = t.attr("number").cast<int64_t>();
      i.state = t.attr("state").attr("name").cast<std::string>();
      py::object values = t.attr("values");
      if (!values.is_none())
        for (auto v : values) i.values.push_back(v.cast<double>());
      for (auto kv : py::dict(t.attr("params"))) i.params[text_of(kv.first)] = from_python(kv.second);
      for (auto kv : py::dict(t.attr("user_attrs"))) i.user_attrs[text_of(kv.first)] = text_of(kv.second);
      out.push_back(std::move(i));
    }
    return out;
  });
}

std::map<std::string, int> OptunaBridge::count_by_state() const {
  std::map<std::string, int> out;
  for (const auto& t : trials()) ++out[t.state];
  return out;
}

std::optional<int64_t> OptunaBridge::best_trial_number() const {
  return guarded("best_trial", [&]() -> std::optional<int64_t> {
    try {
      return impl_->study.attr("best_trial").attr("number").cast<int64_t>();
    } catch (py::error_already_set& e) {
      if (e.matches(PyExc_ValueError) || e.matches(PyExc_RuntimeError)) return std::nullopt;
      throw;
    }
  });
}

std::vector<int64_t> OptunaBridge::pareto_front() const {
  return guarded("best_trials", [&] {
    std::vector<int64_t> out;
    for (auto t : impl_->study.attr("best_trials")) out.push_back(t.attr("number").cast<int64_t>());
    return out;
  });
}

}  // namespace bs::search
