#include "search/StudyConfig.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <filesystem>
#include <regex>
#include <set>

#include "common/TrainConfig.h"

namespace bs::search {

namespace fs = std::filesystem;
using yaml::where;

namespace {

std::vector<std::string> string_or_list(const YAML::Node& n, const std::string& key, const std::string& source) {
  std::vector<std::string> out;
  if (n.IsScalar()) out.push_back(n.Scalar());
  else if (n.IsSequence() && n.size() > 0)
    for (const auto& e : n) {
      if (!e.IsScalar()) throw ConfigError(where(e, source) + ": '" + key + "' entries must be plain values");
      out.push_back(e.Scalar());
    }
  else
    throw ConfigError(where(n, source) + ": '" + key + "' must be a value or a non-empty list");
  return out;
}

std::string scalar(const YAML::Node& n, const std::string& key, const std::string& source) {
  if (!n.IsScalar()) throw ConfigError(where(n, source) + ": '" + key + "' must be a single value");
  return n.Scalar();
}

int64_t integer(const YAML::Node& n, const std::string& key, const std::string& source, int64_t min,
                int64_t max = std::numeric_limits<int64_t>::max()) {
  ParamValue v = parse_scalar(scalar(n, key, source));
  if (!std::holds_alternative<int64_t>(v) || std::get<int64_t>(v) < min)
    throw ConfigError(where(n, source) + ": '" + key + "' must be an integer >= " + std::to_string(min) + ", got '" +
                      n.Scalar() + "'");
  // Counts are stored as int: a larger value would wrap silently (n_trials: 4294967296 became 0).
  if (std::get<int64_t>(v) > max)
    throw ConfigError(where(n, source) + ": '" + key + "' must be an integer <= " + std::to_string(max) + ", got '" +
                      n.Scalar() + "'");
  return std::get<int64_t>(v);
}

std::string one_of(const YAML::Node& n, const std::string& key, const std::string& source,
                   const std::set<std::string>& allowed) {
  std::string v = scalar(n, key, source);
  if (!allowed.count(v)) {
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    throw ConfigError(where(n, source) + ": '" + key + "' is '" + v + "'; must be one of: " + list);
  }
  return v;
}

// A string key whose value must match `re` (it becomes one argument of srun).
std::string matching(const YAML::Node& n, const std::string& key, const std::string& source, const char* re,
                     const char* what) {
  std::string v = scalar(n, key, source);
  if (!std::regex_match(v, std::regex(re)))
    throw ConfigError(where(n, source) + ": '" + key + "' is '" + v + "'; it must be " + what);
  return v;
}

std::string join_ids(const std::vector<std::string>& ids) {
  std::string out;
  for (const auto& id : ids) out += (out.empty() ? "" : ",") + id;
  return out;
}

std::string default_direction(const std::string& objective) {
  return objective == "final_mlm_accuracy" ? "maximize" : "minimize";
}

// Launcher arguments come from a study file that may be someone else's: they are passed as argument vectors
// (never through a shell), and besides may only hold plain characters and no option that names a program
// for mpirun/srun to start (--launch-agent, plm_rsh_agent, --task-prolog, LD_PRELOAD...).
void check_launcher_arg(const std::string& arg, const YAML::Node& n, const std::string& key,
                        const std::string& source) {
  static const std::regex plain("[A-Za-z0-9_.,:=/+@%-]*");
  if (!std::regex_match(arg, plain))
    throw ConfigError(where(n, source) + ": " + key + " '" + arg +
                      "' holds a character outside [A-Za-z0-9_.,:=/+@%-] (shell syntax is not allowed: each list "
                      "item is one argument)");
  for (const char* bad : {"agent", "prolog", "epilog", "LD_PRELOAD", "LD_LIBRARY_PATH", "--exec", "--wrap"})
    if (arg.find(bad) != std::string::npos)
      throw ConfigError(where(n, source) + ": " + key + " '" + arg + "' is not allowed: it would make " +
                        "the launcher start another program");
}
}  // namespace

// Every value a parameter can take is checked against its key before the first trial: a choice of
// `optimizer.name: rmsprop` or `batch.global: [0, -16]` would otherwise fail every trial. Each candidate
// (every choice; low and high of a range) is applied to the base config alone; an error that names this
// key (and no other sampled key) is the space's fault; the rest depends on the combination sampled and is
// left to the trial's own validation.
static void check_space_values(const SearchSpace& space, const TrainConfig& base, const std::string& base_source) {
  for (const auto& p : space.params()) {
    std::vector<std::string> candidates;
    if (p.kind == SpaceParam::Kind::kChoice) {
      for (const auto& v : p.choices) candidates.push_back(to_string(v));
    } else if (p.kind == SpaceParam::Kind::kInt) {
      candidates = {std::to_string(static_cast<int64_t>(p.low)), std::to_string(static_cast<int64_t>(p.high))};
    } else {
      candidates = {to_string(ParamValue(p.low)), to_string(ParamValue(p.high))};
    }
    for (const auto& v : candidates) {
      try {
        TrainConfig one = base;
        one.set(p.key, v, base_source);
        one.validate(base_source);
      } catch (const ConfigError& e) {
        const std::string what = e.what();
        // An error that also names another sampled key depends on the combination (heads vs a sampled hidden).
        bool combination = false;
        for (const auto& other : space.params())
          if (other.key != p.key && what.find(other.key) != std::string::npos) combination = true;
        if (!combination && what.find("'" + p.key + "'") != std::string::npos)
          throw ConfigError(p.where + ": parameter '" + p.key + "' can take the value " + v +
                            ", which the training config refuses: " + what);
      }
    }
  }
}

bool is_valid_study_name(const std::string& name) {
  static const std::regex re("[A-Za-z0-9_.-]+");
  return std::regex_match(name, re) && name != "." && name != "..";
}

bool is_metric_objective(const std::string& name) {
  return name == "samples_to_target" || name == "seconds_to_target" || name == "final_mlm_accuracy";
}

StudyConfig StudyConfig::load(const std::string& path, const std::vector<std::string>& sets) {
  return from_yaml(yaml::load_file(path), path, sets);
}

namespace {

// What the readers of the study keys share while a study file is read.
struct Reading {
  YAML::Node node;                     // the study mapping, with the --set overrides applied
  const std::string& source;           // the file, for errors
  fs::path dir;                        // the study file's folder: base files and the hostfile are relative to it
  std::vector<std::string> base_sets;  // the --set base.KEY=V overrides, as KEY=V
  std::string base_source;             // names the base training config in errors (set when the base is read)
  StudyConfig& c;
};

// Reads one top-level key (given by name) and checks it against the keys read before it. Every reader runs,
// whether or not its key is in the file: defaults and checks between keys live there too.
using ReadKey = void (*)(Reading& r, const std::string& key);
// Writes one top-level key, or nothing when it is not set.
using WriteKey = void (*)(const StudyConfig& c, const char* key, YAML::Emitter& out);

struct StudyKey {
  const char* name;
  ReadKey read;      // nullptr: read together with the key above it
  WriteKey write;    // nullptr: not written (base_config is written as the base it names)
  bool identity;     // written by identity() as well as by to_yaml_string()
  bool listed_last;  // listed after the others in the unknown-key message
};

// ---- the launcher's keys

// Reads one launcher key; `key` is its full name (launcher.NAME), for errors.
using ReadLauncherKey = void (*)(const YAML::Node& v, const std::string& key, const Reading& r, LauncherConfig& l);
using WriteLauncherKey = void (*)(const LauncherConfig& l, const char* name, YAML::Emitter& out);

struct LauncherKey {
  const char* name;
  ReadLauncherKey read;
  WriteLauncherKey write;
  bool slurm;  // only for kind: srun
};

template <auto Member, int64_t Min>
void read_count(const YAML::Node& v, const std::string& key, const Reading& r, LauncherConfig& l) {
  l.*Member = static_cast<int>(integer(v, key, r.source, Min, std::numeric_limits<int>::max()));
}

void read_kind(const YAML::Node& v, const std::string& key, const Reading& r, LauncherConfig& l) {
  l.kind = one_of(v, key, r.source, {"local", "mpirun", "srun"});
}

void read_hostfile(const YAML::Node& v, const std::string& key, const Reading& r, LauncherConfig& l) {
  fs::path h = scalar(v, key, r.source);
  check_launcher_arg(h.string(), v, key, r.source);
  l.hostfile = h.is_absolute() ? h.string() : fs::absolute(r.dir / h).string();
}

void read_extra_args(const YAML::Node& v, const std::string& key, const Reading& r, LauncherConfig& l) {
  l.extra_args = string_or_list(v, key, r.source);
  for (const auto& a : l.extra_args) check_launcher_arg(a, v, key, r.source);
}

void read_gpus(const YAML::Node& g, const std::string& key, const Reading& r, LauncherConfig& l) {
  if (!g.IsSequence() || g.size() == 0)
    throw ConfigError(where(g, r.source) + ": '" + key +
                      "' must be a non-empty list of GPU ids, e.g. "
                      "[0, 1, 2, 3] (leave it out to use every GPU the controller sees)");
  for (const auto& e : g) {
    std::string id = std::to_string(integer(e, key, r.source, 0, std::numeric_limits<int>::max()));
    if (std::find(l.gpus.begin(), l.gpus.end(), id) != l.gpus.end())
      throw ConfigError(where(e, r.source) + ": '" + key + "' lists GPU " + id +
                        " twice; list each GPU once (two trials must never share a GPU)");
    l.gpus.push_back(id);
  }
}

void read_partition(const YAML::Node& v, const std::string& key, const Reading& r, LauncherConfig& l) {
  l.partition = matching(v, key, r.source, "[A-Za-z0-9_.,-]+", "a partition name, or several separated by commas");
}

void read_time_limit(const YAML::Node& v, const std::string& key, const Reading& r, LauncherConfig& l) {
  l.time_limit = matching(v, key, r.source, "([0-9]+-)?[0-9]+(:[0-9]+){0,2}|UNLIMITED|unlimited|INFINITE|infinite",
                          "Slurm's --time format: minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]");
}

void read_mpi(const YAML::Node& v, const std::string& key, const Reading& r, LauncherConfig& l) {
  l.mpi =
      matching(v, key, r.source, "[a-z0-9_]+", "an srun --mpi plugin such as pmix, pmi2 or none (`srun --mpi=list`)");
}

void read_job_name(const YAML::Node& v, const std::string& key, const Reading& r, LauncherConfig& l) {
  l.job_name = matching(v, key, r.source, "[A-Za-z0-9_.{}-]+",
                        "letters, digits, '_', '.', '-', with {study} and {trial} filled in");
}

void read_queue_timeout(const YAML::Node& v, const std::string& key, const Reading& r, LauncherConfig& l) {
  ParamValue p = parse_scalar(scalar(v, key, r.source));
  double t = std::holds_alternative<int64_t>(p)  ? double(std::get<int64_t>(p))
             : std::holds_alternative<double>(p) ? std::get<double>(p)
                                                 : -1;
  if (!(t >= 0) || !std::isfinite(t))
    throw ConfigError(where(v, r.source) + ": '" + key + "' must be seconds >= 0 (0: none), got '" + v.Scalar() + "'");
  l.queue_timeout = t;
}

bool is_set(int v) { return v > 0; }
bool is_set(double v) { return v > 0; }
bool is_set(const std::string& v) { return !v.empty(); }

template <auto Member>
void write_always(const LauncherConfig& l, const char* name, YAML::Emitter& out) {
  out << YAML::Key << name << YAML::Value << l.*Member;
}

// Written only when set (> 0, not empty), so that a stored study from before the key reads back the same.
template <auto Member>
void write_set(const LauncherConfig& l, const char* name, YAML::Emitter& out) {
  if (is_set(l.*Member)) out << YAML::Key << name << YAML::Value << l.*Member;
}

void write_extra_args(const LauncherConfig& l, const char* name, YAML::Emitter& out) {
  if (l.extra_args.empty()) return;
  out << YAML::Key << name << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const auto& a : l.extra_args) out << a;
  out << YAML::EndSeq;
}

void write_gpus(const LauncherConfig& l, const char* name, YAML::Emitter& out) {
  if (l.gpus.empty()) return;  // ints in the YAML, as written
  out << YAML::Key << name << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const auto& g : l.gpus) out << std::stoi(g);
  out << YAML::EndSeq;
}

