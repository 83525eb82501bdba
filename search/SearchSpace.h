// A study's search space: parameters addressed by training-config key path (`optimizer.lr`), conditional
// parameters (`when:`), and derived values (`derived:` e.g. lr scaled by sqrt(batch/base_batch)).
// Turning a trial's sampled values into its resolved training config also lives here.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "common/TrainConfig.h"

namespace YAML {
class Node;
}

namespace bs::search {

// One sampled value, as Optuna holds it (numbers stay numbers so that `optuna` tools show them as such).
using ParamValue = std::variant<int64_t, double, bool, std::string>;
std::string to_string(const ParamValue& v);          // full precision for doubles
ParamValue parse_scalar(const std::string& scalar);  // "32" -> int, "1e-3" -> double, "true" -> bool, else string
std::string params_to_json(const std::map<std::string, ParamValue>& params);

struct Condition {
  std::string key;                  // a training key path: a base key or a parameter declared earlier
  std::vector<std::string> values;  // holds when the key's value (as text) is one of these
};

struct SpaceParam {
  enum class Kind { kChoice, kUniform, kLogUniform, kInt };
  std::string key;  // training key path, checked with TrainConfig::is_key
  Kind kind = Kind::kChoice;
  std::vector<ParamValue> choices;  // kChoice
  double low = 0, high = 0;         // kUniform, kLogUniform, kInt
  int64_t step = 1;                 // kInt
  bool pow2 = false;                // kInt: only powers of two in [low, high] (sampled as a choice)
  bool log = false;                 // kInt: log-scale sampling
  std::vector<Condition> when;      // all must hold for the parameter to be sampled
  std::string where;                // "file:line" of its definition, for messages

  // The finite values of a choice / int parameter (grid sampler); throws for continuous ones.
  std::vector<ParamValue> grid_values() const;
};

// `derived: {optimizer.lr: {scale: optimizer.lr, by: batch.global, rule: sqrt, base_batch: 256}}`:
// key = value(scale) * f(value(by) / base_batch), f = sqrt or identity; applied after sampling.
struct DerivedRule {
  std::string key, scale, by, rule = "sqrt";
  double base_batch = 256;
  std::string where;
};

// Answers "give me a value for this parameter" (the Optuna trial, or a fixed map in tests).
using Suggest = std::function<ParamValue(const SpaceParam&)>;

class SearchSpace {
 public:
  // Reads `space:` and `derived:` nodes (either may be null); errors name the parameter and file:line.
  static SearchSpace from_yaml(const YAML::Node& space, const YAML::Node& derived, const std::string& source);

  const std::vector<SpaceParam>& params() const { return params_; }
  const std::vector<DerivedRule>& derived() const { return derived_; }
  bool empty() const { return params_.empty(); }

  // Samples the parameters in declaration order, skipping those whose `when` does not hold
  // (conditions read earlier samples, else the base config's value).
  std::map<std::string, ParamValue> sample(const TrainConfig& base, const Suggest& suggest) const;

  // The trial's training config: base + sampled values + derived values, set through TrainConfig's key
  // table and validated. Throws ConfigError (e.g. heads not dividing a sampled hidden size).
  TrainConfig resolve(const TrainConfig& base, const std::map<std::string, ParamValue>& sampled,
                      const std::string& source) const;

 private:
  std::vector<SpaceParam> params_;
  std::vector<DerivedRule> derived_;
};

}  // namespace bs::search
