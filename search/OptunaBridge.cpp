#include "search/OptunaBridge.h"

#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "common/BuildInfo.h"
#include "common/Errors.h"
#include "search/CellSearchSource.h"
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

// The study file the bridge works on (one per process), for error messages.
std::string& bridge_db_path() {
  static std::string path;
  return path;
}

// A Python exception from Optuna or its storage layer (SQLAlchemy, sqlite3), in bertsweep's words: what
// failed, in which file, and the way back. The traceback goes to stderr first, for a bug report, so that the
// user's last line is this message and not Python's.
std::string storage_error_text(const std::string& what, py::error_already_set& e) {
  std::string type, message;
  try {
    py::handle t = e.type();
    type = py::str(t.attr("__module__")).cast<std::string>() + "." + py::str(t.attr("__name__")).cast<std::string>();
    message = py::str(e.value()).cast<std::string>();
  } catch (...) {
    message = e.what();
  }
  message = message.substr(0, message.find('\n'));
  if (auto bg = message.find("(Background on this error"); bg != std::string::npos) message.erase(bg);
  if (message.size() > 200) message = message.substr(0, 200) + "...";
  const std::string& db = bridge_db_path();
  const std::string file = db.empty() ? std::string("the study file") : db;
  std::string cause;
  if (e.matches(PyExc_KeyError))  // "Record does not exist."
    cause = "a study or trial record Optuna expects is missing from " + file + " (the file was edited or damaged)";
  else if (e.matches(PyExc_LookupError) || type == "json.decoder.JSONDecodeError")  // enum value, stored JSON
    cause = "a value in Optuna's tables in " + file + " is not one Optuna knows (" + type + ": " + message +
            "; the file was edited, damaged or written by another Optuna version)";
  else if (type.rfind("sqlalchemy.", 0) == 0 || type.rfind("sqlite3.", 0) == 0 ||
           type == "optuna.exceptions.StorageInternalError" || what == "create_study")
    cause = "Optuna's storage cannot use " + file + " (" + message + ")";
  else  // not the file: a bug (e.g. telling a finished trial), reported with its traceback
    return "Optuna (" + what + ") raised:\n" + python_error_text(e);
  std::cerr << "bertsweep: Optuna's traceback (" << what << "), for a bug report:\n" << python_error_text(e);
  return cause + " during " + what + "; " +
         (db.empty()
              ? std::string("restore the study file from its .bak copy")
              : "restore " + db + ".bak with `cp " + db + ".bak " + db +
                    "`, or recover what SQLite can read with `sqlite3 " + db + " .recover | sqlite3 recovered.db`") +
         " (Optuna's traceback is above)";
}

// Runs `f`, turning a Python exception into a StudyError (exit 7) in bertsweep's words.
template <typename F>
auto guarded(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (py::error_already_set& e) {
    throw StudyError(storage_error_text(what, e));
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
  std::string sampler_kind;            // StudyConfig::sampler
  int64_t seed = 0;                    // StudyConfig::seed
  bool per_cell = false;               // each cell has its own sampler (ask_in_cell)
};

namespace {

// search/cell_search.py, loaded once from the compiled-in source (kept for the process: never destroyed
// after the interpreter, which would crash at exit).
py::object& cell_search() {
  static py::object* mod = [] {
    py::object m = py::module_::import("types").attr("ModuleType")("bs_cell_search");
    py::exec(cell_search_source(), m.attr("__dict__"));
    return new py::object(m);
  }();
  return *mod;
}

int64_t stored_trials(const py::object& optuna, const std::string& name, const py::object& storage) {
  try {
    py::object s = optuna.attr("load_study")(py::arg("study_name") = name, py::arg("storage") = storage);
    return static_cast<int64_t>(py::len(s.attr("get_trials")(py::arg("deepcopy") = false)));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_KeyError)) throw;
  }
  return 0;
}

py::object make_sampler(const py::object& optuna, const StudyConfig& config, int64_t seed_value) {
  py::int_ seed(seed_value);
  py::object samplers = optuna.attr("samplers");
  if (config.sampler == "tpe")
    return samplers.attr("TPESampler")(py::arg("multivariate") = true, py::arg("seed") = seed,
                                       py::arg("constant_liar") = config.parallel > 1);
  if (config.sampler == "cmaes") return samplers.attr("CmaEsSampler")(py::arg("seed") = seed);
  if (config.sampler == "random") return samplers.attr("RandomSampler")(py::arg("seed") = seed);
  if (config.sampler == "qmc") return samplers.attr("QMCSampler")(py::arg("seed") = seed);
  if (config.sampler == "grid") {
    py::dict grid;
    for (const auto& p : config.space.params()) {
      py::list values;
      for (const auto& v : p.grid_values()) values.append(to_python(v));
      grid[py::str(p.key)] = values;
    }
    return samplers.attr("GridSampler")(grid, py::arg("seed") = seed);
  }
  throw std::runtime_error("unknown sampler '" + config.sampler + "'");
}

// A cell's sampler sees only that cell's few trials: TPE models after 3 of them (its default 10 would
// leave an 8-trial cell purely random). No constant liar: running trials stay out of the cell's study.
py::object make_cell_sampler(const py::object& optuna, const std::string& kind, int64_t seed) {
  py::object samplers = optuna.attr("samplers");
  if (kind == "tpe")
    return samplers.attr("TPESampler")(py::arg("n_startup_trials") = 3, py::arg("multivariate") = true,
                                       py::arg("seed") = seed);
  if (kind == "cmaes") return samplers.attr("CmaEsSampler")(py::arg("seed") = seed);
  throw std::logic_error("no per-cell sampler for '" + kind + "'");
}