void write_job_name(const LauncherConfig& l, const char* name, YAML::Emitter& out) {
  if (l.job_name != LauncherConfig().job_name) out << YAML::Key << name << YAML::Value << l.job_name;
}

// The one table of the launcher's keys, in the order they are listed in errors and written.
const std::vector<LauncherKey>& launcher_keys() {
  using L = LauncherConfig;
  static const std::vector<LauncherKey> keys = {
      {"kind", read_kind, write_always<&L::kind>, false},
      {"ranks", read_count<&L::ranks, 1>, write_always<&L::ranks>, false},
      {"hostfile", read_hostfile, write_set<&L::hostfile>, false},
      {"extra_args", read_extra_args, write_extra_args, false},
      {"gpus_per_trial", read_count<&L::gpus_per_trial, 0>, write_set<&L::gpus_per_trial>, false},
      {"gpus", read_gpus, write_gpus, false},
      {"cpus_per_trial", read_count<&L::cpus_per_trial, 1>, write_set<&L::cpus_per_trial>, false},
      {"nodes", read_count<&L::nodes, 1>, write_set<&L::nodes>, true},
      {"ranks_per_node", read_count<&L::ranks_per_node, 1>, write_set<&L::ranks_per_node>, true},
      {"partition", read_partition, write_set<&L::partition>, true},
      {"time_limit", read_time_limit, write_set<&L::time_limit>, true},
      {"mpi", read_mpi, write_set<&L::mpi>, true},
      {"job_name", read_job_name, write_job_name, true},
      {"queue_timeout", read_queue_timeout, write_set<&L::queue_timeout>, true},
  };
  return keys;
}

