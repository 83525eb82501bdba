#include "TrainConfig.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <variant>
#include <vector>

#include "common/Choices.h"

namespace bs {
namespace fs = std::filesystem;

namespace {

using FieldPtr = std::variant<int64_t*, double*, bool*, std::string*, std::vector<int64_t>*, std::vector<std::string>*>;
struct Field {
  std::string path;
  FieldPtr ptr;
};

// The one table of every key: parsing, writing, --set and search spaces all go through it.
std::vector<Field> fields_of(TrainConfig& c) {
  return {
      {"model.vocab_size", &c.model.vocab_size},
      {"model.hidden", &c.model.hidden},
      {"model.layers", &c.model.layers},
      {"model.heads", &c.model.heads},
      {"model.intermediate", &c.model.intermediate},
      {"model.max_position", &c.model.max_position},
      {"model.type_vocab_size", &c.model.type_vocab_size},
      {"model.dropout", &c.model.dropout},
      {"model.kernels", &c.model.kernels},
      {"model.unpad", &c.model.unpad},
      {"model.init_checkpoint", &c.model.init_checkpoint},
      {"data.dir", &c.data.dir},
      {"data.eval_file", &c.data.eval_file},
      {"data.seq_len", &c.data.seq_len},
      {"data.sampler", &c.data.sampler},
      {"data.strata", &c.data.strata},
      {"data.presort_group", &c.data.presort_group},
      {"data.eval_samples", &c.data.eval_samples},
      {"optimizer.name", &c.optimizer.name},
      {"optimizer.lr", &c.optimizer.lr},
      {"optimizer.beta1", &c.optimizer.beta1},
      {"optimizer.beta2", &c.optimizer.beta2},
      {"optimizer.eps", &c.optimizer.eps},
      {"optimizer.weight_decay", &c.optimizer.weight_decay},
      {"optimizer.bias_correction", &c.optimizer.bias_correction},
      {"optimizer.momentum", &c.optimizer.momentum},
      {"optimizer.nesterov", &c.optimizer.nesterov},
      {"optimizer.no_decay", &c.optimizer.no_decay},
      {"schedule.name", &c.schedule.name},
      {"schedule.warmup_steps", &c.schedule.warmup_steps},
      {"schedule.warmup_fraction", &c.schedule.warmup_fraction},
      {"schedule.start_warmup_step", &c.schedule.start_warmup_step},
      {"schedule.power", &c.schedule.power},
      {"schedule.end_lr", &c.schedule.end_lr},
      {"schedule.total_steps", &c.schedule.total_steps},
      {"batch.global", &c.batch.global},
      {"batch.micro", &c.batch.micro},
      {"clip.mode", &c.clip.mode},
      {"clip.max_norm", &c.clip.max_norm},
      {"clip.bucket_mb", &c.clip.bucket_mb},
      {"distributed.backend", &c.distributed.backend},
      {"distributed.timeout_s", &c.distributed.timeout_s},
      {"distributed.grad_dtype", &c.distributed.grad_dtype},
      {"target.mlm_accuracy", &c.target.mlm_accuracy},
      {"target.max_samples", &c.target.max_samples},
      {"target.eval_every_samples", &c.target.eval_every_samples},
      {"checkpoint.dir", &c.checkpoint.dir},
      {"checkpoint.every_samples", &c.checkpoint.every_samples},
      {"log.mllog", &c.log.mllog},
      {"log.progress_every_steps", &c.log.progress_every_steps},
      {"log.op_profile", &c.log.op_profile},
      {"log.submission_division", &c.log.submission_division},
      {"log.submission_org", &c.log.submission_org},
      {"log.submission_platform", &c.log.submission_platform},
      {"log.submission_status", &c.log.submission_status},
      {"threads", &c.threads},
      {"seed", &c.seed},
      {"device", &c.device},
      {"precision", &c.precision},
  };
}

std::string type_name(const FieldPtr& p) {
  struct V {
    std::string operator()(int64_t*) const { return "an integer (within 64 bits)"; }
    std::string operator()(double*) const { return "a finite number"; }
    std::string operator()(bool*) const { return "true or false"; }
    std::string operator()(std::string*) const { return "a string"; }
    std::string operator()(std::vector<int64_t>*) const { return "a list of integers"; }
    std::string operator()(std::vector<std::string>*) const { return "a list of strings"; }
  };
  return std::visit(V{}, p);
}

// Integers: plain digits, or a whole number written as a float (1e6, 4096.0); anything outside int64 is
// refused rather than wrapped.
bool parse_int(const std::string& s, int64_t& out) {
  std::size_t n = 0;
  try {
    long long v = std::stoll(s, &n, 10);
    if (n == s.size()) {
      out = v;
      return true;
    }
    double d = std::stod(s, &n);
    // 2^63 is the first double outside int64.
    if (n != s.size() || !std::isfinite(d) || std::floor(d) != d || d >= 9223372036854775808.0 ||
        d < -9223372036854775808.0)
      return false;
    out = static_cast<int64_t>(d);
    return true;
  } catch (...) {  // out_of_range included: past int64
    return false;
  }
}
// Numbers must be finite: no key means anything with nan or inf.
bool parse_double(const std::string& s, double& out) {
  std::size_t n = 0;
  try {
    out = std::stod(s, &n);
    return n == s.size() && std::isfinite(out);
  } catch (...) {
    return false;
  }
}

void assign(const Field& f, const YAML::Node& n, const std::string& source) {
  auto bad = [&]() {
    std::ostringstream os;
    os << yaml::where(n, source) << ": key '" << f.path << "' must be " << type_name(f.ptr);
    if (n.IsScalar()) os << ", got '" << n.Scalar() << "'";
    throw ConfigError(os.str());
  };
  struct V {
    const YAML::Node& n;
    const std::function<void()>& bad;
    void operator()(int64_t* p) const {
      if (!n.IsScalar() || !parse_int(n.Scalar(), *p)) bad();
    }
    void operator()(double* p) const {
      if (!n.IsScalar() || !parse_double(n.Scalar(), *p)) bad();
    }
    void operator()(bool* p) const {
      if (!n.IsScalar()) bad();
      const std::string& s = n.Scalar();
      if (s == "true" || s == "True" || s == "yes" || s == "1") *p = true;
      else if (s == "false" || s == "False" || s == "no" || s == "0")
        *p = false;
      else
        bad();
    }
    void operator()(std::string* p) const {
      if (!n.IsScalar()) bad();
      *p = n.Scalar();
    }
    void operator()(std::vector<int64_t>* p) const {
      if (!n.IsSequence()) bad();
      p->clear();
      for (const auto& e : n) {
        int64_t v;
        if (!e.IsScalar() || !parse_int(e.Scalar(), v)) bad();
        p->push_back(v);
      }
    }
    void operator()(std::vector<std::string>* p) const {
      if (!n.IsSequence()) bad();
      p->clear();
      for (const auto& e : n) {
        if (!e.IsScalar()) bad();
        p->push_back(e.Scalar());
      }
    }
  };
  std::function<void()> badf = bad;
  std::visit(V{n, badf}, f.ptr);
}

void emit(const Field& f, YAML::Node& root) {
  std::vector<std::string> parts;
  std::stringstream ss(f.path);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  YAML::Node value;
  struct V {
    YAML::Node& v;
    void operator()(int64_t* p) const { v = *p; }
    void operator()(double* p) const { v = *p; }
    void operator()(bool* p) const { v = *p; }
    void operator()(std::string* p) const { v = *p; }
    void operator()(std::vector<int64_t>* p) const {
      v = YAML::Node(YAML::NodeType::Sequence);
      for (auto x : *p) v.push_back(x);
      v.SetStyle(YAML::EmitterStyle::Flow);
    }
    void operator()(std::vector<std::string>* p) const {
      v = YAML::Node(YAML::NodeType::Sequence);
      for (auto& x : *p) v.push_back(x);
      v.SetStyle(YAML::EmitterStyle::Flow);
    }
  };
  std::visit(V{value}, f.ptr);
  if (parts.size() == 1) {
    root[parts[0]] = value;
  } else {
    YAML::Node sec = root[parts[0]];
    sec[parts[1]] = value;
  }
}

// Follows `extends: path | [paths]` (relative to the including file).
YAML::Node load_with_extends(const std::string& path, int depth) {
  if (depth > 8) throw ConfigError(path + ": `extends:` nests more than 8 levels (a cycle?)");
  YAML::Node node = yaml::load_file(path);
  if (!node.IsMap()) throw ConfigError(path + ": a training config must be a YAML mapping of keys");
  YAML::Node ext = node["extends"];
  if (!ext) return node;
  std::vector<std::string> bases;
  if (ext.IsScalar()) bases.push_back(ext.Scalar());
  else if (ext.IsSequence())
    for (const auto& e : ext) bases.push_back(e.Scalar());
  else
    throw ConfigError(yaml::where(ext, path) + ": `extends` must be a path or a list of paths");
  YAML::Node merged(YAML::NodeType::Map);
  for (const auto& b : bases) {
    fs::path p = fs::path(path).parent_path() / b;
    merged = yaml::merge(merged, load_with_extends(p.string(), depth + 1));
  }
  node.remove("extends");
  return yaml::merge(merged, node);
}

// The values a choice key accepts: the enum keys' from common/Choices.h, and the MLLOG submission keys.
std::set<std::string> one_of(const std::string& key) {
  static const std::map<std::string, std::set<std::string>> m = {
      {"log.submission_division", {"open", "closed"}},
      {"log.submission_status", {"available", "preview", "research", "onprem", "cloud"}},
  };
  const auto& enum_values = choice_values(key);
  return enum_values.empty() ? m.at(key) : std::set<std::string>(enum_values.begin(), enum_values.end());
}

}  // namespace

namespace yaml {

std::string where(const YAML::Node& node, const std::string& source) {
  if (node && node.Mark().line >= 0 && !node.Mark().is_null())
    return source + ":" + std::to_string(node.Mark().line + 1);
  return source;
}

namespace {

// Expanded node counts from parser events: a frame per open collection, each anchor's expanded size kept so
// that an alias adds it again.
class ExpansionCounter : public YAML::EventHandler {
 public:
  explicit ExpansionCounter(std::string source) : source_(std::move(source)) {}
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t a) override { leaf(m, a); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t a, const std::string&) override { leaf(m, a); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t a) override {
    auto it = sizes_.find(a);
    add(m, it == sizes_.end() ? 1 : it->second);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t a, YAML::EmitterStyle::value) override {
    open(m, a);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t a, YAML::EmitterStyle::value) override {
    open(m, a);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    long long size;
    YAML::anchor_t anchor;
    YAML::Mark mark;
  };
  void leaf(const YAML::Mark& m, YAML::anchor_t a) {
    if (a != YAML::NullAnchor) sizes_[a] = 1;
    add(m, 1);
  }
  void open(const YAML::Mark& m, YAML::anchor_t a) { stack_.push_back({1, a, m}); }
  void close() {
    Frame f = stack_.back();
    stack_.pop_back();
    if (f.anchor != YAML::NullAnchor) sizes_[f.anchor] = f.size;
    add(f.mark, f.size);
  }
  // Sizes saturate at the limit: the check stops at the first node past it, before any overflow.
  void add(const YAML::Mark& m, long long n) {
    long long& top = stack_.empty() ? total_ : stack_.back().size;
    top = std::min(top + n, kMaxExpandedNodes + 1);
    long long all = total_;
    for (const auto& f : stack_) all = std::min(all + f.size, kMaxExpandedNodes + 1);
    if (all > kMaxExpandedNodes)
      throw ConfigError(source_ + ":" + std::to_string(m.line + 1) + ": its aliases (*name) expand to more than " +
                        std::to_string(kMaxExpandedNodes) +
                        " YAML nodes, far beyond any config (nested aliases, the 'billion laughs' shape); "
                        "write the values out or use fewer nested aliases");
  }

