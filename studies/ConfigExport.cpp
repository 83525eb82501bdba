#include <cctype>
#include "studies/ConfigExport.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <map>
#include <sstream>

#include "common/Choices.h"
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
      if (fs::is_regular_file(e.path() / "study.db"))
        known += (known.empty() ? "" : ", ") + e.path().filename().string();
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
      {"optimizer", "optimizer.name"}, {"batch", "batch.global"},     {"lr", "optimizer.lr"},
      {"sampler", "data.sampler"},     {"schedule", "schedule.name"}, {"clip", "clip.mode"}};
  auto it = shorts.find(k);
  return it == shorts.end() ? k : it->second;
}
}  // namespace

StudyObjective StudyObjective::from_study_yaml(const std::string& yaml, const std::string& source) {
  StudyObjective o;
  YAML::Node root = yaml::load_stored(yaml, source);
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
  return yaml ? from_study_yaml(*yaml, store.path() + " (bs_study, study '" + name + "')") : StudyObjective{};
}

std::optional<double> objective_value(const TrialRecord& t, const StudyObjective& objective) {
  if (objective.metric == "samples_to_target" && t.samples_to_target) return t.samples_to_target;
  if (objective.metric == "seconds_to_target" && t.seconds_to_target) return t.seconds_to_target;
  if (objective.metric == "final_mlm_accuracy" && t.final_mlm_accuracy) return t.final_mlm_accuracy;
  if (!t.values.empty()) return t.values[0];
  return std::nullopt;
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
  if (t.config_yaml.empty()) return false;
  const TrainConfig config = t.config();
  for (const auto& [key, wanted] : terms_) {
    const std::string have = config.text(key);
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
  if (sets.empty()) return shorten_yaml_numbers(t.config_yaml);
  const std::string source = "trial " + std::to_string(t.number) + " config";
  return shorten_yaml_numbers(
      TrainConfig::from_yaml(yaml::load_stored(t.config_yaml, source + " (bs_trials.config_yaml)"), source, sets)
          .to_yaml_string());
}

std::string shortest_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

namespace {
// A token written at full precision by the config writer: a decimal number with a '.' or an exponent and at
// least 16 significant digits. Shorter tokens (and strings such as paths that only look like numbers) stay.
bool full_precision_number(const std::string& tok, double& value) {
  if (tok.find_first_of(".eE") == std::string::npos) return false;
  if (!parse_number(tok, value) || !std::isfinite(value)) return false;
  int digits = 0;
  bool leading = true;
  for (char ch : tok) {
    if (ch == 'e' || ch == 'E') break;
    if (!std::isdigit(static_cast<unsigned char>(ch))) continue;
    if (leading && ch == '0') continue;
    leading = false;
    ++digits;
  }
  return digits >= 16;
}
}  // namespace

std::string shorten_yaml_numbers(const std::string& yaml) {
  std::string out;
  out.reserve(yaml.size());
  std::size_t pos = 0;
  while (pos < yaml.size()) {
    std::size_t nl = yaml.find('\n', pos);
    const std::size_t end = nl == std::string::npos ? yaml.size() : nl;
    std::string line = yaml.substr(pos, end - pos);
    // `key: value` (optionally `- ` list items); the value is one plain token, maybe followed by a comment.
    const std::size_t colon = line.find(": ");
    const std::size_t hash = line.find('#');
    if (colon != std::string::npos && (hash == std::string::npos || hash > colon)) {
      std::size_t b = line.find_first_not_of(' ', colon + 2);
      if (b != std::string::npos) {
        std::size_t e = line.find_first_of(" \t#", b);
        if (e == std::string::npos) e = line.size();
        const std::string tok = line.substr(b, e - b);
        double v = 0;
        if (full_precision_number(tok, v)) line = line.substr(0, b) + shortest_number(v) + line.substr(e);
      }
    }
    out += line;
    if (nl != std::string::npos) out += '\n';
    pos = end + 1;
  }
  return out;
}

int64_t per_device_batch(int64_t global_batch, const ProductionLayout& layout) {
  if (layout.nodes < 1 || layout.gpus_per_node < 1)
    throw ConfigError("--nodes and --gpus-per-node must be >= 1 (got " + std::to_string(layout.nodes) + " and " +
                      std::to_string(layout.gpus_per_node) + ")");
  const int64_t devices = layout.devices();
  if (global_batch % devices != 0)
    throw ConfigError(
        "the global batch " + std::to_string(global_batch) + " is not divisible by " + std::to_string(devices) +
        " devices (" + std::to_string(layout.nodes) + " nodes x " + std::to_string(layout.gpus_per_node) +
        " GPUs per node); choose a layout that divides it, or --set batch.global=N with N a multiple of " +
        std::to_string(devices));
  return global_batch / devices;
}

int64_t gradient_accumulation_steps(const TrainConfig& c, const ProductionLayout& layout) {
  const int64_t local = per_device_batch(c.batch.global, layout);
  const int64_t micro = std::max<int64_t>(1, c.batch.micro);
  return std::max<int64_t>(1, (local + micro - 1) / micro);  // as the trainer: ceil(local / micro)
}

int64_t nvidia_gradient_steps(const TrainConfig& c, const ProductionLayout& layout) {
  const int64_t local = per_device_batch(c.batch.global, layout);
  for (int64_t k = gradient_accumulation_steps(c, layout); k < local; ++k)
    if (local % k == 0) return k;
  return local;
}

int64_t mlperf_bert_eval_interval_samples(int64_t global_batch) {
  const double raw = 0.05 * (230.23 * static_cast<double>(global_batch) + 3000000.0);
  return static_cast<int64_t>(std::floor(raw / 25000.0)) * 25000;
}

double scaled_learning_rate(double lr, int64_t trial_batch, int64_t production_batch, const std::string& mode) {
  if (trial_batch < 1 || production_batch < 1)
    throw ConfigError("--scale-lr needs batch sizes >= 1 (trial " + std::to_string(trial_batch) + ", production " +
                      std::to_string(production_batch) + ")");
  const double ratio = static_cast<double>(production_batch) / static_cast<double>(trial_batch);
  if (mode == "none") return lr;
  if (mode == "linear") return lr * ratio;
  if (mode == "sqrt") return lr * std::sqrt(ratio);
  throw ConfigError("--scale-lr must be linear, sqrt or none, got '" + mode + "'");
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
  return export_mlperf_json(c, t, study_name, ProductionLayout{});
}

namespace {
std::string provenance_json(const TrialRecord& t, const std::string& study_name, const TrainConfig& c) {
  auto opt_num = [](const std::optional<double>& v) { return v ? shortest_number(*v) : std::string("null"); };
  std::string p = "{\"study\": " + JsonWriter::quote(study_name) + ", \"trial\": " + std::to_string(t.number) +
                  ", \"reached\": " + (t.reached ? "true" : "false") +
                  ", \"samples_to_target\": " + opt_num(t.samples_to_target) +
                  ", \"seconds_to_target\": " + opt_num(t.seconds_to_target) +
                  // The proxy's own targets, which the MLPerf settings above replace.
                  ", \"proxy_target_mlm_accuracy\": " + shortest_number(c.target.mlm_accuracy) +
                  ", \"proxy_eval_every_samples\": " + std::to_string(c.target.eval_every_samples) +
                  ", \"proxy_eval_samples\": " + std::to_string(c.data.eval_samples) + "}";
  return p;
}
}  // namespace

std::string export_mlperf_json(const TrainConfig& c, const TrialRecord& t, const std::string& study_name,
                               const ProductionLayout& layout) {
  const std::string& opt = c.optimizer.name;
  const OptimizerKind kind = parse_choice<OptimizerKind>(opt);
  const std::string fam = is_lamb_family(kind) ? "lamb" : (kind == OptimizerKind::kSgd ? "sgd" : "adam");
  const int64_t warmup = resolved_warmup_steps(c);
  const int64_t device_batch = per_device_batch(c.batch.global, layout);
  // Ordered as the MLPerf BERT reference logs its hyperparameters; one "key": value per line.
  std::vector<std::pair<std::string, std::string>> kv;
  auto num = [](double v) { return shortest_number(v); };
  auto i64 = [](int64_t v) { return std::to_string(v); };
  kv.emplace_back("global_batch_size", i64(c.batch.global));
  kv.emplace_back("micro_batch_size", i64(c.batch.micro));
  kv.emplace_back("gradient_accumulation_steps", i64(gradient_accumulation_steps(c, layout)));
  kv.emplace_back("nodes", i64(layout.nodes));
  kv.emplace_back("gpus_per_node", i64(layout.gpus_per_node));
  kv.emplace_back("per_device_batch_size", i64(device_batch));
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
  kv.emplace_back(is_lamb_family(kind) ? "opt_lamb_weight_decay_rate" : "opt_weight_decay",
                  num(c.optimizer.weight_decay));
  kv.emplace_back("opt_learning_rate_warmup_steps", i64(warmup));
  kv.emplace_back("start_warmup_step", i64(c.schedule.start_warmup_step));
  kv.emplace_back("num_warmup_steps", i64(warmup));
  kv.emplace_back("opt_learning_rate_decay_schedule", JsonWriter::quote(c.schedule.name));
  kv.emplace_back("opt_lamb_learning_rate_decay_poly_power", num(c.schedule.power));
  kv.emplace_back("opt_learning_rate_end_value", num(c.schedule.end_lr));
  kv.emplace_back("opt_learning_rate_training_steps", i64(resolved_total_steps(c)));
  kv.emplace_back("max_samples", i64(c.target.max_samples));
  // MLPerf BERT's evaluation, not the proxy's (those are kept under "bertsweep").
  kv.emplace_back("target_mlm_accuracy", num(kMlperfBertTargetMlmAccuracy));
  kv.emplace_back("eval_samples", i64(kMlperfBertEvalSamples));
  kv.emplace_back("eval_interval_samples", i64(mlperf_bert_eval_interval_samples(c.batch.global)));
  kv.emplace_back("eval_start_samples", i64(mlperf_bert_eval_interval_samples(c.batch.global)));
  kv.emplace_back("gradient_clip_mode", JsonWriter::quote(c.clip.mode));
  kv.emplace_back("gradient_clip_max_norm", num(c.clip.max_norm));
  kv.emplace_back("precision", JsonWriter::quote(c.precision));
  kv.emplace_back("seed", i64(c.seed));
  // The model shape with the names of a BERT config JSON (NVIDIA's --bert_config_path, Hugging Face);
  // vocab_size null: taken from the dataset's vocab.
  kv.emplace_back("bert_config",
                  "{\"hidden_size\": " + i64(c.model.hidden) + ", \"num_hidden_layers\": " + i64(c.model.layers) +
                      ", \"num_attention_heads\": " + i64(c.model.heads) +
                      ", \"intermediate_size\": " + i64(c.model.intermediate) +
                      ", \"vocab_size\": " + (c.model.vocab_size > 0 ? i64(c.model.vocab_size) : std::string("null")) +
                      ", \"max_position_embeddings\": " + i64(c.model.max_position) + ", \"type_vocab_size\": " +
                      i64(c.model.type_vocab_size) + ", \"hidden_dropout_prob\": " + num(c.model.dropout) + "}");
  kv.emplace_back("bertsweep", provenance_json(t, study_name, c));

  std::string out = "{\n";
  for (std::size_t i = 0; i < kv.size(); ++i)
    out += "  " + JsonWriter::quote(kv[i].first) + ": " + kv[i].second + (i + 1 < kv.size() ? ",\n" : "\n");
  return out + "}\n";
}

namespace {
// A value as one shell word: bare when it holds only characters no shell treats specially, else in single
// quotes (a ' inside becomes '\'').
std::string shell_word(const std::string& v) {
  bool plain = !v.empty();
  for (char ch : v)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && std::string("._+-/:,=@%").find(ch) == std::string::npos)
      plain = false;
  if (plain) return v;
  std::string q = "'";
  for (char ch : v) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}
// A comment line: no newline can end it early.
std::string comment(const std::string& text) {
  std::string s = "# ";
  for (char ch : text) s += (ch == '\n' || ch == '\r') ? ' ' : ch;
  return s + "\n";
}
}  // namespace