std::string launcher_keys_text() {
  std::string out;
  for (const auto& k : launcher_keys()) out += (out.empty() ? "" : ", ") + std::string(k.name);
  return out;
}

void check_slurm_keys(YAML::Node& l, const LauncherConfig& launcher, const std::string& source) {
  const bool slurm = launcher.kind == "srun";
  for (const auto& key : launcher_keys()) {
    const char* k = key.name;
    if (key.slurm && l[k] && !slurm)
      throw ConfigError(where(l[k], source) + ": 'launcher." + k +
                        "' is a Slurm key; it needs launcher.kind: "
                        "srun (the launcher is " +
                        launcher.kind + ")");
  }
}

// Ranks, nodes and CPUs must add up.
void check_launcher_layout(YAML::Node& l, const LauncherConfig& launcher, const std::string& source) {
  if (launcher.cpus_per_trial > 0 && launcher.cpus_per_trial % std::max(1, launcher.ranks) != 0)
    throw ConfigError(where(l["cpus_per_trial"], source) + ": launcher.cpus_per_trial (" +
                      std::to_string(launcher.cpus_per_trial) + ") must be a multiple of launcher.ranks (" +
                      std::to_string(launcher.ranks) + "): each rank gets cpus_per_trial / ranks CPUs");
  if (launcher.nodes > 0 && launcher.nodes > launcher.ranks)
    throw ConfigError(where(l["nodes"], source) + ": launcher.nodes (" + std::to_string(launcher.nodes) +
                      ") is more than launcher.ranks (" + std::to_string(launcher.ranks) +
                      "): every node needs at least one rank");
  if (launcher.ranks_per_node > 0 && launcher.nodes > 0 && launcher.ranks_per_node * launcher.nodes != launcher.ranks)
    throw ConfigError(where(l["ranks_per_node"], source) + ": launcher.nodes (" + std::to_string(launcher.nodes) +
                      ") x ranks_per_node (" + std::to_string(launcher.ranks_per_node) +
                      ") must equal launcher.ranks (" + std::to_string(launcher.ranks) + ")");
}