// A stratified study's median pruner compares a trial only with the trials of its own cell: across
// cells (other batch sizes, other optimizers) is the comparison the study measures.
py::object make_pruner(const py::object& optuna, const StudyConfig& config) {
  py::object pruners = optuna.attr("pruners");
  if (config.pruner == "median" && !config.stratify.empty())
    return cell_search().attr("CellMedianPruner")(config.stratify, py::arg("n_startup_trials") = 2);
  if (config.pruner == "median")
    return pruners.attr("MedianPruner")(py::arg("n_startup_trials") = 2, py::arg("n_warmup_steps") = 0);
  if (config.pruner == "successive_halving") return pruners.attr("SuccessiveHalvingPruner")();
  if (config.pruner == "hyperband") return pruners.attr("HyperbandPruner")();
  return pruners.attr("NopPruner")();
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The cell sampler's seed: the study seed, the cell and how many trials the cell was given, nothing
// else, so that trials of other cells never change a cell's next suggestion. Given, not only finished:
// two running trials of a cell, or a failed trial and the next one, must not draw the same values.
int64_t cell_seed(int64_t seed, const std::map<std::string, ParamValue>& cell, int64_t given) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the cell's "key=value;" text
  for (const auto& kv : cell)
    for (char ch : kv.first + "=" + to_string(kv.second) + ";") {
      h ^= static_cast<unsigned char>(ch);
      h *= 1099511628211ull;
    }
  uint64_t x = splitmix64(splitmix64(static_cast<uint64_t>(seed) ^ h) + static_cast<uint64_t>(given));
  return static_cast<int64_t>(x >> 33);  // numpy's seeds are below 2^32
}

// Answers each parameter from an Optuna trial: suggest_* with the parameter's distribution (a value
// enqueued into that trial comes back as it is).
Suggest suggest_from(const py::object& trial) {
  return [trial](const SpaceParam& p) -> ParamValue {
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
  };
}

py::dict to_python_dict(const std::map<std::string, ParamValue>& params) {
  py::dict d;
  for (const auto& kv : params) d[py::str(kv.first)] = to_python(kv.second);
  return d;
}

}  // namespace

OptunaBridge::OptunaBridge(const std::string& db_path, const StudyConfig& config) : impl_(new Impl) {
  ensure_python();
  bridge_db_path() = std::filesystem::absolute(db_path).string();
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
    py::object sampler = make_sampler(I.optuna, config, config.seed + stored_trials(I.optuna, config.name, storage));
    py::list directions;
    for (const auto& d : config.directions) directions.append(d);
    I.study =
        I.optuna.attr("create_study")(py::arg("study_name") = config.name, py::arg("storage") = storage,
                                      py::arg("sampler") = sampler, py::arg("pruner") = make_pruner(I.optuna, config),
                                      py::arg("directions") = directions, py::arg("load_if_exists") = true);
    I.sampler_kind = config.sampler;
    I.seed = config.seed;
    I.per_cell = !config.stratify.empty() && (config.sampler == "tpe" || config.sampler == "cmaes");
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
    a.params = space.sample(base, suggest_from(trial));
    for (auto kv : py::dict(trial.attr("user_attrs"))) a.user_attrs[text_of(kv.first)] = text_of(kv.second);
    return a;
  });
}

// TPE and CMA-ES model the trials they see; fed the whole study they would hand one cell the values that
// suited another (LAMB the learning rate that suited Adam). So the cell's values are drawn by a fresh
// sampler over an in-memory study of the cell's finished trials only, and then fixed in the study file.
OptunaBridge::Asked OptunaBridge::ask_in_cell(const SearchSpace& space, const TrainConfig& base,
                                              const std::map<std::string, ParamValue>& cell) {
  if (!impl_->per_cell) {  // random, qmc: no model to mislead (and qmc keeps its sequence)
    enqueue(cell, {});
    return ask(space, base);
  }
  auto& I = *impl_;
  py::object cell_study, cell_trial;
  auto params = guarded("ask in cell", [&] {
    py::dict cell_values = to_python_dict(cell);
    py::object history = cell_search().attr("finished_in_cell")(I.study, cell_values);
    const int64_t given = cell_search().attr("started_in_cell")(I.study, cell_values).cast<int64_t>();
    py::object sampler = make_cell_sampler(I.optuna, I.sampler_kind, cell_seed(I.seed, cell, given));
    cell_study = cell_search().attr("cell_study")(I.study, history, sampler);
    cell_study.attr("enqueue_trial")(cell_values);
    cell_trial = cell_study.attr("ask")();
    return space.sample(base, suggest_from(cell_trial));
  });
  // Every value fixed, so that the study file records each parameter with its distribution.
  enqueue(params, {});
  Asked a = ask(space, base);
  if (a.params != params) {
    tell_fail(a.number);
    throw std::logic_error("ask in cell: trial " + std::to_string(a.number) + " got " + params_to_json(a.params) +
                           ", not the cell sampler's " + params_to_json(params));
  }
  guarded("keep cell sampler state",
          [&] { cell_search().attr("keep_sampler_state")(cell_study, cell_trial, I.study, a.number); });
  return a;
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
    py::dict u;
    for (const auto& kv : user_attrs) u[py::str(kv.first)] = kv.second;
    impl_->study.attr("enqueue_trial")(to_python_dict(params), py::arg("user_attrs") = u);
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
