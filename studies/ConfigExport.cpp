#include <cctype>
#include "studies/ConfigExport.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <map>
#include <sstream>

#include "common/JsonWriter.h"
#include "common/TrainConfig.h"

namespace bs {
namespace fs = std::filesystem;

std::string existing_study_db(const std::string& dir, const std::string& name) {
  bool plain = !name.empty() && name != "." && name != "..";
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') plain = false;
  if (!plain)
    throw StudyError("study name '" + name + "' may only contain letters, digits, '_', '.', '-' (and is not . or ..)");
  fs::path db = fs::path(dir) / name / "study.db";
  if (fs::is_regular_file(db)) return db.string();
  std::string known;
  std::error_code ec;
  if (fs::is_directory(dir, ec))
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (fs::is_regular_file(e.path() / "study.db")) known += (known.empty() ? "" : ", ") + e.path().filename().string();
  throw StudyError("unknown study '" + name + "': " + db.string() + " does not exist (studies in " + dir + ": " +
                   (known.empty() ? "none" : known) + "; pass --dir to look elsewhere)");
}

void refuse_output_in_study(const std::string& path, const std::string& flag) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  const std::string file = p.filename().string();
  for (const char* own : {"study.db", "study.db-wal", "study.db-shm", "study.db-journal", "controller.lock"})
    if (file == own)
      throw StudyError(flag + " " + path + " names a study's own file (" + file + "); write elsewhere, e.g. " + flag +
                       " exports/best.yaml");
  for (fs::path dir = p; !dir.empty(); dir = dir.parent_path()) {
    if (fs::exists(dir / "study.db", ec))
      throw StudyError(flag + " " + path + " lies inside the study folder " + dir.string() +
                       " (it holds study.db); write outside it, e.g. " + flag + " exports/" + file);
    if (dir == dir.root_path()) break;
  }
}

namespace {
std::vector<std::string> string_or_list(const YAML::Node& n) {
  std::vector<std::string> out;
  if (!n) return out;
  if (n.IsSequence())
    for (const auto& e : n) out.push_back(e.Scalar());
  else if (n.IsScalar())
    out.push_back(n.Scalar());
  return out;
}

bool parse_number(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end && *end == '\0';
}

std::string expand_short_key(const std::string& k) {
  static const std::map<std::string, std::string> shorts = {
      {"optimizer", "optimizer.name"}, {"batch", "batch.global"}, {"lr", "optimizer.lr"},
      {"sampler", "data.sampler"},     {"schedule", "schedule.name"}, {"clip", "clip.mode"}};
  auto it = shorts.find(k);
  return it == shorts.end() ? k : it->second;
}
}  // namespace

StudyObjective StudyObjective::from_study_yaml(const std::string& yaml) {
  StudyObjective o;
  YAML::Node root = YAML::Load(yaml);
  auto objectives = string_or_list(root["objective"]);
  if (objectives.empty()) objectives = string_or_list(root["objectives"]);
  if (!objectives.empty()) o.metric = objectives[0];
  auto directions = string_or_list(root["direction"]);
  if (directions.empty()) directions = string_or_list(root["directions"]);
  o.minimize = directions.empty() ? o.metric != "final_mlm_accuracy" : directions[0] != "maximize";
  return o;
}

StudyObjective StudyObjective::of_study(const StudyStore& store, const std::string& name) {
  auto yaml = store.study_config(name);
  if (!yaml) {
    auto names = store.study_names();
    if (names.size() == 1) yaml = store.study_config(names[0]);
  }
  return yaml ? from_study_yaml(*yaml) : StudyObjective{};
}

std::optional<double> objective_value(const TrialRecord& t, const StudyObjective& objective) {
  if (objective.metric == "samples_to_target" && t.samples_to_target) return t.samples_to_target;
  if (objective.metric == "seconds_to_target" && t.seconds_to_target) return t.seconds_to_target;
  if (objective.metric == "final_mlm_accuracy" && t.final_mlm_accuracy) return t.final_mlm_accuracy;
  if (!t.values.empty()) return t.values[0];
  return std::nullopt;
}