// GPU trials: enough GPUs listed for `parallel` trials, and a base and space that allow device=cuda.
void check_launcher_gpus(YAML::Node& l, const StudyConfig& c, const std::string& source) {
  const int per_trial = c.launcher.gpus_per_trial;
  if (per_trial <= 0) return;
  // The GPUs listed here are checked now; those found on the machine (no `gpus:`) when the controller starts.
  const auto& gpus = c.launcher.gpus;
  if (!gpus.empty() && static_cast<int64_t>(c.parallel) * per_trial > static_cast<int64_t>(gpus.size()))
    throw ConfigError(where(l["gpus_per_trial"], source) + ": parallel (" + std::to_string(c.parallel) +
                      ") x launcher.gpus_per_trial (" + std::to_string(per_trial) + ") needs " +
                      std::to_string(static_cast<int64_t>(c.parallel) * per_trial) + " GPUs but launcher.gpus lists " +
                      std::to_string(gpus.size()) + " (" + join_ids(gpus) +
                      "); lower parallel or gpus_per_trial, or list more GPUs");
  if (yaml::scalar_at(YAML::Load(c.base_yaml), "device") == "cpu")
    throw ConfigError(where(l["gpus_per_trial"], source) + ": launcher.gpus_per_trial is " + std::to_string(per_trial) +
                      " but the base training config says device: cpu; set "
                      "base.device: cuda (or auto), or launcher.gpus_per_trial: 0 for CPU trials");
  for (const auto& p : c.space.params())
    if (p.key == "device")
      throw ConfigError(p.where +
                        ": 'device' cannot be searched when launcher.gpus_per_trial > 0 (GPU trials "
                        "run with device=cuda); remove it from the space or set launcher.gpus_per_trial: 0");
}