  std::string source_;
  std::vector<Frame> stack_;
  std::map<YAML::anchor_t, long long> sizes_;
  long long total_ = 0;
};

}  // namespace

void check_alias_expansion(const std::string& text, const std::string& source) {
  if (text.find('*') == std::string::npos) return;  // no alias: the tree is as large as the text
  std::istringstream in(text);
  YAML::Parser parser(in);
  ExpansionCounter counter(source);
  while (parser.HandleNextDocument(counter)) {
  }
}

YAML::Node load_stored(const std::string& text, const std::string& source) {
  try {
    check_alias_expansion(text, source);
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw StudyError(source + ": the stored YAML is damaged (line " + std::to_string(e.mark.line + 1) + ": " + e.msg +
                     "); the study file was edited or damaged: restore its copy study.db.bak (`cp study.db.bak "
                     "study.db` in the study folder), or recover what SQLite can read with `sqlite3 study.db "
                     ".recover | sqlite3 recovered.db`");
  } catch (const ConfigError& e) {
    throw StudyError(std::string(e.what()) + " (stored by bertsweep, so the study file was edited or damaged)");
  }
}

YAML::Node load_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw ConfigError(path + ": file not found (check the path given to --config)");
  if (fs::is_directory(path, ec)) throw ConfigError(path + ": is a folder, not a YAML file (name the file in it)");
  if (!fs::is_regular_file(path, ec))
    throw ConfigError(path + ": is not a regular file (a FIFO, socket or device); give a YAML file");
  if (fs::file_size(path, ec) > 16 * 1024 * 1024)
    throw ConfigError(path + ": is larger than 16 MiB; a config is a small YAML file");
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot be read (check its permissions)");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    check_alias_expansion(text, path);
    YAML::Node root = YAML::Load(text);
    // yaml-cpp keeps both entries of a repeated key and later merges silently keep one: refuse it here.
    std::function<void(const YAML::Node&, const std::string&)> walk = [&](const YAML::Node& n,
                                                                          const std::string& prefix) {
      if (n.IsMap()) {
        std::set<std::string> seen;
        for (const auto& kv : n) {
          const std::string k = kv.first.IsScalar() ? kv.first.Scalar() : YAML::Dump(kv.first);
          if (!seen.insert(k).second)
            throw ConfigError(where(kv.first, path) + ": key '" + prefix + k +
                              "' is given twice (only one would be used; delete the other)");
          walk(kv.second, prefix + k + ".");
        }
      } else if (n.IsSequence()) {
        for (const auto& e : n) walk(e, prefix);
      }
    };
    walk(root, "");
    return root;
  } catch (const YAML::Exception& e) {
    throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ": YAML syntax error: " + e.msg);
  }
}

