#include "search/StudyConfig.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
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
  else throw ConfigError(where(n, source) + ": '" + key + "' must be a value or a non-empty list");
  return out;
}

std::string scalar(const YAML::Node& n, const std::string& key, const std::string& source) {
  if (!n.IsScalar()) throw ConfigError(where(n, source) + ": '" + key + "' must be a single value");
  return n.Scalar();
}

int64_t integer(const YAML::Node& n, const std::string& key, const std::string& source, int64_t min) {
  ParamValue v = parse_scalar(scalar(n, key, source));
  if (!std::holds_alternative<int64_t>(v) || std::get<int64_t>(v) < min)
    throw ConfigError(where(n, source) + ": '" + key + "' must be an integer >= " + std::to_string(min) +
                      ", got '" + n.Scalar() + "'");
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

const std::string kLauncherKeys =
    "kind, ranks, hostfile, extra_args, gpus_per_trial, gpus, cpus_per_trial, nodes, ranks_per_node, partition, "
    "time_limit, mpi, job_name, queue_timeout";

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
void check_launcher_arg(const std::string& arg, const YAML::Node& n, const std::string& key, const std::string& source) {
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
static void check_space_values(const SearchSpace& space, const YAML::Node& base, const std::string& base_source) {
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
        TrainConfig::from_yaml(YAML::Clone(base), base_source, {p.key + "=" + v});
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

StudyConfig StudyConfig::from_yaml(const YAML::Node& in, const std::string& source,
                                   const std::vector<std::string>& sets) {
  YAML::Node node = in;
  if (!node.IsMap()) throw ConfigError(source + ": a study config must be a YAML mapping of keys");
  static const std::set<std::string> known = {"name",    "objective", "direction",     "sampler", "pruner",
                                              "n_trials", "parallel",  "seed",          "retry_failed",
                                              "trial_timeout", "base", "base_config",   "space",   "derived",
                                              "launcher", "stratify"};
  std::vector<std::string> base_sets;
  for (const auto& s : sets) {
    std::string key = s.substr(0, s.find('='));
    if (key.rfind("base.", 0) == 0) {
      base_sets.push_back(s.substr(5));
      continue;
    }
    std::string top = key.substr(0, key.find('.'));
    if (!known.count(top))
      throw ConfigError("--set " + s + ": unknown study key '" + key + "' (base training keys are base.<key.path>)");
    yaml::set_path(node, s, "--set " + key);
  }
  for (const auto& kv : node)
    if (!known.count(kv.first.Scalar()))
      throw ConfigError(where(kv.first, source) + ": unknown study key '" + kv.first.Scalar() +
                        "' (known: name, objective, direction, sampler, pruner, n_trials, parallel, seed, "
                        "retry_failed, trial_timeout, base, base_config, space, derived, launcher, stratify)");

  StudyConfig c;
  c.source = source;
  fs::path dir = fs::path(source).parent_path();
  c.name = node["name"] ? scalar(node["name"], "name", source) : fs::path(source).stem().string();
  if (!is_valid_study_name(c.name))
    throw ConfigError(where(node["name"], source) + ": study name '" + c.name +
                      "' may only contain letters, digits, '_', '.', '-'");

  if (node["objective"]) {
    c.objectives = string_or_list(node["objective"], "objective", source);
    for (const auto& o : c.objectives)
      if (!is_metric_objective(o) && !TrainConfig::is_key(o))
        throw ConfigError(where(node["objective"], source) + ": objective '" + o +
                          "' is neither samples_to_target, seconds_to_target, final_mlm_accuracy nor a training "
                          "config key");
  }
  c.directions.clear();
  if (node["direction"]) {
    for (const auto& d : string_or_list(node["direction"], "direction", source)) {
      if (d != "minimize" && d != "maximize")
        throw ConfigError(where(node["direction"], source) + ": direction '" + d + "' must be minimize or maximize");
      c.directions.push_back(d);
    }
    if (c.directions.size() != c.objectives.size())
      throw ConfigError(where(node["direction"], source) + ": give one direction per objective (" +
                        std::to_string(c.objectives.size()) + ")");
  } else {
    for (const auto& o : c.objectives) c.directions.push_back(default_direction(o));
  }
  if (!is_metric_objective(c.objectives[0]))
    throw ConfigError(where(node["objective"], source) +
                      ": the first objective must be a metric (samples_to_target, seconds_to_target, "
                      "final_mlm_accuracy); config keys may follow it for a multi-objective study");

  if (node["sampler"])
    c.sampler = one_of(node["sampler"], "sampler", source, {"tpe", "cmaes", "random", "grid", "qmc"});
  c.pruner = c.multi_objective() ? "none" : "median";
  if (node["pruner"])
    c.pruner = one_of(node["pruner"], "pruner", source, {"median", "successive_halving", "hyperband", "none"});
  if (c.multi_objective() && c.pruner != "none")
    throw ConfigError(where(node["pruner"], source) +
                      ": Optuna cannot prune multi-objective studies; set pruner: none");
  if (c.multi_objective() && c.sampler == "cmaes")
    throw ConfigError(where(node["sampler"], source) +
                      ": the cmaes sampler is single-objective; use tpe, random, grid or qmc");
  if (node["n_trials"]) c.n_trials = static_cast<int>(integer(node["n_trials"], "n_trials", source, 1));
  if (node["parallel"]) c.parallel = static_cast<int>(integer(node["parallel"], "parallel", source, 1));
  if (node["seed"]) c.seed = integer(node["seed"], "seed", source, 0);
  if (node["retry_failed"])
    c.retry_failed = static_cast<int>(integer(node["retry_failed"], "retry_failed", source, 0));
  if (node["trial_timeout"]) {
    ParamValue v = parse_scalar(scalar(node["trial_timeout"], "trial_timeout", source));
    double t = std::holds_alternative<int64_t>(v) ? double(std::get<int64_t>(v))
               : std::holds_alternative<double>(v) ? std::get<double>(v) : -1;
    if (t < 0)
      throw ConfigError(where(node["trial_timeout"], source) + ": 'trial_timeout' must be seconds >= 0 (0: none)");
    c.trial_timeout = t;
  }

  // The base training config: inline (may `extends:` files relative to the study file) or base_config: path.
  if (node["base"] && node["base_config"])
    throw ConfigError(where(node["base_config"], source) + ": give either base or base_config, not both");
  YAML::Node base(YAML::NodeType::Map);
  std::string base_source = source + " (base)";
  if (node["base_config"]) {
    fs::path p = dir / scalar(node["base_config"], "base_config", source);
    base = TrainConfig::load(p.string()).to_yaml();
    base_source = p.string();
  } else if (node["base"]) {
    YAML::Node inline_base = YAML::Clone(node["base"]);
    if (!inline_base.IsMap())
      throw ConfigError(where(node["base"], source) + ": 'base' must be a training config mapping");
    if (YAML::Node ext = inline_base["extends"]) {
      for (const auto& e : string_or_list(ext, "base.extends", source))
        base = yaml::merge(base, TrainConfig::load((dir / e).string()).to_yaml());
      inline_base.remove("extends");
    }
    base = yaml::merge(base, inline_base);
  }
  c.base_yaml = TrainConfig::from_yaml(base, base_source, base_sets).to_yaml_string();

  c.space = SearchSpace::from_yaml(node["space"], node["derived"], source);
  check_space_values(c.space, YAML::Load(c.base_yaml), base_source);
  if (node["space"]) c.space_yaml_ = YAML::Dump(node["space"]);
  if (node["derived"]) c.derived_yaml_ = YAML::Dump(node["derived"]);
  if (c.sampler == "grid") {
    if (c.space.empty()) throw ConfigError(source + ": the grid sampler needs a non-empty space");
    for (const auto& p : c.space.params()) p.grid_values();  // throws for continuous parameters
  }
  if (node["stratify"]) {
    c.stratify = string_or_list(node["stratify"], "stratify", source);
    std::set<std::string> seen;
    for (const auto& k : c.stratify) {
      const SpaceParam* found = nullptr;
      for (const auto& p : c.space.params())
        if (p.key == k) found = &p;
      if (!found)
        throw ConfigError(where(node["stratify"], source) + ": stratify key '" + k +
                          "' is not a parameter of 'space' (stratify lists choice parameters to balance)");
      if (found->kind != SpaceParam::Kind::kChoice || !found->when.empty())
        throw ConfigError(where(node["stratify"], source) + ": stratify key '" + k +
                          "' must be an unconditional choice parameter (no 'when')");
      if (!seen.insert(k).second)
        throw ConfigError(where(node["stratify"], source) + ": stratify key '" + k + "' is listed twice");
    }
    if (c.sampler == "grid")
      throw ConfigError(where(node["stratify"], source) + ": the grid sampler already tries every combination; "
                        "remove 'stratify' or use another sampler");
  }
  for (const auto& p : c.space.params())
    if (p.key == "target.max_samples" && c.objectives[0] != "final_mlm_accuracy")
      throw ConfigError(p.where + ": target.max_samples cannot be searched with objective " + c.objectives[0] +
                        " (the penalty for not reaching the target is 2 * max_samples, which must be the same "
                        "for every trial)");

  if (YAML::Node l = node["launcher"]) {
    if (!l.IsMap())
      throw ConfigError(where(l, source) +
                        ": 'launcher' must be a mapping {" + kLauncherKeys + "}");
    for (const auto& kv : l) {
      const std::string k = kv.first.Scalar();
      if (k == "kind") c.launcher.kind = one_of(kv.second, "launcher.kind", source, {"local", "mpirun", "srun"});
      else if (k == "ranks") c.launcher.ranks = static_cast<int>(integer(kv.second, "launcher.ranks", source, 1));
      else if (k == "hostfile") {
        fs::path h = scalar(kv.second, "launcher.hostfile", source);
        check_launcher_arg(h.string(), kv.second, "launcher.hostfile", source);
        c.launcher.hostfile = h.is_absolute() ? h.string() : fs::absolute(dir / h).string();
      } else if (k == "extra_args") {
        c.launcher.extra_args = string_or_list(kv.second, "launcher.extra_args", source);
        for (const auto& a : c.launcher.extra_args) check_launcher_arg(a, kv.second, "launcher.extra_args", source);
      } else if (k == "gpus_per_trial") {
        c.launcher.gpus_per_trial = static_cast<int>(integer(kv.second, "launcher.gpus_per_trial", source, 0));
      } else if (k == "gpus") {
        const YAML::Node& g = kv.second;
        if (!g.IsSequence() || g.size() == 0)
          throw ConfigError(where(g, source) + ": 'launcher.gpus' must be a non-empty list of GPU ids, e.g. "
                            "[0, 1, 2, 3] (leave it out to use every GPU the controller sees)");
        for (const auto& e : g) {
          std::string id = std::to_string(integer(e, "launcher.gpus", source, 0));
          if (std::find(c.launcher.gpus.begin(), c.launcher.gpus.end(), id) != c.launcher.gpus.end())
            throw ConfigError(where(e, source) + ": 'launcher.gpus' lists GPU " + id +
                              " twice; list each GPU once (two trials must never share a GPU)");
          c.launcher.gpus.push_back(id);
        }
      } else if (k == "cpus_per_trial") {
        c.launcher.cpus_per_trial = static_cast<int>(integer(kv.second, "launcher.cpus_per_trial", source, 1));
      } else if (k == "nodes") {
        c.launcher.nodes = static_cast<int>(integer(kv.second, "launcher.nodes", source, 1));
      } else if (k == "ranks_per_node") {
        c.launcher.ranks_per_node = static_cast<int>(integer(kv.second, "launcher.ranks_per_node", source, 1));
      } else if (k == "partition") {
        c.launcher.partition = matching(kv.second, "launcher.partition", source, "[A-Za-z0-9_.,-]+",
                                        "a partition name, or several separated by commas");
      } else if (k == "time_limit") {
        c.launcher.time_limit = matching(kv.second, "launcher.time_limit", source,
                                         "([0-9]+-)?[0-9]+(:[0-9]+){0,2}|UNLIMITED|unlimited|INFINITE|infinite",
                                         "Slurm's --time format: minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]");
      } else if (k == "mpi") {
        c.launcher.mpi = matching(kv.second, "launcher.mpi", source, "[a-z0-9_]+",
                                  "an srun --mpi plugin such as pmix, pmi2 or none (`srun --mpi=list`)");
      } else if (k == "job_name") {
        c.launcher.job_name = matching(kv.second, "launcher.job_name", source, "[A-Za-z0-9_.{}-]+",
                                       "letters, digits, '_', '.', '-', with {study} and {trial} filled in");
      } else if (k == "queue_timeout") {
        ParamValue v = parse_scalar(scalar(kv.second, "launcher.queue_timeout", source));
        double t = std::holds_alternative<int64_t>(v) ? double(std::get<int64_t>(v))
                   : std::holds_alternative<double>(v) ? std::get<double>(v) : -1;
        if (!(t >= 0) || !std::isfinite(t))
          throw ConfigError(where(kv.second, source) + ": 'launcher.queue_timeout' must be seconds >= 0 (0: none), "
                            "got '" + kv.second.Scalar() + "'");
        c.launcher.queue_timeout = t;
      } else
        throw ConfigError(where(kv.first, source) + ": unknown key 'launcher." + k + "' (known: " + kLauncherKeys + ")");
    }
    const bool slurm = c.launcher.kind == "srun";
    for (const char* k : {"nodes", "ranks_per_node", "partition", "time_limit", "mpi", "job_name", "queue_timeout"})
      if (l[k] && !slurm)
        throw ConfigError(where(l[k], source) + ": 'launcher." + k + "' is a Slurm key; it needs launcher.kind: "
                          "srun (the launcher is " + c.launcher.kind + ")");
    if (c.launcher.cpus_per_trial > 0 && c.launcher.cpus_per_trial % std::max(1, c.launcher.ranks) != 0)
      throw ConfigError(where(l["cpus_per_trial"], source) + ": launcher.cpus_per_trial (" +
                        std::to_string(c.launcher.cpus_per_trial) + ") must be a multiple of launcher.ranks (" +
                        std::to_string(c.launcher.ranks) + "): each rank gets cpus_per_trial / ranks CPUs");
    if (c.launcher.nodes > 0 && c.launcher.nodes > c.launcher.ranks)
      throw ConfigError(where(l["nodes"], source) + ": launcher.nodes (" + std::to_string(c.launcher.nodes) +
                        ") is more than launcher.ranks (" + std::to_string(c.launcher.ranks) +
                        "): every node needs at least one rank");
    if (c.launcher.ranks_per_node > 0 && c.launcher.nodes > 0 &&
        c.launcher.ranks_per_node * c.launcher.nodes != c.launcher.ranks)
      throw ConfigError(where(l["ranks_per_node"], source) + ": launcher.nodes (" + std::to_string(c.launcher.nodes) +
                        ") x ranks_per_node (" + std::to_string(c.launcher.ranks_per_node) +
                        ") must equal launcher.ranks (" + std::to_string(c.launcher.ranks) + ")");
    const int per_trial = c.launcher.gpus_per_trial;
    if (per_trial > 0) {
      // The GPUs listed here are checked now; those found on the machine (no `gpus:`) when the controller starts.
      if (!c.launcher.gpus.empty() && static_cast<int64_t>(c.parallel) * per_trial >
                                          static_cast<int64_t>(c.launcher.gpus.size()))
        throw ConfigError(where(l["gpus_per_trial"], source) + ": parallel (" + std::to_string(c.parallel) +
                          ") x launcher.gpus_per_trial (" + std::to_string(per_trial) + ") needs " +
                          std::to_string(static_cast<int64_t>(c.parallel) * per_trial) + " GPUs but launcher.gpus lists " +
                          std::to_string(c.launcher.gpus.size()) + " (" + join_ids(c.launcher.gpus) +
                          "); lower parallel or gpus_per_trial, or list more GPUs");
      if (yaml::scalar_at(YAML::Load(c.base_yaml), "device") == "cpu")
        throw ConfigError(where(l["gpus_per_trial"], source) + ": launcher.gpus_per_trial is " +
                          std::to_string(per_trial) + " but the base training config says device: cpu; set "
                          "base.device: cuda (or auto), or launcher.gpus_per_trial: 0 for CPU trials");
      for (const auto& p : c.space.params())
        if (p.key == "device")
          throw ConfigError(p.where + ": 'device' cannot be searched when launcher.gpus_per_trial > 0 (GPU trials "
                            "run with device=cuda); remove it from the space or set launcher.gpus_per_trial: 0");
    }
  }
  return c;
}

YAML::Node StudyConfig::base() const { return YAML::Load(base_yaml); }

namespace {
void emit_list(YAML::Emitter& out, const std::vector<std::string>& v) {
  if (v.size() == 1) {
    out << v[0];
    return;
  }
  out << YAML::Flow << YAML::BeginSeq;
  for (const auto& x : v) out << x;
  out << YAML::EndSeq;
}
}  // namespace

// One emitter for both views so that they cannot drift apart: `full` adds what may change between runs of
// the same study (name, budgets, launcher); without it, what defines the study (identity()).
void StudyConfig::emit(YAML::Emitter& out, bool full) const {
  out << YAML::BeginMap;
  if (full) out << YAML::Key << "name" << YAML::Value << name;
  out << YAML::Key << "objective" << YAML::Value;
  emit_list(out, objectives);
  out << YAML::Key << "direction" << YAML::Value;
  emit_list(out, directions);
  out << YAML::Key << "sampler" << YAML::Value << sampler;
  out << YAML::Key << "pruner" << YAML::Value << pruner;
  if (full) {
    out << YAML::Key << "n_trials" << YAML::Value << n_trials;
    out << YAML::Key << "parallel" << YAML::Value << parallel;
  }
  out << YAML::Key << "seed" << YAML::Value << seed;
  if (full) {
    out << YAML::Key << "retry_failed" << YAML::Value << retry_failed;
    out << YAML::Key << "trial_timeout" << YAML::Value << trial_timeout;
  }
  out << YAML::Key << "base" << YAML::Value << YAML::Load(base_yaml);
  if (!space_yaml_.empty()) out << YAML::Key << "space" << YAML::Value << YAML::Load(space_yaml_);
  if (!derived_yaml_.empty()) out << YAML::Key << "derived" << YAML::Value << YAML::Load(derived_yaml_);
  if (!stratify.empty()) {  // only when set, so that older studies keep their identity
    out << YAML::Key << "stratify" << YAML::Value;
    emit_list(out, stratify);
  }
  if (full) {
    out << YAML::Key << "launcher" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "kind" << YAML::Value << launcher.kind;
    out << YAML::Key << "ranks" << YAML::Value << launcher.ranks;
    if (!launcher.hostfile.empty()) out << YAML::Key << "hostfile" << YAML::Value << launcher.hostfile;
    if (!launcher.extra_args.empty()) {
      out << YAML::Key << "extra_args" << YAML::Value << YAML::Flow << YAML::BeginSeq;
      for (const auto& a : launcher.extra_args) out << a;
      out << YAML::EndSeq;
    }
    if (launcher.gpus_per_trial > 0) out << YAML::Key << "gpus_per_trial" << YAML::Value << launcher.gpus_per_trial;
    if (!launcher.gpus.empty()) {  // ints in the YAML, as written
      out << YAML::Key << "gpus" << YAML::Value << YAML::Flow << YAML::BeginSeq;
      for (const auto& g : launcher.gpus) out << std::stoi(g);
      out << YAML::EndSeq;
    }
    // Slurm keys only when set, so that a stored study from before them reads back the same.
    const LauncherConfig def;
    if (launcher.cpus_per_trial > 0) out << YAML::Key << "cpus_per_trial" << YAML::Value << launcher.cpus_per_trial;
    if (launcher.nodes > 0) out << YAML::Key << "nodes" << YAML::Value << launcher.nodes;
    if (launcher.ranks_per_node > 0) out << YAML::Key << "ranks_per_node" << YAML::Value << launcher.ranks_per_node;
    if (!launcher.partition.empty()) out << YAML::Key << "partition" << YAML::Value << launcher.partition;
    if (!launcher.time_limit.empty()) out << YAML::Key << "time_limit" << YAML::Value << launcher.time_limit;
    if (!launcher.mpi.empty()) out << YAML::Key << "mpi" << YAML::Value << launcher.mpi;
    if (launcher.job_name != def.job_name) out << YAML::Key << "job_name" << YAML::Value << launcher.job_name;
    if (launcher.queue_timeout > 0) out << YAML::Key << "queue_timeout" << YAML::Value << launcher.queue_timeout;
    out << YAML::EndMap;
  }
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