void read_launcher(Reading& r, const std::string& key) {
  YAML::Node l = r.node[key];
  if (!l) return;
  if (!l.IsMap())
    throw ConfigError(where(l, r.source) + ": '" + key + "' must be a mapping {" + launcher_keys_text() + "}");
  for (const auto& kv : l) {
    const std::string k = kv.first.Scalar();
    const auto& keys = launcher_keys();
    auto it = std::find_if(keys.begin(), keys.end(), [&](const LauncherKey& lk) { return k == lk.name; });
    if (it == keys.end())
      throw ConfigError(where(kv.first, r.source) + ": unknown key 'launcher." + k +
                        "' (known: " + launcher_keys_text() + ")");
    it->read(kv.second, "launcher." + k, r, r.c.launcher);
  }
  check_slurm_keys(l, r.c.launcher, r.source);
  check_launcher_layout(l, r.c.launcher, r.source);
  check_launcher_gpus(l, r.c, r.source);
}

void write_launcher(const StudyConfig& c, const char* key, YAML::Emitter& out) {
  out << YAML::Key << key << YAML::Value << YAML::BeginMap;
  for (const auto& k : launcher_keys()) k.write(c.launcher, k.name, out);
  out << YAML::EndMap;
}

// ---- the study's other keys

void read_name(Reading& r, const std::string& key) {
  r.c.name = r.node[key] ? scalar(r.node[key], key, r.source) : fs::path(r.source).stem().string();
  if (!is_valid_study_name(r.c.name))
    throw ConfigError(where(r.node[key], r.source) + ": study name '" + r.c.name +
                      "' may only contain letters, digits, '_', '.', '-'");
}

void read_objective(Reading& r, const std::string& key) {
  if (!r.node[key]) return;
  r.c.objectives = string_or_list(r.node[key], key, r.source);
  for (const auto& o : r.c.objectives) {
    if (is_metric_objective(o)) continue;
    if (!TrainConfig::is_key(o))
      throw ConfigError(where(r.node[key], r.source) + ": objective '" + o +
                        "' is neither samples_to_target, seconds_to_target, final_mlm_accuracy nor a training "
                        "config key");
    try {
      TrainConfig().number(o);
    } catch (const ConfigError&) {  // Optuna minimises numbers: optimizer.name has no direction
      throw ConfigError(where(r.node[key], r.source) + ": objective '" + o + "' is not a numeric training key");
    }
  }
}

// One direction per objective (default: maximize accuracy, minimize the rest); then the first objective
// must be a metric.
void read_direction(Reading& r, const std::string& key) {
  StudyConfig& c = r.c;
  c.directions.clear();
  if (r.node[key]) {
    for (const auto& d : string_or_list(r.node[key], key, r.source)) {
      if (d != "minimize" && d != "maximize")
        throw ConfigError(where(r.node[key], r.source) + ": direction '" + d + "' must be minimize or maximize");
      c.directions.push_back(d);
    }
    if (c.directions.size() != c.objectives.size())
      throw ConfigError(where(r.node[key], r.source) + ": give one direction per objective (" +
                        std::to_string(c.objectives.size()) + ")");
  } else {
    for (const auto& o : c.objectives) c.directions.push_back(default_direction(o));
  }
  if (!is_metric_objective(c.objectives[0]))
    throw ConfigError(where(r.node["objective"], r.source) +
                      ": the first objective must be a metric (samples_to_target, seconds_to_target, "
                      "final_mlm_accuracy); config keys may follow it for a multi-objective study");
}

void read_sampler(Reading& r, const std::string& key) {
  if (r.node[key]) r.c.sampler = one_of(r.node[key], key, r.source, {"tpe", "cmaes", "random", "grid", "qmc"});
}