void set_path(YAML::Node& root, const std::string& assignment, const std::string& source) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(source + ": '" + assignment + "' is not of the form key.path=value");
  std::string key = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  YAML::Node v;
  try {
    v = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw ConfigError(source + ": value of '" + key + "' is not valid YAML: " + e.msg);
  }
  if (!v || v.IsNull()) v = YAML::Node(value);
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  // Walk with fresh handles: yaml-cpp node assignment rebinds, so descend by re-indexing from the root.
  std::function<void(YAML::Node, std::size_t)> walk = [&](YAML::Node n, std::size_t i) {
    if (i + 1 == parts.size()) {
      n[parts[i]] = v;
      return;
    }
    if (!n[parts[i]] || !n[parts[i]].IsMap()) n[parts[i]] = YAML::Node(YAML::NodeType::Map);
    walk(n[parts[i]], i + 1);
  };
  walk(root, 0);
}

YAML::Node merge(YAML::Node base, const YAML::Node& over) {
  if (!base.IsMap() || !over.IsMap()) return over;
  for (const auto& kv : over) {
    const std::string k = kv.first.Scalar();
    if (base[k] && base[k].IsMap() && kv.second.IsMap()) base[k] = merge(base[k], kv.second);
    else
      base[k] = kv.second;
  }
  return base;
}

