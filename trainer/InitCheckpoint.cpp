#include "trainer/InitCheckpoint.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "dataset/ShardIO.h"

namespace bs {
namespace fs = std::filesystem;

namespace {

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream os;
  os << "[";
  for (int64_t i = 0; i < t.dim(); ++i) os << (i ? ", " : "") << t.size(i);
  os << "]";
  return os.str();
}

std::string shape_of(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

// A bertsweep checkpoint: an OutputArchive with "param.<name>" entries (and the optimizer's, ignored here).
bool read_bertsweep(const std::string& path, std::map<std::string, torch::Tensor>& out) {
  torch::serialize::InputArchive ar;
  try {
    ar.load_from(path, torch::Device(torch::kCPU));
  } catch (const std::exception&) {
    return false;
  }
  const auto keys = ar.keys();
  bool any = false;
  for (const auto& k : keys) {
    if (k.rfind("param.", 0) != 0) continue;
    torch::Tensor t;
    if (ar.try_read(k, t)) {
      out[k.substr(6)] = t;
      any = true;
    }
  }
  return any;
}

// The Hugging Face / NVIDIA name of a state-dict entry, mapped to this model's; "" when it has no counterpart
// here (the tied decoder weight, position ids buffers, ...). q/k/v come back as "<layer>.attention.qkv.<w|b>"
// with `part` 0, 1 or 2.
std::string map_hf_name(std::string n, int& part) {
  part = -1;
  for (const char* prefix : {"module.", "model."})
    if (n.rfind(prefix, 0) == 0) n = n.substr(std::string(prefix).size());
  // Old TF-converted names: LayerNorm gamma/beta.
  auto ends = [&](const std::string& s) {
    return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
  };
  if (n.find("LayerNorm") != std::string::npos) {
    if (ends(".gamma")) n = n.substr(0, n.size() - 6) + ".weight";
    else if (ends(".beta"))
      n = n.substr(0, n.size() - 5) + ".bias";
  }
  static const std::regex layer(R"(^bert\.encoder\.layer\.(\d+)\.(.+)$)");
  std::smatch m;
  if (std::regex_match(n, m, layer)) {
    const std::string i = m[1], rest = m[2];
    const std::string base = "encoder." + i + ".";
    static const std::regex qkv(R"(^attention\.self\.(query|key|value)\.(weight|bias)$)");
    std::smatch q;
    if (std::regex_match(rest, q, qkv)) {
      part = q[1] == "query" ? 0 : q[1] == "key" ? 1 : 2;
      return base + "attention.qkv." + std::string(q[2]);
    }
    static const std::vector<std::pair<std::string, std::string>> inner = {
        {"attention.output.dense.", "attention.output."}, {"attention.output.LayerNorm.", "attention.LayerNorm."},
        {"intermediate.dense.", "ffn.intermediate."},     {"output.dense.", "ffn.output."},
        {"output.LayerNorm.", "ffn.LayerNorm."},
    };
    for (const auto& [from, to] : inner)
      if (rest.rfind(from, 0) == 0) return base + to + rest.substr(from.size());
    return "";
  }
  static const std::vector<std::pair<std::string, std::string>> top = {
      {"bert.embeddings.word_embeddings.", "embeddings.word_embeddings."},
      {"bert.embeddings.position_embeddings.", "embeddings.position_embeddings."},
      {"bert.embeddings.token_type_embeddings.", "embeddings.token_type_embeddings."},
      {"bert.embeddings.LayerNorm.", "embeddings.LayerNorm."},
      {"cls.predictions.transform.dense.", "mlm.transform."},
      {"cls.predictions.transform.LayerNorm.", "mlm.LayerNorm."},
      {"bert.pooler.dense.", "nsp.pooler."},
      {"cls.seq_relationship.", "nsp.classifier."},
  };
  for (const auto& [from, to] : top)
    if (n.rfind(from, 0) == 0) return to + n.substr(from.size());
  // The decoder's bias: HF keeps `cls.predictions.bias` (and an alias `decoder.bias`); the decoder weight
  // is the word embedding here.
  if (n == "cls.predictions.bias") return "mlm.decoder_bias";
  return "";
}

// ---------------------------------------------------------------------------------------------------------
// A reader for Python's torch.save zip files: LibTorch 1.13's torch::pickle_load turns the OrderedDict that
// `model.state_dict()` returns into None (pytorch/pytorch#100741), so the pickle (protocol 2, as torch.save
// writes it) is interpreted here. Only what a state dict needs is built: dicts, lists, tuples, strings,
// numbers, tensors (torch._utils._rebuild_tensor_v2 / _rebuild_parameter over the zip's data/<key> storages);
// any other class becomes an opaque value and its state is ignored (an NVIDIA checkpoint's argparse Namespace).
struct PyValue;
using PyPtr = std::shared_ptr<PyValue>;
struct PyValue {
  enum Kind { kNone, kBool, kInt, kFloat, kStr, kTuple, kList, kDict, kGlobal, kTensor, kMark, kOpaque } kind = kNone;
  int64_t i = 0;
  double f = 0;
  std::string s;                                 // string, or "module.name" of a global
  std::vector<PyPtr> items;                      // tuple, list
  std::vector<std::pair<PyPtr, PyPtr>> entries;  // dict, in order
  torch::Tensor tensor;
};

PyPtr make(PyValue::Kind k) {
  auto v = std::make_shared<PyValue>();
  v->kind = k;
  return v;
}

torch::ScalarType storage_dtype(const std::string& global) {
  static const std::map<std::string, torch::ScalarType> m = {
      {"torch.FloatStorage", torch::kFloat}, {"torch.DoubleStorage", torch::kDouble},
      {"torch.HalfStorage", torch::kHalf},   {"torch.BFloat16Storage", torch::kBFloat16},
      {"torch.LongStorage", torch::kLong},   {"torch.IntStorage", torch::kInt},
      {"torch.ShortStorage", torch::kShort}, {"torch.CharStorage", torch::kChar},
      {"torch.ByteStorage", torch::kByte},   {"torch.BoolStorage", torch::kBool},
  };
  auto it = m.find(global);
  if (it == m.end()) throw std::runtime_error("unsupported storage type " + global);
  return it->second;
}

class TorchZipUnpickler {
 public:
  explicit TorchZipUnpickler(const std::string& path) : zip_(path) {}

  PyPtr load() {
    auto [ptr, size] = zip_.getRecord("data.pkl");
    p_ = static_cast<const uint8_t*>(ptr.get());
    end_ = p_ + size;
    holder_ = std::move(ptr);
    for (;;) {
      const uint8_t op = byte();
      if (op == '.') return pop();  // STOP
      if (framing_or_memo(op) || scalar(op) || container(op) || object(op)) continue;
      char buf[8];
      std::snprintf(buf, sizeof buf, "0x%02x", op);
      throw std::runtime_error(std::string("unsupported pickle opcode ") + buf);
    }
  }

 private:
  // Each handles one group of opcodes and returns false for an opcode of another group.
  bool framing_or_memo(uint8_t op) {
    switch (op) {
      case 0x80: byte(); return true;                                             // PROTO
      case 0x95: bytes(8); return true;                                           // FRAME
      case 'q': memo_[byte()] = top(); return true;                               // BINPUT
      case 'r': memo_[static_cast<int64_t>(u32())] = top(); return true;          // LONG_BINPUT
      case 0x94: memo_[static_cast<int64_t>(memo_.size())] = top(); return true;  // MEMOIZE
      case 'h': push(memo_.at(byte())); return true;                              // BINGET
      case 'j': push(memo_.at(static_cast<int64_t>(u32()))); return true;         // LONG_BINGET
      case '(': push(make(PyValue::kMark)); return true;                          // MARK
      default: return false;
    }
  }

  // None, booleans, integers, floats and strings.
  bool scalar(uint8_t op) {
    switch (op) {
      case 'N': push(make(PyValue::kNone)); return true;
      case 0x88:
      case 0x89: {  // NEWTRUE / NEWFALSE
        auto b = make(PyValue::kBool);
        b->i = op == 0x88;
        push(b);
        return true;
      }
      case 'J': push_int(static_cast<int32_t>(u32())); return true;  // BININT
      case 'K': push_int(byte()); return true;                       // BININT1
      case 'M': push_int(u16()); return true;                        // BININT2
      case 0x8a: {                                                   // LONG1: little-endian two's complement
        const int n = byte();
        int64_t v = 0;
        for (int k = 0; k < n; ++k) v |= static_cast<int64_t>(byte()) << (8 * k);
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v -= int64_t(1) << (8 * n);
        push_int(v);
        return true;
      }
      case 'G': {  // BINFLOAT, big-endian
        uint64_t b = 0;
        for (int k = 0; k < 8; ++k) b = (b << 8) | byte();
        auto v = make(PyValue::kFloat);
        std::memcpy(&v->f, &b, 8);
        push(v);
        return true;
      }
      case 'X': push_str(u32()); return true;    // BINUNICODE
      case 0x8c: push_str(byte()); return true;  // SHORT_BINUNICODE
      case 'U': push_str(byte()); return true;   // SHORT_BINSTRING
      case 'T': push_str(u32()); return true;    // BINSTRING
      default: return false;
    }
  }

  // Tuples, lists and dicts: built empty, then filled.
  bool container(uint8_t op) {
    switch (op) {
      case ')': push(make(PyValue::kTuple)); return true;  // EMPTY_TUPLE
      case ']': push(make(PyValue::kList)); return true;   // EMPTY_LIST
      case '}': push(make(PyValue::kDict)); return true;   // EMPTY_DICT
      case 't': {                                          // TUPLE
        auto t = make(PyValue::kTuple);
        t->items = pop_mark();
        push(t);
        return true;
      }
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        const int n = op - 0x84;
        auto t = make(PyValue::kTuple);
        t->items.resize(n);
        for (int k = n - 1; k >= 0; --k) t->items[k] = pop();
        push(t);
        return true;
      }
      case 'a': {  // APPEND
        auto v = pop();
        top()->items.push_back(v);
        return true;
      }
      case 'e': {  // APPENDS
        auto items = pop_mark();
        for (auto& v : items) top()->items.push_back(v);
        return true;
      }
      case 's': {  // SETITEM
        auto v = pop(), k = pop();
        top()->entries.emplace_back(k, v);
        return true;
      }
      case 'u': {  // SETITEMS
        auto items = pop_mark();
        for (std::size_t k = 0; k + 1 < items.size(); k += 2) top()->entries.emplace_back(items[k], items[k + 1]);
        return true;
      }
      default: return false;
    }
  }

  // Globals, calls (tensors are rebuilt here) and objects.
  bool object(uint8_t op) {
    switch (op) {
      case 'c': {  // GLOBAL module\nname\n
        std::string mod = line(), name = line();
        auto g = make(PyValue::kGlobal);
        g->s = mod + "." + name;
        push(g);
        return true;
      }
      case 0x93: {  // STACK_GLOBAL
        auto name = pop(), mod = pop();
        auto g = make(PyValue::kGlobal);
        g->s = mod->s + "." + name->s;
        push(g);
        return true;
      }
      case 'R': {  // REDUCE
        auto args = pop(), fn = pop();
        push(reduce(fn, args));
        return true;
      }
      case 0x81:  // NEWOBJ
        pop();
        pop();
        push(make(PyValue::kOpaque));
        return true;
      case 'b': pop(); return true;                    // BUILD: object state (an OrderedDict's _metadata) is not needed
      case 'Q': push(persistent(pop())); return true;  // BINPERSID
      default: return false;
    }
  }

  uint8_t byte() {
    if (p_ >= end_) throw std::runtime_error("truncated pickle");
    return *p_++;
  }
  const uint8_t* bytes(std::size_t n) {
    if (static_cast<std::size_t>(end_ - p_) < n) throw std::runtime_error("truncated pickle");
    const uint8_t* at = p_;
    p_ += n;
    return at;
  }
  uint32_t u32() {
    const uint8_t* b = bytes(4);
    return uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
  }
  uint16_t u16() {
    const uint8_t* b = bytes(2);
    return uint16_t(b[0] | b[1] << 8);
  }
  std::string line() {
    std::string out;
    for (uint8_t c; (c = byte()) != '\n';) out.push_back(static_cast<char>(c));
    return out;
  }
  void push(PyPtr v) { stack_.push_back(std::move(v)); }
  void push_int(int64_t i) {
    auto v = make(PyValue::kInt);
    v->i = i;
    push(v);
  }
  void push_str(std::size_t n) {
    auto v = make(PyValue::kStr);
    const uint8_t* b = bytes(n);
    v->s.assign(reinterpret_cast<const char*>(b), n);
    push(v);
  }
  PyPtr top() {
    if (stack_.empty()) throw std::runtime_error("pickle stack underflow");
    return stack_.back();
  }
  PyPtr pop() {
    auto v = top();
    stack_.pop_back();
    return v;
  }
  std::vector<PyPtr> pop_mark() {
    std::vector<PyPtr> items;
    for (;;) {
      auto v = pop();
      if (v->kind == PyValue::kMark) break;
      items.push_back(v);
    }
    std::reverse(items.begin(), items.end());
    return items;
  }
  static std::vector<int64_t> ints(const PyPtr& t) {
    std::vector<int64_t> out;
    for (const auto& v : t->items) out.push_back(v->i);
    return out;
  }
  PyPtr reduce(const PyPtr& fn, const PyPtr& args) {
    const std::string& f = fn->s;
    if (f == "collections.OrderedDict") return make(PyValue::kDict);
    if ((f == "torch._utils._rebuild_tensor_v2" || f == "torch._utils._rebuild_tensor") && args->items.size() >= 4) {
      const auto& storage = args->items[0]->tensor;
      auto t = make(PyValue::kTensor);
      t->tensor = storage.as_strided(ints(args->items[2]), ints(args->items[3]), args->items[1]->i);
      return t;
    }
    if (f == "torch._utils._rebuild_parameter" && !args->items.empty()) return args->items[0];
    return make(PyValue::kOpaque);
  }
  PyPtr persistent(const PyPtr& pid) {
    // ('storage', <storage type>, key, location, numel)
    if (pid->kind != PyValue::kTuple || pid->items.size() < 5 || pid->items[0]->s != "storage")
      throw std::runtime_error("unsupported persistent id");
    const std::string key = pid->items[2]->s;
    auto v = make(PyValue::kTensor);
    auto it = storages_.find(key);
    if (it == storages_.end()) {
      const auto dtype = storage_dtype(pid->items[1]->s);
      const int64_t numel = pid->items[4]->i;
      auto [data, size] = zip_.getRecord("data/" + key);
      const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
      if (static_cast<int64_t>(size) < numel * elem) throw std::runtime_error("storage data/" + key + " is truncated");
      auto t = torch::empty({numel}, torch::TensorOptions().dtype(dtype));
      std::memcpy(t.data_ptr(), data.get(), static_cast<std::size_t>(numel * elem));
      it = storages_.emplace(key, t).first;
    }
    v->tensor = it->second;  // shared: tied weights view one storage
    return v;
  }

  caffe2::serialize::PyTorchStreamReader zip_;
  at::DataPtr holder_;
  const uint8_t* p_ = nullptr;
  const uint8_t* end_ = nullptr;
  std::vector<PyPtr> stack_;
  std::map<int64_t, PyPtr> memo_;
  std::map<std::string, torch::Tensor> storages_;
};

// A Python torch.save file: a (possibly nested: {"model": {...}}) dict of name -> tensor.
bool read_state_dict(const std::string& path, std::map<std::string, torch::Tensor>& out, std::string& why) {
  PyPtr v;
  try {
    v = TorchZipUnpickler(path).load();
  } catch (const std::exception& e) {
    why = std::string(e.what()).substr(0, 200);
    auto nl = why.find('\n');
    if (nl != std::string::npos) why = why.substr(0, nl);
    return false;
  }
  auto find = [](const PyPtr& d, const std::string& k) -> PyPtr {
    for (const auto& [key, val] : d->entries)
      if (key->kind == PyValue::kStr && key->s == k) return val;
    return nullptr;
  };
  // {"model": state_dict, ...} (NVIDIA's checkpoints) or {"state_dict": ...}.
  for (int depth = 0; depth < 3 && v->kind == PyValue::kDict; ++depth) {
    PyPtr inner;
    for (const char* k : {"model", "state_dict", "module"})
      if (auto c = find(v, k); c && c->kind == PyValue::kDict) {
        inner = c;
        break;
      }
    if (!inner) break;
    v = inner;
  }
  if (v->kind != PyValue::kDict) {
    why = "the file does not hold a state dict (a dict of parameter name -> tensor)";
    return false;
  }
  std::map<std::string, torch::Tensor> parts[3];
  for (const auto& [key, val] : v->entries) {
    if (key->kind != PyValue::kStr || val->kind != PyValue::kTensor) continue;
    int part = -1;
    const std::string name = map_hf_name(key->s, part);
    if (name.empty()) continue;
    if (part >= 0) parts[part][name] = val->tensor;
    else
      out[name] = val->tensor;
  }
  // q, k, v -> [q; k; v] along the output dimension (the layout of BertAttention's qkv projection). A layer
  // with only some of the three leaves qkv absent: reported as missing below.
  for (const auto& [name, q] : parts[0]) {
    auto k = parts[1].find(name), val = parts[2].find(name);
    if (k == parts[1].end() || val == parts[2].end()) continue;
    if (q.sizes() != k->second.sizes() || q.sizes() != val->second.sizes()) {
      why = name + ": query, key and value have different shapes (" + shape_of(q) + ", " + shape_of(k->second) + ", " +
            shape_of(val->second) + ")";
      return false;
    }
    out[name] = torch::cat({q, k->second, val->second}, 0);
  }
  if (out.empty()) {
    why = "no entry has a BERT parameter name (bert.embeddings..., bert.encoder.layer.N..., cls...)";
    return false;
  }
  return true;
}

// The Hugging Face name(s) of one of this model's parameters, for error messages about a state dict.
std::string hf_name_of(const std::string& name) {
  static const std::regex layer(R"(^encoder\.(\d+)\.(.+)$)");
  std::smatch m;
  if (std::regex_match(name, m, layer)) {
    const std::string base = "bert.encoder.layer." + std::string(m[1]) + ".", rest = m[2];
    static const std::vector<std::pair<std::string, std::string>> inner = {
        {"attention.qkv.", "attention.self.{query,key,value}."},
        {"attention.output.", "attention.output.dense."},
        {"attention.LayerNorm.", "attention.output.LayerNorm."},
        {"ffn.intermediate.", "intermediate.dense."},
        {"ffn.output.", "output.dense."},
        {"ffn.LayerNorm.", "output.LayerNorm."},
    };
    for (const auto& [from, to] : inner)
      if (rest.rfind(from, 0) == 0) return base + to + rest.substr(from.size());
    return "";
  }
  static const std::vector<std::pair<std::string, std::string>> top = {
      {"embeddings.", "bert.embeddings."},
      {"mlm.transform.", "cls.predictions.transform.dense."},
      {"mlm.LayerNorm.", "cls.predictions.transform.LayerNorm."},
      {"nsp.pooler.", "bert.pooler.dense."},
      {"nsp.classifier.", "cls.seq_relationship."},
  };
  for (const auto& [from, to] : top)
    if (name.rfind(from, 0) == 0) return to + name.substr(from.size());
  if (name == "mlm.decoder_bias") return "cls.predictions.bias";
  return "";
}

std::string described(const std::string& name) {
  const std::string hf = hf_name_of(name);
  return "'" + name + "'" + (hf.empty() ? "" : " (" + hf + " in a Hugging Face / NVIDIA state dict)");
}

}  // namespace