// The pruner (default none for a multi-objective study, else median); then what a multi-objective study
// cannot use.
void read_pruner(Reading& r, const std::string& key) {
  StudyConfig& c = r.c;
  c.pruner = c.multi_objective() ? "none" : "median";
  if (r.node[key]) c.pruner = one_of(r.node[key], key, r.source, {"median", "successive_halving", "hyperband", "none"});
  if (c.multi_objective() && c.pruner != "none")
    throw ConfigError(where(r.node[key], r.source) + ": Optuna cannot prune multi-objective studies; set pruner: none");
  if (c.multi_objective() && c.sampler == "cmaes")
    throw ConfigError(where(r.node["sampler"], r.source) +
                      ": the cmaes sampler is single-objective; use tpe, random, grid or qmc");
}

template <auto Member, int64_t Min>
void read_integer(Reading& r, const std::string& key) {
  using T = std::decay_t<decltype(r.c.*Member)>;
  if (r.node[key])
    r.c.*Member = static_cast<T>(integer(r.node[key], key, r.source, Min, std::numeric_limits<T>::max()));
}

void read_trial_timeout(Reading& r, const std::string& key) {
  if (!r.node[key]) return;
  ParamValue v = parse_scalar(scalar(r.node[key], key, r.source));
  double t = std::holds_alternative<int64_t>(v)  ? double(std::get<int64_t>(v))
             : std::holds_alternative<double>(v) ? std::get<double>(v)
                                                 : -1;
  // NaN passes `t < 0` and would be stored as .nan, which a resume cannot read back.
  if (!(t >= 0) || !std::isfinite(t))
    throw ConfigError(where(r.node[key], r.source) + ": '" + key + "' must be seconds >= 0 (0: none)");
  r.c.trial_timeout = t;
}

// The base training config before validation: inline `base` (whose `extends:` are files relative to the
// study file, merged first) or the file `base_config` names. Sets r.base_source.
YAML::Node merged_base(Reading& r) {
  YAML::Node& node = r.node;
  if (node["base"] && node["base_config"])
    throw ConfigError(where(node["base_config"], r.source) + ": give either base or base_config, not both");
  YAML::Node base(YAML::NodeType::Map);
  r.base_source = r.source + " (base)";
  if (node["base_config"]) {
    fs::path p = r.dir / scalar(node["base_config"], "base_config", r.source);
    base = TrainConfig::load(p.string()).to_yaml();
    r.base_source = p.string();
  } else if (node["base"]) {
    YAML::Node inline_base = YAML::Clone(node["base"]);
    if (!inline_base.IsMap())
      throw ConfigError(where(node["base"], r.source) + ": 'base' must be a training config mapping");
    if (YAML::Node ext = inline_base["extends"]) {
      for (const auto& e : string_or_list(ext, "base.extends", r.source))
        base = yaml::merge(base, TrainConfig::load((r.dir / e).string()).to_yaml());
      inline_base.remove("extends");
    }
    base = yaml::merge(base, inline_base);
  }
  return base;
}

// Reads `base` and `base_config`, and validates the base with the --set base.* overrides applied.
void read_base(Reading& r, const std::string&) {
  YAML::Node base = merged_base(r);
  r.c.base_yaml = TrainConfig::from_yaml(base, r.base_source, r.base_sets).to_yaml_string();
}

void read_stratify(Reading& r, const std::string& key) {
  const StudyConfig& c = r.c;
  if (!r.node[key]) return;
  r.c.stratify = string_or_list(r.node[key], key, r.source);
  std::set<std::string> seen;
  for (const auto& k : c.stratify) {
    const SpaceParam* found = nullptr;
    for (const auto& p : c.space.params())
      if (p.key == k) found = &p;
    if (!found)
      throw ConfigError(where(r.node[key], r.source) + ": stratify key '" + k +
                        "' is not a parameter of 'space' (stratify lists choice parameters to balance)");
    if (found->kind != SpaceParam::Kind::kChoice || !found->when.empty())
      throw ConfigError(where(r.node[key], r.source) + ": stratify key '" + k +
                        "' must be an unconditional choice parameter (no 'when')");
    if (!seen.insert(k).second)
      throw ConfigError(where(r.node[key], r.source) + ": stratify key '" + k + "' is listed twice");
  }
  if (c.sampler == "grid")
    throw ConfigError(where(r.node[key], r.source) +
                      ": the grid sampler already tries every combination; "
                      "remove 'stratify' or use another sampler");
}