std::string scalar_at(const YAML::Node& root, const std::string& dotted_key) {
  // A clone: assigning to a yaml-cpp node writes through to the tree it came from.
  YAML::Node n = YAML::Clone(root);
  std::stringstream ss(dotted_key);
  for (std::string part; std::getline(ss, part, '.');) {
    if (!n.IsMap()) return "";
    n = n[part];
    if (!n) return "";
  }
  return n.IsScalar() ? n.Scalar() : "";
}

}  // namespace yaml

TrainConfig TrainConfig::load(const std::string& path, const std::vector<std::string>& sets) {
  return from_yaml(load_with_extends(path, 0), path, sets);
}

TrainConfig TrainConfig::from_yaml(const YAML::Node& in, const std::string& source,
                                   const std::vector<std::string>& sets) {
  YAML::Node node = in;  // shared, not cloned: Clone drops the line marks that errors cite
  if (!node || node.IsNull()) node = YAML::Node(YAML::NodeType::Map);
  if (!node.IsMap()) throw ConfigError(source + ": a training config must be a YAML mapping of keys");
  for (const auto& s : sets) {
    std::string key = s.substr(0, s.find('='));
    if (!is_key(key))
      throw ConfigError("--set " + s + ": unknown key '" + key + "' (see `bertsweep train --help` for keys)");
    yaml::set_path(node, s, "--set " + key);
  }
  TrainConfig c;
  auto fields = fields_of(c);
  std::map<std::string, const Field*> by_path;
  std::set<std::string> sections;
  for (const auto& f : fields) {
    by_path[f.path] = &f;
    auto dot = f.path.find('.');
    if (dot != std::string::npos) sections.insert(f.path.substr(0, dot));
  }
  std::set<std::string> seen;
  auto once = [&](const std::string& path, const YAML::Node& key) {
    if (!seen.insert(path).second)
      throw ConfigError(yaml::where(key, source) + ": key '" + path +
                        "' is given twice (YAML would keep only one; "
                        "delete the other)");
  };
  for (const auto& kv : node) {
    const std::string k = kv.first.Scalar();
    once(k, kv.first);
    if (sections.count(k)) {
      if (!kv.second.IsMap() && !kv.second.IsNull())
        throw ConfigError(yaml::where(kv.second, source) + ": '" + k + "' must be a mapping of keys");
      for (const auto& kv2 : kv.second) {
        std::string p = k + "." + kv2.first.Scalar();
        once(p, kv2.first);
        auto it = by_path.find(p);
        if (it == by_path.end())
          throw ConfigError(yaml::where(kv2.first, source) + ": unknown key '" + p + "' (typo? known keys of '" + k +
                            "' are listed by `bertsweep train --help`)");
        assign(*it->second, kv2.second, source);
      }
    } else {
      auto it = by_path.find(k);
      if (it == by_path.end()) throw ConfigError(yaml::where(kv.first, source) + ": unknown key '" + k + "'");
      assign(*it->second, kv.second, source);
    }
  }
  c.validate(source);
  return c;
}

