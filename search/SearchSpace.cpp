#include "search/SearchSpace.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <set>
#include <sstream>

#include "common/JsonWriter.h"
#include "common/TrainConfig.h"

namespace bs::search {

namespace {

using yaml::where;

bool parse_int(const std::string& s, int64_t& out) {
  if (s.empty()) return false;
  std::size_t n = 0;
  try {
    long long v = std::stoll(s, &n);
    if (n != s.size()) return false;
    out = v;
    return true;
  } catch (...) {
    return false;
  }
}

bool parse_double(const std::string& s, double& out) {
  if (s.empty()) return false;
  std::size_t n = 0;
  try {
    out = std::stod(s, &n);
    return n == s.size();
  } catch (...) {
    return false;
  }
}

double number(const YAML::Node& n, const std::string& what, const std::string& source) {
  double v;
  if (!n.IsScalar() || !parse_double(n.Scalar(), v))
    throw ConfigError(where(n, source) + ": " + what + " must be a number" +
                      (n.IsScalar() ? ", got '" + n.Scalar() + "'" : ""));
  return v;
}

// Reads `[low, high]` of a range parameter.
void read_range(const YAML::Node& n, SpaceParam& p, const std::string& kind, const std::string& source) {
  if (!n.IsSequence() || n.size() != 2)
    throw ConfigError(where(n, source) + ": parameter '" + p.key + "': " + kind +
                      " needs [low, high] (a list of two numbers)");
  p.low = number(n[0], "parameter '" + p.key + "': low", source);
  p.high = number(n[1], "parameter '" + p.key + "': high", source);
  if (p.low > p.high)
    throw ConfigError(where(n, source) + ": parameter '" + p.key + "': low (" + to_string(p.low) + ") > high (" +
                      to_string(p.high) + "); swap them");
}

// A derived rule's input: a numeric training key.
double number_at(const TrainConfig& c, const std::string& key, const std::string& source) {
  try {
    return c.number(key);
  } catch (const ConfigError&) {
    throw ConfigError(source + ": derived value needs '" + key + "' to be a number, it is '" + c.text(key) + "'");
  }
}

}  // namespace

std::string to_string(const ParamValue& v) {
  struct V {
    std::string operator()(int64_t x) const { return std::to_string(x); }
    std::string operator()(double x) const {
      std::ostringstream os;
      os.precision(17);
      os << x;
      std::string s = os.str();
      // Keep it a float when read back as YAML ("1" would read as an integer).
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      return s;
    }
    std::string operator()(bool x) const { return x ? "true" : "false"; }
    std::string operator()(const std::string& x) const { return x; }
  };
  return std::visit(V{}, v);
}

ParamValue parse_scalar(const std::string& s) {
  int64_t i;
  if (parse_int(s, i)) return i;
  double d;
  if (parse_double(s, d)) return d;
  if (s == "true" || s == "false") return s == "true";
  return s;
}

std::string params_to_json(const std::map<std::string, ParamValue>& params) {
  JsonWriter w;
  for (const auto& kv : params) {
    struct V {
      JsonWriter& w;
      const std::string& k;
      void operator()(int64_t x) const { w.add(k, x); }
      void operator()(double x) const { w.add(k, x); }
      void operator()(bool x) const { w.add(k, x); }
      void operator()(const std::string& x) const { w.add(k, x); }
    };
    std::visit(V{w, kv.first}, kv.second);
  }
  return w.str();
}

std::vector<ParamValue> SpaceParam::grid_values() const {
  std::vector<ParamValue> out;
  if (kind == Kind::kChoice) return choices;
  if (kind != Kind::kInt)
    throw ConfigError(where + ": parameter '" + key +
                      "' is continuous; the grid sampler needs choice or int parameters");
  if (pow2) {
    for (int64_t v = 1; v <= static_cast<int64_t>(high); v *= 2)
      if (v >= static_cast<int64_t>(low)) out.push_back(v);
  } else {
    for (int64_t v = static_cast<int64_t>(low); v <= static_cast<int64_t>(high); v += step) out.push_back(v);
  }
  return out;
}

namespace {

// `choice: [values]`.
void read_choice(const YAML::Node& v, SpaceParam& p, const std::string& source) {
  p.kind = SpaceParam::Kind::kChoice;
  if (!v.IsSequence() || v.size() == 0)
    throw ConfigError(where(v, source) + ": parameter '" + p.key + "': choice needs a non-empty list of values");
  for (const auto& c : v) {
    if (!c.IsScalar())
      throw ConfigError(where(c, source) + ": parameter '" + p.key + "': choices must be plain values");
    p.choices.push_back(parse_scalar(c.Scalar()));
  }
}

// `uniform | log_uniform | int: [low, high]`.
void read_range_kind(const std::string& k, const YAML::Node& v, SpaceParam& p, const std::string& source) {
  p.kind = k == "uniform"       ? SpaceParam::Kind::kUniform
           : k == "log_uniform" ? SpaceParam::Kind::kLogUniform
                                : SpaceParam::Kind::kInt;
  read_range(v, p, k, source);
  if (p.kind == SpaceParam::Kind::kLogUniform && p.low <= 0)
    throw ConfigError(where(v, source) + ": parameter '" + p.key + "': log_uniform needs low > 0");
  if (p.kind == SpaceParam::Kind::kInt && (std::floor(p.low) != p.low || std::floor(p.high) != p.high))
    throw ConfigError(where(v, source) + ": parameter '" + p.key + "': int bounds must be integers");
}

// `step: N` of an int parameter.
void read_step(const YAML::Node& v, SpaceParam& p, const std::string& source) {
  int64_t st;
  if (!v.IsScalar() || !parse_int(v.Scalar(), st) || st <= 0)
    throw ConfigError(where(v, source) + ": parameter '" + p.key + "': step must be an integer > 0");
  p.step = st;
}

// `pow2: true|false`, `log: true|false` of an int parameter.
void read_flag(const std::string& k, const YAML::Node& v, SpaceParam& p, const std::string& source) {
  if (!v.IsScalar() || (v.Scalar() != "true" && v.Scalar() != "false"))
    throw ConfigError(where(v, source) + ": parameter '" + p.key + "': " + k + " must be true or false");
  (k == "pow2" ? p.pow2 : p.log) = v.Scalar() == "true";
}

// `when: {key.path: value or [values], ...}`.
void read_when(const YAML::Node& v, SpaceParam& p, const std::string& source) {
  if (!v.IsMap() || v.size() == 0)
    throw ConfigError(where(v, source) + ": parameter '" + p.key +
                      "': when must be a mapping {key.path: value or [values]}");
  for (const auto& c : v) {
    Condition cond;
    cond.key = c.first.Scalar();
    if (!TrainConfig::is_key(cond.key))
      throw ConfigError(where(c.first, source) + ": parameter '" + p.key + "': condition key '" + cond.key +
                        "' is not a training config key");
    if (cond.key == p.key)
      throw ConfigError(where(c.first, source) + ": parameter '" + p.key + "' cannot depend on itself");
    if (c.second.IsScalar()) cond.values.push_back(c.second.Scalar());
    else if (c.second.IsSequence())
      for (const auto& x : c.second) {
        // yaml-cpp gives "" for the Scalar() of a list or map: refuse it rather than match an empty value.
        if (!x.IsScalar())
          throw ConfigError(where(x, source) + ": parameter '" + p.key + "': condition on '" + cond.key +
                            "': each listed value must be a plain value, not a list or mapping");
        cond.values.push_back(x.Scalar());
      }
    else
      throw ConfigError(where(c.second, source) + ": parameter '" + p.key + "': condition on '" + cond.key +
                        "' must be a value or a list of values");
    p.when.push_back(cond);
  }
}

// One clause of a parameter's mapping; counts the kind clauses (choice, uniform, log_uniform, int) in `kinds`.
void read_clause(const YAML::Node& name, const YAML::Node& v, SpaceParam& p, int& kinds, const std::string& source) {
  const std::string k = name.Scalar();
  if (k == "choice") {
    ++kinds;
    read_choice(v, p, source);
  } else if (k == "uniform" || k == "log_uniform" || k == "int") {
    ++kinds;
    read_range_kind(k, v, p, source);
  } else if (k == "step") {
    read_step(v, p, source);
  } else if (k == "pow2" || k == "log") {
    read_flag(k, v, p, source);
  } else if (k == "when") {
    read_when(v, p, source);
  } else {
    throw ConfigError(where(name, source) + ": parameter '" + p.key + "': unknown key '" + k +
                      "' (expected choice, uniform, log_uniform, int, step, pow2, log, when)");
  }
}

// One entry of `space:`, `key.path: {clauses}`.
SpaceParam read_param(const YAML::Node& key, const YAML::Node& d, const std::set<std::string>& declared,
                      const std::string& source) {
  SpaceParam p;
  p.key = key.Scalar();
  p.where = where(key, source);
  if (!TrainConfig::is_key(p.key))
    throw ConfigError(p.where + ": space parameter '" + p.key +
                      "' is not a training config key (keys are paths like optimizer.lr; see "
                      "`bertsweep train --help`)");
  if (declared.count(p.key)) throw ConfigError(p.where + ": parameter '" + p.key + "' is declared twice");
  if (!d.IsMap())
    throw ConfigError(where(d, source) + ": parameter '" + p.key +
                      "' must be a mapping like {choice: [...]} or {uniform: [lo, hi]}");
  int kinds = 0;
  for (const auto& e : d) read_clause(e.first, e.second, p, kinds, source);
  if (kinds != 1)
    throw ConfigError(p.where + ": parameter '" + p.key + "' needs exactly one of choice, uniform, log_uniform, int");
  if ((p.pow2 || p.log || p.step != 1) && p.kind != SpaceParam::Kind::kInt)
    throw ConfigError(p.where + ": parameter '" + p.key + "': step, pow2 and log apply to int parameters only");
  if (p.pow2 && p.grid_values().empty())
    throw ConfigError(p.where + ": parameter '" + p.key + "': no power of two lies in [" + to_string(p.low) + ", " +
                      to_string(p.high) + "]");
  if (p.kind == SpaceParam::Kind::kInt && p.log && p.low <= 0)
    throw ConfigError(p.where + ": parameter '" + p.key + "': log needs low > 0");
  if (p.pow2) p.choices = p.grid_values();
  return p;
}

// A condition may read a parameter only when it is declared earlier (it is sampled first).
void check_condition_order(const std::vector<SpaceParam>& params, const std::set<std::string>& declared) {
  std::set<std::string> before;
  for (const auto& p : params) {
    for (const auto& c : p.when)
      if (declared.count(c.key) && !before.count(c.key))
        throw ConfigError(p.where + ": parameter '" + p.key + "' depends on '" + c.key +
                          "', which must be declared above it in `space`");
    before.insert(p.key);
  }
}

// One clause of a derived rule: scale, by, rule, base_batch.
void read_derived_clause(const YAML::Node& name, const YAML::Node& v, DerivedRule& r, bool& has_scale, bool& has_by,
                         const std::string& source) {
  const std::string k = name.Scalar();
  if (k == "scale" || k == "by") {
    std::string key = v.IsScalar() ? v.Scalar() : "";
    if (!TrainConfig::is_key(key))
      throw ConfigError(where(v, source) + ": derived '" + r.key + "': " + k + " '" + key +
                        "' is not a training config key");
    (k == "scale" ? r.scale : r.by) = key;
    (k == "scale" ? has_scale : has_by) = true;
  } else if (k == "rule") {
    r.rule = v.IsScalar() ? v.Scalar() : "";
    if (r.rule != "sqrt" && r.rule != "linear")
      throw ConfigError(where(v, source) + ": derived '" + r.key + "': rule must be sqrt or linear");
  } else if (k == "base_batch") {
    r.base_batch = number(v, "derived '" + r.key + "': base_batch", source);
    if (r.base_batch <= 0) throw ConfigError(where(v, source) + ": derived '" + r.key + "': base_batch must be > 0");
  } else {
    throw ConfigError(where(name, source) + ": derived '" + r.key + "': unknown key '" + k +
                      "' (expected scale, by, rule, base_batch)");
  }
}

// One entry of `derived:`, `key.path: {scale: KEY, by: KEY, rule: sqrt|linear, base_batch: N}`.
DerivedRule read_derived_rule(const YAML::Node& key, const YAML::Node& d, const std::string& source) {
  DerivedRule r;
  r.key = key.Scalar();
  r.where = where(key, source);
  if (!TrainConfig::is_key(r.key))
    throw ConfigError(r.where + ": derived key '" + r.key + "' is not a training config key");
  if (!d.IsMap())
    throw ConfigError(r.where + ": derived '" + r.key +
                      "' must be {scale: KEY, by: KEY, rule: sqrt|linear, "
                      "base_batch: N}");
  bool has_scale = false, has_by = false;
  for (const auto& e : d) read_derived_clause(e.first, e.second, r, has_scale, has_by, source);
  if (!has_scale || !has_by) throw ConfigError(r.where + ": derived '" + r.key + "' needs both scale: and by:");
  return r;
}

}  // namespace

SearchSpace SearchSpace::from_yaml(const YAML::Node& space, const YAML::Node& derived, const std::string& source) {
  SearchSpace s;
  std::set<std::string> declared;
  if (space && !space.IsNull()) {
    if (!space.IsMap())
      throw ConfigError(where(space, source) + ": 'space' must be a mapping of training key paths to parameters");
    for (const auto& kv : space) {
      s.params_.push_back(read_param(kv.first, kv.second, declared, source));
      declared.insert(s.params_.back().key);
    }
    check_condition_order(s.params_, declared);
  }
  if (derived && !derived.IsNull()) {
    if (!derived.IsMap())
      throw ConfigError(where(derived, source) + ": 'derived' must be a mapping of key paths to rules");
    for (const auto& kv : derived) s.derived_.push_back(read_derived_rule(kv.first, kv.second, source));
  }
  return s;
}

std::map<std::string, ParamValue> SearchSpace::sample(const TrainConfig& base, const Suggest& suggest) const {
  std::map<std::string, ParamValue> out;
  for (const auto& p : params_) {
    bool holds = true;
    for (const auto& c : p.when) {
      auto it = out.find(c.key);
      std::string v = it != out.end() ? to_string(it->second) : base.text(c.key);
      bool any = false;
      for (const auto& want : c.values) any = any || want == v || parse_scalar(want) == parse_scalar(v);
      holds = holds && any;
    }
    if (holds) out[p.key] = suggest(p);
  }
  return out;
}

TrainConfig SearchSpace::resolve(const TrainConfig& base, const std::map<std::string, ParamValue>& sampled,
                                 const std::string& source) const {
  TrainConfig cfg = base;
  for (const auto& kv : sampled) cfg.set(kv.first, to_string(kv.second), source);
  cfg.validate(source);  // the sampled combination (heads must divide a sampled hidden size)
  if (derived_.empty()) return cfg;
  for (const auto& r : derived_) {
    const double ratio = number_at(cfg, r.by, source) / r.base_batch;
    const double v = number_at(cfg, r.scale, source) * (r.rule == "sqrt" ? std::sqrt(ratio) : ratio);
    cfg.set(r.key, to_string(v), source);
  }
  cfg.validate(source);
  return cfg;
}

}  // namespace bs::search