// Checked after stratify: the space may search target.max_samples only for the final_mlm_accuracy objective.
void read_stratify_then_check_max_samples(Reading& r, const std::string& key) {
  read_stratify(r, key);
  for (const auto& p : r.c.space.params())
    if (p.key == "target.max_samples" && r.c.objectives[0] != "final_mlm_accuracy")
      throw ConfigError(p.where + ": target.max_samples cannot be searched with objective " + r.c.objectives[0] +
                        " (the penalty for not reaching the target is 2 * max_samples, which must be the same "
                        "for every trial)");
}

template <auto Member>
void write_value(const StudyConfig& c, const char* key, YAML::Emitter& out) {
  out << YAML::Key << key << YAML::Value << c.*Member;
}

// One value as a scalar, several as a flow list.
void emit_list(YAML::Emitter& out, const std::vector<std::string>& v) {
  if (v.size() == 1) {
    out << v[0];
    return;
  }
  out << YAML::Flow << YAML::BeginSeq;
  for (const auto& x : v) out << x;
  out << YAML::EndSeq;
}

template <auto Member>
void write_list(const StudyConfig& c, const char* key, YAML::Emitter& out) {
  out << YAML::Key << key << YAML::Value;
  emit_list(out, c.*Member);
}

void write_stratify(const StudyConfig& c, const char* key, YAML::Emitter& out) {
  if (c.stratify.empty()) return;  // only when set, so that older studies keep their identity
  out << YAML::Key << key << YAML::Value;
  emit_list(out, c.stratify);
}

void write_base(const StudyConfig& c, const char* key, YAML::Emitter& out) {
  out << YAML::Key << key << YAML::Value << YAML::Load(c.base_yaml);
}

}  // namespace

// The study's key table and what in it needs the private members (space and derived as written).
struct StudyConfig::Keys {
  static const std::vector<StudyKey>& table();
  static std::string known_text();
  // Applies the --set overrides to `node`; returns the base.* ones, as KEY=V.
  static std::vector<std::string> apply_sets(YAML::Node& node, const std::vector<std::string>& sets);
  static void reject_unknown(const YAML::Node& node, const std::string& source);
  static void read_space(Reading& r, const std::string& key);

  template <auto Member>
  static void write_as_written(const StudyConfig& c, const char* key, YAML::Emitter& out) {
    if (!(c.*Member).empty()) out << YAML::Key << key << YAML::Value << YAML::Load(c.*Member);
  }
};

// The one table of the study's top-level keys: the unknown-key check, --set, reading and writing all go
// through it. In the order the keys are read (a file with several errors reports the first in this
// order) and written (stored studies' YAML and identity depend on it).
const std::vector<StudyKey>& StudyConfig::Keys::table() {
  using C = StudyConfig;
  static const std::vector<StudyKey> keys = {
      {"name", read_name, write_value<&C::name>, false, false},
      {"objective", read_objective, write_list<&C::objectives>, true, false},
      {"direction", read_direction, write_list<&C::directions>, true, false},
      {"sampler", read_sampler, write_value<&C::sampler>, true, false},
      {"pruner", read_pruner, write_value<&C::pruner>, true, false},
      {"n_trials", read_integer<&C::n_trials, 1>, write_value<&C::n_trials>, false, false},
      {"parallel", read_integer<&C::parallel, 1>, write_value<&C::parallel>, false, false},
      {"seed", read_integer<&C::seed, 0>, write_value<&C::seed>, true, false},
      {"retry_failed", read_integer<&C::retry_failed, 0>, write_value<&C::retry_failed>, false, false},
      {"trial_timeout", read_trial_timeout, write_value<&C::trial_timeout>, false, false},
      {"base", read_base, write_base, true, false},
      {"base_config", nullptr, nullptr, true, false},
      {"space", read_space, write_as_written<&C::space_yaml_>, true, false},
      {"derived", nullptr, write_as_written<&C::derived_yaml_>, true, false},
      // Listed last in the unknown-key message, where it was added; read and written before the launcher.
      {"stratify", read_stratify_then_check_max_samples, write_stratify, true, true},
      {"launcher", read_launcher, write_launcher, false, false},
  };
  return keys;
}