YAML::Node TrainConfig::to_yaml() const {
  TrainConfig copy = *this;
  YAML::Node root(YAML::NodeType::Map);
  for (const auto& f : fields_of(copy)) emit(f, root);
  return root;
}

std::string TrainConfig::to_yaml_string() const {
  YAML::Emitter out;
  out.SetDoublePrecision(17);
  out << to_yaml();
  return std::string(out.c_str()) + "\n";
}

namespace {

// The table entry of `key` in `fields`; ConfigError for a key the table does not have.
const Field& field_named(const std::vector<Field>& fields, const std::string& key, const std::string& source) {
  for (const auto& f : fields)
    if (f.path == key) return f;
  throw ConfigError(source + ": unknown key '" + key + "' (see `bertsweep train --help` for keys)");
}

}  // namespace

void TrainConfig::set(const std::string& key, const std::string& value, const std::string& source) {
  YAML::Node node(YAML::NodeType::Map);
  yaml::set_path(node, "v=" + value, source);  // the same YAML parsing of the value as --set
  const auto fields = fields_of(*this);
  assign(field_named(fields, key, source), node["v"], source);
}

std::string TrainConfig::text(const std::string& key) const {
  TrainConfig copy = *this;
  const auto fields = fields_of(copy);
  YAML::Node root(YAML::NodeType::Map);
  emit(field_named(fields, key, "config"), root);
  const auto dot = key.find('.');  // keys have one or two levels (emit() writes them so)
  const YAML::Node value = dot == std::string::npos ? root[key] : root[key.substr(0, dot)][key.substr(dot + 1)];
  if (value.IsScalar()) return value.Scalar();
  YAML::Emitter out;  // lists, in the flow style to_yaml_string() writes
  out << value;
  return out.c_str();
}