std::string config_value(const std::string& config_yaml, const std::string& key_path) {
  YAML::Node node = YAML::Load(config_yaml);
  std::stringstream ss(key_path);
  for (std::string part; std::getline(ss, part, '.');) {
    if (!node.IsMap() || !node[part]) return "";
    node = node[part];
  }
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter e;
  e << YAML::Flow << node;
  return e.c_str();
}

TrialFilter TrialFilter::parse(const std::vector<std::string>& specs) {
  TrialFilter f;
  for (const auto& spec : specs) {
    std::stringstream ss(spec);
    for (std::string term; std::getline(ss, term, ',');) {
      if (term.empty()) continue;
      auto eq = term.find('=');
      if (eq == std::string::npos || eq == 0)
        throw ConfigError("--where: '" + term + "' is not key=value (e.g. --where optimizer=lamb,batch.global=4096)");
      std::string key = expand_short_key(term.substr(0, eq));
      if (!TrainConfig::is_key(key))
        throw ConfigError("--where: unknown key '" + term.substr(0, eq) +
                          "' (use optimizer, batch, lr, sampler, schedule, clip or a training key path such as "
                          "optimizer.beta2)");
      f.terms_.emplace_back(key, term.substr(eq + 1));
    }
  }
  return f;
}

bool TrialFilter::matches(const TrialRecord& t) const {
  if (terms_.empty()) return true;
  YAML::Node root;
  try {
    root = YAML::Load(t.config_yaml);
  } catch (const YAML::Exception&) {
    return false;
  }
  for (const auto& [key, wanted] : terms_) {
    const std::string have = config_value(t.config_yaml, key);
    double a = 0, b = 0;
    if (parse_number(have, a) && parse_number(wanted, b)) {
      if (a != b) return false;
    } else if (have != wanted) {
      return false;
    }
  }
  return true;
}

std::string TrialFilter::describe() const {
  std::string s;
  for (const auto& [k, v] : terms_) s += (s.empty() ? "" : ", ") + k + "=" + v;
  return s;
}

std::vector<TrialRecord> rank_trials(const std::vector<TrialRecord>& trials, const StudyObjective& objective,
                                     const TrialFilter& filter) {
  std::vector<TrialRecord> out;
  for (const auto& t : trials)
    if (t.state == trial_state::kComplete && filter.matches(t)) out.push_back(t);
  std::stable_sort(out.begin(), out.end(), [&](const TrialRecord& a, const TrialRecord& b) {
    if (a.reached != b.reached) return a.reached;
    auto va = objective_value(a, objective), vb = objective_value(b, objective);
    if (va.has_value() != vb.has_value()) return va.has_value();
    if (va && *va != *vb) return objective.minimize ? *va < *vb : *va > *vb;
    return a.number < b.number;
  });
  return out;
}

std::string export_yaml(const TrialRecord& t, const std::vector<std::string>& sets) {
  if (t.config_yaml.empty())
    throw StudyError("trial " + std::to_string(t.number) + " has no stored resolved config (bs_trials.config_yaml)");
  if (sets.empty()) return t.config_yaml;
  const std::string source = "trial " + std::to_string(t.number) + " config";
  return TrainConfig::from_yaml(YAML::Load(t.config_yaml), source, sets).to_yaml_string();
}

int64_t resolved_total_steps(const TrainConfig& c) {
  if (c.schedule.total_steps > 0) return c.schedule.total_steps;
  return c.batch.global > 0 ? (c.target.max_samples + c.batch.global - 1) / c.batch.global : 0;  // as the trainer: ceil
}

int64_t resolved_warmup_steps(const TrainConfig& c) {
  if (c.schedule.warmup_steps >= 0) return c.schedule.warmup_steps;
  return static_cast<int64_t>(std::llround(c.schedule.warmup_fraction * static_cast<double>(resolved_total_steps(c))));
}