std::string StudyConfig::Keys::known_text() {
  std::string out;
  for (bool last : {false, true})
    for (const auto& k : table())
      if (k.listed_last == last) out += (out.empty() ? "" : ", ") + std::string(k.name);
  return out;
}

std::vector<std::string> StudyConfig::Keys::apply_sets(YAML::Node& node, const std::vector<std::string>& sets) {
  std::vector<std::string> base_sets;
  for (const auto& s : sets) {
    std::string key = s.substr(0, s.find('='));
    if (key.rfind("base.", 0) == 0) {
      base_sets.push_back(s.substr(5));
      continue;
    }
    std::string top = key.substr(0, key.find('.'));
    const auto& t = table();
    if (std::none_of(t.begin(), t.end(), [&](const StudyKey& k) { return top == k.name; }))
      throw ConfigError("--set " + s + ": unknown study key '" + key + "' (base training keys are base.<key.path>)");
    yaml::set_path(node, s, "--set " + key);
  }
  return base_sets;
}

void StudyConfig::Keys::reject_unknown(const YAML::Node& node, const std::string& source) {
  const auto& t = table();
  for (const auto& kv : node) {
    const std::string k = kv.first.Scalar();
    if (std::none_of(t.begin(), t.end(), [&](const StudyKey& key) { return k == key.name; }))
      throw ConfigError(where(kv.first, source) + ": unknown study key '" + k + "' (known: " + known_text() + ")");
  }
}

// Reads `space` and `derived`, tries every value the space can take against the base, and keeps both as
// written (for to_yaml_string()).
void StudyConfig::Keys::read_space(Reading& r, const std::string&) {
  StudyConfig& c = r.c;
  c.space = SearchSpace::from_yaml(r.node["space"], r.node["derived"], r.source);
  check_space_values(c.space, c.base(), r.base_source);
  if (r.node["space"]) c.space_yaml_ = YAML::Dump(r.node["space"]);
  if (r.node["derived"]) c.derived_yaml_ = YAML::Dump(r.node["derived"]);
  if (c.sampler == "grid") {
    if (c.space.empty()) throw ConfigError(r.source + ": the grid sampler needs a non-empty space");
    for (const auto& p : c.space.params()) p.grid_values();  // throws for continuous parameters
  }
}

StudyConfig StudyConfig::from_yaml(const YAML::Node& in, const std::string& source,
                                   const std::vector<std::string>& sets) {
  YAML::Node node = in;
  if (!node.IsMap()) throw ConfigError(source + ": a study config must be a YAML mapping of keys");
  std::vector<std::string> base_sets = Keys::apply_sets(node, sets);
  Keys::reject_unknown(node, source);
  StudyConfig c;
  c.source = source;
  Reading r{node, source, fs::path(source).parent_path(), std::move(base_sets), "", c};
  for (const auto& k : Keys::table())
    if (k.read) k.read(r, k.name);
  return c;
}

TrainConfig StudyConfig::base() const { return TrainConfig::from_yaml(YAML::Load(base_yaml), source + " (base)"); }

// One emitter for both views so that they cannot drift apart: `full` adds what may change between runs of
// the same study (name, budgets, launcher); without it, what defines the study (identity()).
void StudyConfig::emit(YAML::Emitter& out, bool full) const {
  out << YAML::BeginMap;
  for (const auto& k : Keys::table())
    if (k.write && (full || k.identity)) k.write(*this, k.name, out);
  out << YAML::EndMap;
}

std::string StudyConfig::identity() const {
  YAML::Emitter out;
  emit(out, false);
  return std::string(out.c_str()) + "\n";
}

std::string StudyConfig::to_yaml_string() const {
  YAML::Emitter out;
  out.SetDoublePrecision(17);
  emit(out, true);
  return std::string(out.c_str()) + "\n";
}

std::vector<std::map<std::string, ParamValue>> StudyConfig::strata() const {
  std::vector<std::map<std::string, ParamValue>> cells;
  if (stratify.empty()) return cells;
  cells.emplace_back();
  for (const auto& k : stratify) {
    std::vector<ParamValue> values;
    for (const auto& p : space.params())
      if (p.key == k) values = p.choices;
    std::vector<std::map<std::string, ParamValue>> next;
    for (const auto& cell : cells)
      for (const auto& v : values) {
        auto c = cell;
        c[k] = v;
        next.push_back(std::move(c));
      }
    cells = std::move(next);
  }
  return cells;
}

}  // namespace bs::search