TrainConfig TrainConfig::read_stored(const std::string& yaml_text) {
  TrainConfig c;
  YAML::Node loaded;
  try {
    loaded = YAML::Load(yaml_text);
  } catch (const YAML::Exception&) {
    return c;
  }
  if (!loaded.IsMap()) return c;
  const YAML::Node& root = loaded;  // const: indexing a missing key must not add it
  for (const auto& f : fields_of(c)) {
    // Copies, not assignments: assigning a missing key's (invalid) node throws in yaml-cpp.
    const auto dot = f.path.find('.');
    const YAML::Node section = dot == std::string::npos ? root : root[f.path.substr(0, dot)];
    if (!section || !section.IsMap()) continue;
    const YAML::Node value = section[dot == std::string::npos ? f.path : f.path.substr(dot + 1)];
    if (!value || value.IsNull()) continue;
    try {
      assign(f, value, "stored config");
    } catch (const ConfigError&) {  // a value this version refuses: keep the default
    }
  }
  return c;
}

double TrainConfig::number(const std::string& key) const {
  TrainConfig copy = *this;
  const auto fields = fields_of(copy);
  const FieldPtr& p = field_named(fields, key, "config").ptr;
  if (auto i = std::get_if<int64_t*>(&p)) return static_cast<double>(**i);
  if (auto d = std::get_if<double*>(&p)) return **d;
  throw ConfigError("key '" + key + "' is " + type_name(p) + ", not a number");
}