std::string export_mlperf_json(const TrainConfig& c, const TrialRecord& t, const std::string& study_name) {
  const std::string& opt = c.optimizer.name;
  const bool lamb_family = opt == "lamb" || opt == "nvlamb" || opt == "lans";
  const std::string fam = lamb_family ? "lamb" : (opt == "sgd" ? "sgd" : "adam");
  const int64_t warmup = resolved_warmup_steps(c);
  // Ordered as the MLPerf BERT reference logs its hyperparameters; one "key": value per line.
  std::vector<std::pair<std::string, std::string>> kv;
  auto num = [](double v) {
    std::ostringstream os;
    os << std::setprecision(17) << v;
    return os.str();
  };
  auto i64 = [](int64_t v) { return std::to_string(v); };
  kv.emplace_back("global_batch_size", i64(c.batch.global));
  kv.emplace_back("micro_batch_size", i64(c.batch.micro));
  kv.emplace_back("max_sequence_length", i64(c.data.seq_len));
  kv.emplace_back("opt_name", JsonWriter::quote(opt));
  kv.emplace_back("opt_base_learning_rate", num(c.optimizer.lr));
  if (fam == "sgd") {
    kv.emplace_back("opt_sgd_momentum", num(c.optimizer.momentum));
    kv.emplace_back("opt_sgd_nesterov", c.optimizer.nesterov ? "true" : "false");
  } else {
    kv.emplace_back("opt_" + fam + "_beta_1", num(c.optimizer.beta1));
    kv.emplace_back("opt_" + fam + "_beta_2", num(c.optimizer.beta2));
    kv.emplace_back("opt_" + fam + "_epsilon", num(c.optimizer.eps));
  }
  kv.emplace_back("opt_epsilon", num(c.optimizer.eps));
  kv.emplace_back(lamb_family ? "opt_lamb_weight_decay_rate" : "opt_weight_decay", num(c.optimizer.weight_decay));
  kv.emplace_back("opt_learning_rate_warmup_steps", i64(warmup));
  kv.emplace_back("start_warmup_step", i64(c.schedule.start_warmup_step));
  kv.emplace_back("num_warmup_steps", i64(warmup));
  kv.emplace_back("opt_learning_rate_decay_schedule", JsonWriter::quote(c.schedule.name));
  kv.emplace_back("opt_lamb_learning_rate_decay_poly_power", num(c.schedule.power));
  kv.emplace_back("opt_learning_rate_end_value", num(c.schedule.end_lr));
  kv.emplace_back("opt_learning_rate_training_steps", i64(resolved_total_steps(c)));
  kv.emplace_back("max_samples", i64(c.target.max_samples));
  kv.emplace_back("eval_every_samples", i64(c.target.eval_every_samples));
  kv.emplace_back("target_mlm_accuracy", num(c.target.mlm_accuracy));
  kv.emplace_back("gradient_clip_mode", JsonWriter::quote(c.clip.mode));
  kv.emplace_back("gradient_clip_max_norm", num(c.clip.max_norm));
  kv.emplace_back("seed", i64(c.seed));

  JsonWriter prov;
  prov.add("study", study_name).add("trial", static_cast<int64_t>(t.number)).add("reached", t.reached);
  if (t.samples_to_target) prov.add("samples_to_target", *t.samples_to_target);
  else prov.add_null("samples_to_target");
  if (t.seconds_to_target) prov.add("seconds_to_target", *t.seconds_to_target);
  else prov.add_null("seconds_to_target");
  kv.emplace_back("bertsweep", prov.str());

  std::string out = "{\n";
  for (std::size_t i = 0; i < kv.size(); ++i)
    out += "  " + JsonWriter::quote(kv[i].first) + ": " + kv[i].second + (i + 1 < kv.size() ? ",\n" : "\n");
  return out + "}\n";
}

}  // namespace bs