std::string export_nvidia_config(const TrainConfig& c, const TrialRecord& t, const std::string& study_name,
                                 const ProductionLayout& layout) {
  const int64_t device_batch = per_device_batch(c.batch.global, layout);
  const int64_t grad_steps = nvidia_gradient_steps(c, layout);
  const int64_t interval = mlperf_bert_eval_interval_samples(c.batch.global);
  std::string s;
  s += comment("bertsweep study export --format nvidia-config: study " + study_name + ", trial " +
               std::to_string(t.number) + " (" + c.optimizer.name + ", global batch " + std::to_string(c.batch.global) +
               ")");
  s += comment("Source it before NVIDIA's MLPerf BERT run_and_time.sh, as its config_<SYSTEM>.sh is sourced.");
  s += comment(
      "BATCHSIZE is the per-GPU batch of one optimizer step (global / (DGXNNODES * DGXNGPU)); "
      "run_pretraining.py splits it into GRADIENT_STEPS micro-batches.");
  const OptimizerKind kind = parse_choice<OptimizerKind>(c.optimizer.name);
  if (kind != OptimizerKind::kLamb && kind != OptimizerKind::kNvLamb)
    s += comment("note: the trial used " + c.optimizer.name +
                 "; NVIDIA's trainer runs LAMB, so OPT_LAMB_BETA_* carry this trial's betas");
  if (grad_steps != gradient_accumulation_steps(c, layout))
    s += comment("note: GRADIENT_STEPS " + std::to_string(grad_steps) + " (not ceil(" + std::to_string(device_batch) +
                 " / " + std::to_string(c.batch.micro) +
                 ") = " + std::to_string(gradient_accumulation_steps(c, layout)) +
                 "): NVIDIA's trainer needs it to divide BATCHSIZE");
  if (parse_choice<ScheduleKind>(c.schedule.name) != ScheduleKind::kPoly || c.schedule.power != 1.0 ||
      c.schedule.end_lr != 0.0)
    s += comment("note: NVIDIA's trainer decays linearly (poly power 1) to 0; the trial used " + c.schedule.name +
                 ", power " + shortest_number(c.schedule.power) + ", end lr " + shortest_number(c.schedule.end_lr));
  s += comment("precision: " + c.precision + "; model: hidden " + std::to_string(c.model.hidden) + ", layers " +
               std::to_string(c.model.layers) + ", heads " + std::to_string(c.model.heads) + ", intermediate " +
               std::to_string(c.model.intermediate) + ", max_position " + std::to_string(c.model.max_position) +
               " (NVIDIA's trainer reads the shape from --bert_config_path)");
  std::vector<std::pair<std::string, std::string>> vars = {
      {"BATCHSIZE", std::to_string(device_batch)},
      {"GRADIENT_STEPS", std::to_string(grad_steps)},
      {"LR", shortest_number(c.optimizer.lr)},
      {"MAX_SAMPLES_TERMINATION", std::to_string(c.target.max_samples)},
      {"MAX_STEPS", std::to_string(resolved_total_steps(c))},
      {"WARMUP_PROPORTION", "0.0"},
      {"WARMUP_STEPS", std::to_string(resolved_warmup_steps(c))},
      {"START_WARMUP_STEP", std::to_string(c.schedule.start_warmup_step)},
      {"OPT_LAMB_BETA_1", shortest_number(c.optimizer.beta1)},
      {"OPT_LAMB_BETA_2", shortest_number(c.optimizer.beta2)},
      {"WEIGHT_DECAY_RATE", shortest_number(c.optimizer.weight_decay)},
      {"TARGET_MLM_ACCURACY", shortest_number(kMlperfBertTargetMlmAccuracy)},
      {"NUM_EVAL_EXAMPLES", std::to_string(kMlperfBertEvalSamples)},
      {"EVAL_ITER_START_SAMPLES", std::to_string(interval)},
      {"EVAL_ITER_SAMPLES", std::to_string(interval)},
      {"SEED", std::to_string(c.seed)},
      {"DGXNNODES", std::to_string(layout.nodes)},
      {"DGXNGPU", std::to_string(layout.gpus_per_node)},
  };
  for (const auto& [name, value] : vars) s += "export " + name + "=" + shell_word(value) + "\n";
  return s;
}

}  // namespace bs