namespace {

// Throws the ConfigError of one key: "<source>: key 'k' <what>".
struct KeyCheck {
  const std::string& source;
  void fail(const std::string& key, const std::string& what) const {
    throw ConfigError(source + ": key '" + key + "' " + what);
  }
  void one_of(const std::string& key, const std::string& v) const {
    const auto allowed = bs::one_of(key);
    if (!allowed.count(v)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail(key, "is '" + v + "'; must be one of: " + list);
    }
  }
};

// What MLPerf training 5.0.0 asks of a closed BERT run that a config can show: the reference optimizer
// (LAMB: the checker's closed_bert rules want the opt_lamb_* keys), the quality target 0.720 (the
// checker wants an eval_accuracy >= 0.720) and the start from the phase-1 checkpoint.
void check_closed_division(const TrainConfig& c, const KeyCheck& k) {
  const OptimizerKind opt = parse_choice<OptimizerKind>(c.optimizer.name);
  if (opt != OptimizerKind::kLamb && opt != OptimizerKind::kNvLamb)
    k.fail("log.submission_division", "is 'closed', but optimizer.name is '" + c.optimizer.name +
                                          "': MLPerf's closed BERT rules allow only LAMB (lamb or nvlamb); "
                                          "set log.submission_division: open or optimizer.name: lamb");
  if (c.target.mlm_accuracy < 0.720)
    k.fail("log.submission_division", "is 'closed', but target.mlm_accuracy is " +
                                          std::to_string(c.target.mlm_accuracy) +
                                          ": closed BERT runs train to masked-LM accuracy 0.720; set "
                                          "target.mlm_accuracy: 0.72 or log.submission_division: open");
  if (c.model.init_checkpoint.empty())
    k.fail("log.submission_division",
           "is 'closed', but model.init_checkpoint is not set: closed BERT runs start "
           "from the phase-1 checkpoint; set model.init_checkpoint or "
           "log.submission_division: open");
}

void check_model(const ModelConfig& m, const KeyCheck& k) {
  if (m.vocab_size < 0) k.fail("model.vocab_size", "must be >= 0 (0: from the dataset)");
  if (m.hidden <= 0) k.fail("model.hidden", "must be > 0");
  if (m.layers <= 0) k.fail("model.layers", "must be > 0");
  // Sizes past these are typos, not models (BERT-large is 24 x 1024, vocab 30522, 512 positions): the
  // memory estimate below catches what is in range but does not fit.
  if (m.vocab_size > 1000000) k.fail("model.vocab_size", "must be <= 1,000,000");
  if (m.hidden > 16384) k.fail("model.hidden", "must be <= 16384");
  if (m.layers > 512) k.fail("model.layers", "must be <= 512");
  if (m.intermediate > 65536) k.fail("model.intermediate", "must be <= 65536");
  if (m.max_position > 65536) k.fail("model.max_position", "must be <= 65536");
  if (m.type_vocab_size < 2 || m.type_vocab_size > 16)
    k.fail("model.type_vocab_size", "must be in [2, 16] (BERT's two segments need 2)");
  if (m.heads > m.hidden) k.fail("model.heads", "must be <= model.hidden");
  if (m.heads <= 0 || m.hidden % m.heads != 0)
    k.fail("model.heads", "must be > 0 and divide model.hidden (" + std::to_string(m.hidden) + ")");
  if (m.intermediate <= 0) k.fail("model.intermediate", "must be > 0");
  if (m.max_position <= 0) k.fail("model.max_position", "must be > 0");
  if (m.dropout < 0 || m.dropout >= 1) k.fail("model.dropout", "must be in [0, 1)");
}

void check_data(const DataConfig& d, int64_t max_position, const KeyCheck& k) {
  if (d.seq_len <= 1) k.fail("data.seq_len", "must be > 1");
  if (d.seq_len > max_position)
    k.fail("data.seq_len", "(" + std::to_string(d.seq_len) + ") exceeds model.max_position (" +
                               std::to_string(max_position) + "); raise max_position or shorten seq_len");
  if (d.presort_group < 1) k.fail("data.presort_group", "must be >= 1");
  for (std::size_t i = 0; i < d.strata.size(); ++i)
    if (d.strata[i] <= 0 || (i > 0 && d.strata[i] <= d.strata[i - 1]))
      k.fail("data.strata", "must be increasing positive length bounds");
}

void check_optimizer_and_schedule(const OptimizerConfig& o, const ScheduleConfig& s, const KeyCheck& k) {
  if (!(o.lr > 0)) k.fail("optimizer.lr", "must be > 0");
  if (o.beta1 < 0 || o.beta1 >= 1) k.fail("optimizer.beta1", "must be in [0, 1)");
  if (o.beta2 < 0 || o.beta2 >= 1) k.fail("optimizer.beta2", "must be in [0, 1)");
  if (!(o.eps > 0)) k.fail("optimizer.eps", "must be > 0");
  if (o.weight_decay < 0) k.fail("optimizer.weight_decay", "must be >= 0");
  if (o.momentum < 0 || o.momentum >= 1) k.fail("optimizer.momentum", "must be in [0, 1)");
  if (s.warmup_fraction < 0 || s.warmup_fraction > 1) k.fail("schedule.warmup_fraction", "must be in [0, 1]");
  if (s.warmup_steps < -1) k.fail("schedule.warmup_steps", "must be >= 0 (or -1: use warmup_fraction)");
  if (s.power <= 0) k.fail("schedule.power", "must be > 0");
  if (s.total_steps < 0) k.fail("schedule.total_steps", "must be >= 0 (0: target.max_samples / batch.global)");
  if (s.start_warmup_step < 0) k.fail("schedule.start_warmup_step", "must be >= 0");
  if (s.end_lr < 0) k.fail("schedule.end_lr", "must be >= 0");
}

// Batch, clipping, distribution, target, checkpoints and the run's own keys.
void check_run(const TrainConfig& c, const KeyCheck& k) {
  if (c.batch.global <= 0) k.fail("batch.global", "must be > 0");
  if (c.batch.micro <= 0) k.fail("batch.micro", "must be > 0");
  if (c.batch.micro > c.batch.global)
    k.fail("batch.micro", "(" + std::to_string(c.batch.micro) + ") is larger than batch.global (" +
                              std::to_string(c.batch.global) +
                              "): a micro-batch is a part of one rank's share of "
                              "the global batch; set batch.micro <= batch.global");
  if (c.clip.max_norm <= 0) k.fail("clip.max_norm", "must be > 0");
  if (c.clip.bucket_mb <= 0) k.fail("clip.bucket_mb", "must be > 0");
  if (c.distributed.timeout_s <= 0) k.fail("distributed.timeout_s", "must be > 0");
  if (c.target.mlm_accuracy <= 0 || c.target.mlm_accuracy > 1) k.fail("target.mlm_accuracy", "must be in (0, 1]");
  if (c.target.max_samples <= 0) k.fail("target.max_samples", "must be > 0");
  if (c.target.eval_every_samples <= 0) k.fail("target.eval_every_samples", "must be > 0");
  if (c.checkpoint.every_samples < 0) k.fail("checkpoint.every_samples", "must be >= 0");
  if (c.threads < 0 || c.threads > 1024)
    k.fail("threads", "must be in [0, 1024] (0: this process's share of the cores)");
  if (c.seed < 0) k.fail("seed", "must be >= 0");
  if (c.data.eval_samples < 0) k.fail("data.eval_samples", "must be >= 0 (0: the whole eval set)");
  if (c.log.progress_every_steps < 1) k.fail("log.progress_every_steps", "must be >= 1");
  if (c.data.seq_len > 65536) k.fail("data.seq_len", "must be <= 65536");
}

}  // namespace