std::map<std::string, torch::Tensor> read_init_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw DataError("model.init_checkpoint: " + path +
                    " is not a file (give a bertsweep checkpoint-<step>.pt or "
                    "a PyTorch state dict written by torch.save)");
  std::map<std::string, torch::Tensor> out;
  if (read_bertsweep(path, out)) return out;
  std::string why;
  if (read_state_dict(path, out, why)) return out;
  throw DataError("model.init_checkpoint: " + path +
                  " is neither a bertsweep checkpoint nor a readable PyTorch state dict (" + why + ")");
}

void load_init_checkpoint(const std::string& path, BertForPretraining& model) {
  const auto weights = read_init_checkpoint(path);
  // Check every parameter before changing any: the first mismatch in the model's order is reported.
  for (const auto& kv : model->named_parameters()) {
    auto it = weights.find(kv.key());
    if (it == weights.end())
      throw DataError("model.init_checkpoint: " + path + " has no weights for parameter " + described(kv.key()) +
                      " (expected shape " + shape_of(kv.value().sizes().vec()) +
                      "); the file is for another model or not a BERT checkpoint");
    if (it->second.sizes() != kv.value().sizes())
      throw DataError("model.init_checkpoint: " + path + ": parameter " + described(kv.key()) + " has shape " +
                      shape_of(it->second) + " in the file, but the model expects " +
                      shape_of(kv.value().sizes().vec()) +
                      " (set the model: keys to the checkpoint's shape, e.g. model.vocab_size, model.hidden)");
    if (!it->second.is_floating_point())
      throw DataError("model.init_checkpoint: " + path + ": parameter '" + kv.key() +
                      "' is not a floating-point tensor");
  }
  torch::NoGradGuard no_grad;
  for (const auto& kv : model->named_parameters()) kv.value().copy_(weights.at(kv.key()));
}

}  // namespace bs