// The checks run in a fixed order: a config with several errors always reports the same one first.
void TrainConfig::validate(const std::string& source) const {
  const KeyCheck k{source};
  k.one_of("data.sampler", data.sampler);
  k.one_of("optimizer.name", optimizer.name);
  k.one_of("schedule.name", schedule.name);
  k.one_of("clip.mode", clip.mode);
  k.one_of("distributed.backend", distributed.backend);
  k.one_of("distributed.grad_dtype", distributed.grad_dtype);
  k.one_of("device", device);
  k.one_of("precision", precision);
  k.one_of("model.kernels", model.kernels);
  k.one_of("model.unpad", model.unpad);
  k.one_of("log.submission_division", log.submission_division);
  k.one_of("log.submission_status", log.submission_status);
  if (log.submission_org.empty()) k.fail("log.submission_org", "must not be empty (the MLLOG's submission_org)");
  if (log.submission_division == "closed") check_closed_division(*this, k);
  check_model(model, k);
  check_data(data, model.max_position, k);
  check_optimizer_and_schedule(optimizer, schedule, k);
  check_run(*this, k);
}

const std::vector<std::string>& TrainConfig::keys() {
  static const std::vector<std::string> k = [] {
    TrainConfig c;
    std::vector<std::string> out;
    for (const auto& f : fields_of(c)) out.push_back(f.path);
    return out;
  }();
  return k;
}

bool TrainConfig::is_key(const std::string& path) {
  for (const auto& k : keys())
    if (k == path) return true;
  return false;
}

}  // namespace bs
