#include "dataset/ShardIO.h"

#include <sstream>

#include <limits>

#include <optional>

#include <set>

#include <H5Cpp.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>

namespace bs {
namespace fs = std::filesystem;
namespace {

const char* kLayout =
    "not an MLPerf BERT shard (expected int datasets input_ids, input_mask, segment_ids [N,S], "
    "masked_lm_positions, masked_lm_ids [N,P], next_sentence_labels [N])";

// HDF5 prints its error stack to stderr by default; our exceptions say what went wrong instead.
void silence_hdf5() {
  static std::once_flag once;
  std::call_once(once, [] { H5::Exception::dontPrint(); });
}

std::string shape_str(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

// Reads one integer dataset as int32, checking its rank (rank-1 data may also be stored as [N,1]).
torch::Tensor read_int_dataset(const H5::H5File& file, const std::string& path, const std::string& name, int rank) {
  if (!file.nameExists(name)) throw DataError(path + ": dataset '" + name + "' is missing: " + kLayout);
  H5::DataSet ds = file.openDataSet(name);
  if (ds.getTypeClass() != H5T_INTEGER)
    throw DataError(path + ": dataset '" + name + "' is not integer-typed: " + kLayout);
  H5::DataSpace space = ds.getSpace();
  const int r = space.getSimpleExtentNdims();
  std::vector<hsize_t> dims(std::max(r, 0));
  if (r > 0) space.getSimpleExtentDims(dims.data());
  const bool column = rank == 1 && r == 2 && dims[1] == 1;
  if (r != rank && !column)
    throw DataError(path + ": dataset '" + name + "' has shape " + shape_str(dims) + ", expected rank " +
                    std::to_string(rank) + ": " + kLayout);
  std::vector<int64_t> shape(dims.begin(), dims.begin() + rank);
  torch::Tensor t = torch::empty(shape, torch::kInt32);
  if (t.numel() > 0) ds.read(t.data_ptr<int32_t>(), H5::PredType::NATIVE_INT32);
  return t;
}

void write_int_dataset(H5::H5File& file, const std::string& name, const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kCPU).to(torch::kInt32).contiguous();
  std::vector<hsize_t> dims(c.sizes().begin(), c.sizes().end());
  H5::DataSpace space(static_cast<int>(dims.size()), dims.data());
  H5::DSetCreatPropList props;
  if (c.numel() > 0) {
    // Chunked + deflate like MLPerf's shards (padding compresses well); ~1k rows per chunk.
    std::vector<hsize_t> chunk = dims;
    chunk[0] = std::min<hsize_t>(dims[0], 1024);
    props.setChunk(static_cast<int>(chunk.size()), chunk.data());
    if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0) props.setDeflate(1);
  }
  H5::DataSet ds = file.createDataSet(name, H5::PredType::STD_I32LE, space, props);
  if (c.numel() > 0) ds.write(c.data_ptr<int32_t>(), H5::PredType::NATIVE_INT32);
}

int64_t count_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DataError("cannot read vocab file " + path);
  int64_t n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

// BERT's special tokens: pretraining data and the masking procedure need every one of them.
void check_vocab(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DataError("cannot read vocab file " + path);
  std::set<std::string> need = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  for (std::string line; std::getline(in, line) && !need.empty();) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    need.erase(line);
  }
  if (!need.empty()) {
    std::string missing;
    for (const auto& t : need) missing += (missing.empty() ? "" : " ") + t;
    throw DataError("vocab " + path + " lacks the special token(s) " + missing +
                    " that BERT pretraining needs (use the vocab.txt that made the data)");
  }
}

// `meta.yaml` of a bertsweep dataset lists its shards and counts: a shard that went missing is an error,
// not a smaller dataset.
struct Meta {
  std::vector<std::string> shards;
  int64_t train_instances = -1, eval_instances = -1;
};
std::optional<Meta> read_meta(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  if (first.rfind("# bertsweep data prepare", 0) != 0) return std::nullopt;  // someone else's file
  Meta m;
  for (std::string line; std::getline(in, line);) {
    auto value = [&](const char* key) -> std::optional<std::string> {
      const std::string k = std::string(key) + ": ";
      if (line.rfind(k, 0) != 0) return std::nullopt;
      return line.substr(k.size());
    };
    try {
      if (auto v = value("train_instances")) m.train_instances = std::stoll(*v);
      if (auto v = value("eval_instances")) m.eval_instances = std::stoll(*v);
    } catch (const std::exception&) {
      throw DataError(path.string() + ": line '" + line + "' is not a count (a damaged meta.yaml)");
    }
    if (auto v = value("shards")) {
      std::string list = *v;
      for (char& c : list)
        if (c == '[' || c == ']' || c == ',') c = ' ';
      std::istringstream ss(list);
      for (std::string name; ss >> name;) m.shards.push_back(name);
    }
  }
  return m;
}

int64_t max_id(const ShardData& d) {
  int64_t m = -1;
  if (d.size() == 0) return m;
  m = std::max(m, d.input_ids.max().item<int64_t>());
  if (d.masked_lm_ids.numel() > 0) m = std::max(m, d.masked_lm_ids.max().item<int64_t>());
  return m;
}

}  // namespace

void check_shard_values(const ShardData& d, const std::string& file, int64_t vocab_size) {
  if (d.size() == 0) return;
  const int64_t seq = d.seq_len();
  auto check = [&](const torch::Tensor& t, const char* name, int64_t lo, int64_t hi, const std::string& why) {
    if (t.numel() == 0) return;
    const auto bad = t.lt(lo).logical_or_(t.ge(hi));
    if (!bad.any().item<bool>()) return;
    const auto at = bad.nonzero()[0];
    const int64_t row = at[0].item<int64_t>();
    const int64_t value = t.dim() == 1 ? t[row].item<int64_t>() : t[row][at[1]].item<int64_t>();
    throw DataError(file + ": dataset " + name + " holds " + std::to_string(value) + " at sample " +
                    std::to_string(row) + ", outside [" + std::to_string(lo) + ", " + std::to_string(hi - 1) + "] (" +
                    why + "); the shard is damaged or was made for another vocab: prepare it again");
  };
  const std::string vocab_why =
      vocab_size > 0 ? "token ids of the " + std::to_string(vocab_size) + "-token vocab" : "token ids are not negative";
  const int64_t vocab_hi = vocab_size > 0 ? vocab_size : std::numeric_limits<int32_t>::max();
  check(d.input_ids, "input_ids", 0, vocab_hi, vocab_why);
  check(d.input_mask, "input_mask", 0, 2, "1 for a real token, 0 for padding");
  check(d.segment_ids, "segment_ids", 0, 2, "sentence A is 0, sentence B is 1");
  check(d.next_sentence_labels, "next_sentence_labels", 0, 2, "0 is the next sentence, 1 a random one");
  check(d.masked_lm_positions, "masked_lm_positions", 0, seq,
        "positions inside the sequence of " + std::to_string(seq) + " tokens");
  check(d.masked_lm_ids, "masked_lm_ids", 0, vocab_hi, vocab_why);
  const auto empty = d.input_mask.sum(1).eq(0);
  if (empty.any().item<bool>())
    throw DataError(file + ": dataset input_mask is all zero at sample " +
                    std::to_string(empty.nonzero()[0][0].item<int64_t>()) +
                    " (a sample without a single real token); the shard is damaged: prepare it again");
  check_shard_structure(d, file);
}

void check_shard_structure(const ShardData& d, const std::string& file) {
  const int64_t n = d.size(), seq = d.seq_len(), pred = d.max_predictions();
  if (n == 0) return;
  // `bad_rows` [N] bool: the samples that break `rule`; the first one is named, with the count.
  auto require = [&](const torch::Tensor& bad_rows, const char* dataset, const std::string& rule) {
    const int64_t count = bad_rows.sum().item<int64_t>();
    if (count == 0) return;
    const int64_t row = bad_rows.nonzero()[0][0].item<int64_t>();
    throw DataError(file + ": dataset " + dataset + " at sample " + std::to_string(row) + " (and " +
                    std::to_string(count - 1) + " more of " + std::to_string(n) + " samples) breaks the rule: " + rule +
                    "; the shard is damaged or is not BERT pretraining data: prepare it again");
  };
  const auto mask = d.input_mask.ne(0);
  const auto length = mask.sum(1);
  if (seq > 1)
    require(mask.slice(1, 1).logical_and(mask.slice(1, 0, seq - 1).logical_not()).any(1), "input_mask",
            "a prefix of ones (the real tokens), then zeros (padding), with no hole");
  require(length.lt(kMinRealTokens), "input_mask",
          "at least " + std::to_string(kMinRealTokens) + " real tokens ([CLS], a token, [SEP])");
  require(d.input_ids.eq(0).logical_and(mask).any(1), "input_ids",
          "a real token (input_mask 1) is never id 0, the [PAD] token");
  require(d.segment_ids.select(1, 0).ne(0), "segment_ids", "the first token ([CLS]) is in sentence A (0)");
  if (seq > 1) {
    const auto both_real = mask.slice(1, 1);
    require(d.segment_ids.slice(1, 1).lt(d.segment_ids.slice(1, 0, seq - 1)).logical_and(both_real).any(1),
            "segment_ids", "0 for sentence A, then 1 for sentence B, within the real tokens");
  }
  if (pred == 0) return;
  // The masked tokens come first (masked_lm_ids non-zero: a real token's id), then zeros; as many positions,
  // strictly increasing, after [CLS] and inside the real tokens; the unused positions are 0.
  const auto used = d.masked_lm_ids.ne(0);
  if (pred > 1)
    require(used.slice(1, 1).logical_and(used.slice(1, 0, pred - 1).logical_not()).any(1), "masked_lm_ids",
            "the masked tokens' ids first, then 0 for the unused predictions");
  const auto pos = d.masked_lm_positions;
  require(pos.lt(1).logical_and(used).any(1), "masked_lm_positions",
          "a masked position is after [CLS] (position 0 is never masked; as many positions as non-zero masked_lm_ids)");
  require(pos.ge(length.unsqueeze(1)).logical_and(used).any(1), "masked_lm_positions",
          "a masked position is inside the real tokens (input_mask 1)");
  require(pos.ne(0).logical_and(used.logical_not()).any(1), "masked_lm_positions",
          "0 for each unused prediction (their count equals the non-zero masked_lm_ids)");
  if (pred > 1)
    require(pos.slice(1, 1).le(pos.slice(1, 0, pred - 1)).logical_and(used.slice(1, 1)).any(1), "masked_lm_positions",
            "strictly increasing over the masked tokens");
  if (!used.any().item<bool>())
    throw DataError(
        file +
        ": dataset masked_lm_ids is all 0: no sample has a masked token, nothing to train the masked LM on; "
        "the shard is damaged or is not BERT pretraining data: prepare it again");
}

ShardData read_shard(const std::string& path) {
  silence_hdf5();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw DataError("shard file " + path + " does not exist");
  ShardData d;
  try {
    if (!H5::H5File::isHdf5(path)) throw DataError(path + ": not an HDF5 file (corrupt, or not a shard)");
    H5::H5File file(path, H5F_ACC_RDONLY);
    d.input_ids = read_int_dataset(file, path, "input_ids", 2);
    d.input_mask = read_int_dataset(file, path, "input_mask", 2);
    d.segment_ids = read_int_dataset(file, path, "segment_ids", 2);
    d.masked_lm_positions = read_int_dataset(file, path, "masked_lm_positions", 2);
    d.masked_lm_ids = read_int_dataset(file, path, "masked_lm_ids", 2);
    d.next_sentence_labels = read_int_dataset(file, path, "next_sentence_labels", 1);
  } catch (const H5::Exception& e) {
    throw DataError(path + ": cannot read HDF5 data (" + e.getFuncName() + ": " + e.getDetailMsg() +
                    "): the file is truncated or corrupt; prepare it again");
  }
  const int64_t n = d.input_ids.size(0);
  auto check = [&](const torch::Tensor& t, const char* name, std::vector<int64_t> want) {
    if (t.sizes().vec() != want)
      throw DataError(path + ": dataset '" + name + "' has shape " + c10::str(t.sizes()) + " but input_ids has " +
                      std::to_string(n) + " rows: " + kLayout);
  };
  check(d.input_mask, "input_mask", d.input_ids.sizes().vec());
  check(d.segment_ids, "segment_ids", d.input_ids.sizes().vec());
  check(d.masked_lm_positions, "masked_lm_positions", {n, d.masked_lm_positions.size(1)});
  check(d.masked_lm_ids, "masked_lm_ids", d.masked_lm_positions.sizes().vec());
  check(d.next_sentence_labels, "next_sentence_labels", {n});
  if (n > 0 && (d.masked_lm_positions.min().item<int64_t>() < 0 ||
                d.masked_lm_positions.max().item<int64_t>() >= d.input_ids.size(1)))
    throw DataError(path + ": masked_lm_positions point outside the sequence of length " +
                    std::to_string(d.input_ids.size(1)));
  d.lengths = d.input_mask.ne(0).sum(1).to(torch::kInt32);
  return d;
}

void write_shard(const std::string& path, const ShardData& data) {
  silence_hdf5();
  const int64_t n = data.size();
  auto need = [&](const torch::Tensor& t, const char* name, int64_t rank) {
    if (!t.defined() || t.dim() != rank || t.size(0) != n)
      throw std::invalid_argument("write_shard(" + path + "): " + name + " must have rank " + std::to_string(rank) +
                                  " and " + std::to_string(n) + " rows");
  };
  need(data.input_ids, "input_ids", 2);
  need(data.input_mask, "input_mask", 2);
  need(data.segment_ids, "segment_ids", 2);
  need(data.masked_lm_positions, "masked_lm_positions", 2);
  need(data.masked_lm_ids, "masked_lm_ids", 2);
  need(data.next_sentence_labels, "next_sentence_labels", 1);
  const std::string tmp = path + ".tmp";
  try {
    {
      H5::H5File file(tmp, H5F_ACC_TRUNC);
      write_int_dataset(file, "input_ids", data.input_ids);
      write_int_dataset(file, "input_mask", data.input_mask);
      write_int_dataset(file, "segment_ids", data.segment_ids);
      write_int_dataset(file, "masked_lm_positions", data.masked_lm_positions);
      write_int_dataset(file, "masked_lm_ids", data.masked_lm_ids);
      write_int_dataset(file, "next_sentence_labels", data.next_sentence_labels);
    }
    fs::rename(tmp, path);
  } catch (const H5::Exception& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw DataError("cannot write shard " + tmp + " (" + e.getDetailMsg() +
                    "): is the disk full or the folder read-only?");
  }
}

ShardData concat_shards(const std::vector<ShardData>& shards) {
  ShardData out;
  std::vector<const ShardData*> parts;
  for (const auto& s : shards)
    if (s.input_ids.defined()) parts.push_back(&s);
  if (parts.empty()) return out;
  for (const auto* p : parts)
    if (p->seq_len() != parts[0]->seq_len() || p->max_predictions() != parts[0]->max_predictions())
      throw DataError("cannot concatenate shards with different shapes: seq_len " + std::to_string(p->seq_len()) +
                      " vs " + std::to_string(parts[0]->seq_len()) + ", max_predictions " +
                      std::to_string(p->max_predictions()) + " vs " + std::to_string(parts[0]->max_predictions()));
  auto cat = [&](torch::Tensor ShardData::*field) {
    std::vector<torch::Tensor> ts;
    for (const auto* p : parts) ts.push_back(p->*field);
    return torch::cat(ts, 0);
  };
  out.input_ids = cat(&ShardData::input_ids);
  out.input_mask = cat(&ShardData::input_mask);
  out.segment_ids = cat(&ShardData::segment_ids);
  out.masked_lm_positions = cat(&ShardData::masked_lm_positions);
  out.masked_lm_ids = cat(&ShardData::masked_lm_ids);
  out.next_sentence_labels = cat(&ShardData::next_sentence_labels);
  bool have_lengths = std::all_of(parts.begin(), parts.end(), [](const ShardData* p) { return p->lengths.defined(); });
  out.lengths = have_lengths ? cat(&ShardData::lengths) : out.input_mask.ne(0).sum(1).to(torch::kInt32);
  return out;
}

ShardData ShardData::rows(int64_t begin, int64_t end) const {
  ShardData part;
  part.input_ids = input_ids.slice(0, begin, end);
  part.input_mask = input_mask.slice(0, begin, end);
  part.segment_ids = segment_ids.slice(0, begin, end);
  part.masked_lm_positions = masked_lm_positions.slice(0, begin, end);
  part.masked_lm_ids = masked_lm_ids.slice(0, begin, end);
  part.next_sentence_labels = next_sentence_labels.slice(0, begin, end);
  return part;
}

namespace {

// data.eval_file (relative to the working folder, else to data.dir), default <dir>/eval.hdf5.
fs::path eval_file_of(const DataConfig& cfg) {
  std::error_code ec;
  fs::path eval_path = cfg.eval_file.empty() ? fs::path(cfg.dir) / "eval.hdf5" : fs::path(cfg.eval_file);
  if (!cfg.eval_file.empty() && eval_path.is_relative() && !fs::exists(eval_path, ec) &&
      fs::exists(fs::path(cfg.dir) / eval_path, ec))
    eval_path = fs::path(cfg.dir) / eval_path;
  if (!fs::is_regular_file(eval_path, ec))
    throw DataError("eval file " + eval_path.string() + " does not exist (data.eval_file, default <dir>/eval.hdf5)");
  return eval_path;
}

// "train_00003.hdf5" -> "train_#.hdf5": the name pattern of a shard set.
std::string shard_pattern(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      if (out.empty() || out.back() != '#') out += '#';
    } else {
      out += c;
    }
  }
  return out;
}

// The shards meta.yaml lists (a bertsweep dataset trains on exactly those: not, e.g., its eval.hdf5 when
// data.eval_file names another eval set), else the *.hdf5 files of the folder (but the eval file) that
// follow the most common name pattern (train_#.hdf5, part-#-of-#.hdf5). Any other *.hdf5 there is not
// read, and named in a warning: a stray file (a copy, another dataset's eval set) never trains.
std::vector<std::string> train_files_of(const DataConfig& cfg, const fs::path& eval_path,
                                        const std::optional<Meta>& meta) {
  std::error_code ec;
  std::vector<std::string> files, others;
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(cfg.dir, ec)) {
    if (!e.is_regular_file(ec) || e.path().extension() != ".hdf5") continue;
    if (!fs::equivalent(e.path(), eval_path, ec)) found.push_back(e.path());
  }
  std::sort(found.begin(), found.end());
  if (meta && !meta->shards.empty()) {
    for (const auto& name : meta->shards) {
      const fs::path shard = fs::path(cfg.dir) / name;
      if (!fs::is_regular_file(shard, ec))
        throw DataError(
            shard.string() + " is listed in " + cfg.dir +
            "/meta.yaml but missing: the dataset is incomplete (restore the shard or prepare the data again)");
      if (!fs::equivalent(shard, eval_path, ec)) files.push_back(shard.string());
    }
    for (const auto& f : found)
      if (std::find(meta->shards.begin(), meta->shards.end(), f.filename().string()) == meta->shards.end())
        others.push_back(f.string());
  } else {
    std::map<std::string, int> count;
    for (const auto& f : found) ++count[shard_pattern(f.filename().string())];
    std::string pattern;
    for (const auto& [p, c] : count)
      if (pattern.empty() || c > count[pattern]) pattern = p;
    for (const auto& f : found)
      (shard_pattern(f.filename().string()) == pattern ? files : others).push_back(f.string());
  }
  if (files.empty())
    throw DataError("data folder " + cfg.dir + " has no training shards (*.hdf5 besides the eval file)");
  if (!others.empty()) {
    std::string list;
    for (const auto& o : others) list += (list.empty() ? "" : ", ") + o;
    std::cerr << "warning: " << cfg.dir << ": not reading " << list << " ("
              << (meta ? "not a shard listed in meta.yaml" : "not named like the training shards " + files.front())
              << "; move it out of the data folder to silence this)\n";
  }
  return files;
}

void check_seq_len(const DataConfig& cfg, const ShardData& d, const std::string& file) {
  if (cfg.seq_len > 0 && d.size() > 0 && d.seq_len() != cfg.seq_len)
    throw DataError(file + " has sequences of length " + std::to_string(d.seq_len()) + " but data.seq_len is " +
                    std::to_string(cfg.seq_len) + " (prepare the data with --seq-len " + std::to_string(cfg.seq_len) +
                    " or set data.seq_len)");
}

// The counts meta.yaml states must match what the shards hold: a replaced or damaged file otherwise trains.
void check_against_meta(const DataConfig& cfg, const Dataset& ds, const fs::path& eval_path,
                        const std::optional<Meta>& meta) {
  if (meta && meta->train_instances >= 0 && meta->train_instances != ds.train.size())
    throw DataError(cfg.dir + "/meta.yaml says " + std::to_string(meta->train_instances) +
                    " training samples but the "
                    "shards it lists hold " +
                    std::to_string(ds.train.size()) +
                    ": a shard was replaced or damaged "
                    "(prepare the data again)");
  if (meta && meta->eval_instances >= 0 && cfg.eval_file.empty() && meta->eval_instances != ds.eval.size())
    throw DataError(cfg.dir + "/meta.yaml says " + std::to_string(meta->eval_instances) + " eval samples but " +
                    eval_path.string() + " holds " + std::to_string(ds.eval.size()) +
                    ": the eval set was replaced or damaged (prepare the data again)");
}

}  // namespace

Dataset load_dataset(const DataConfig& cfg) {
  if (cfg.dir.empty()) throw DataError("data.dir is not set (point it at a folder made by bertsweep data prepare)");
  std::error_code ec;
  if (!fs::is_directory(cfg.dir, ec))
    throw DataError("data folder " + cfg.dir + " does not exist (run: bertsweep data prepare ... --out " + cfg.dir +
                    ")");
  const fs::path eval_path = eval_file_of(cfg);
  const auto meta = read_meta(fs::path(cfg.dir) / "meta.yaml");
  Dataset ds;
  ds.dir = cfg.dir;
  ds.train_files = train_files_of(cfg, eval_path, meta);

  std::vector<ShardData> shards;
  std::vector<int64_t> shard_sizes;
  for (const auto& f : ds.train_files) {
    shards.push_back(read_shard(f));
    shard_sizes.push_back(shards.back().size());
    check_seq_len(cfg, shards.back(), f);
    if (shards.back().max_predictions() != shards.front().max_predictions())
      throw DataError(f + " has " + std::to_string(shards.back().max_predictions()) +
                      " masked positions per sample but " + ds.train_files.front() + " has " +
                      std::to_string(shards.front().max_predictions()));
  }
  ds.train = concat_shards(shards);
  shards.clear();
  ds.eval = read_shard(eval_path.string());
  check_seq_len(cfg, ds.eval, eval_path.string());
  if (ds.eval.size() == 0)
    throw DataError("eval file " + eval_path.string() + " holds no samples: accuracy could not be measured");
  check_against_meta(cfg, ds, eval_path, meta);

  const fs::path vocab = fs::path(cfg.dir) / "vocab.txt";
  if (fs::exists(vocab, ec)) {
    check_vocab(vocab.string());
    ds.vocab_size = count_lines(vocab.string());  // ids past it: check_shard_values below names the shard
  } else {
    ds.vocab_size = std::max(max_id(ds.train), max_id(ds.eval)) + 1;
  }
  // One pass over every value before training: out-of-range ids, segments, labels or masks would otherwise
  // surface as a LibTorch index error deep inside a step.
  for (std::size_t i = 0, row = 0; i < ds.train_files.size(); ++i) {
    check_shard_values(ds.train.rows(row, row + shard_sizes[i]), ds.train_files[i], ds.vocab_size);
    row += shard_sizes[i];
  }
  check_shard_values(ds.eval, eval_path.string(), ds.vocab_size);
  return ds;
}

std::vector<int64_t> length_histogram(const ShardData& data, int64_t bin_width) {
  if (bin_width <= 0) throw std::invalid_argument("length_histogram: bin_width must be positive");
  if (data.size() == 0) return {};
  const int64_t bins = (data.seq_len() + bin_width - 1) / bin_width;
  std::vector<int64_t> hist(std::max<int64_t>(bins, 1), 0);
  torch::Tensor lengths = data.lengths.defined() ? data.lengths : data.input_mask.ne(0).sum(1);
  lengths = lengths.to(torch::kInt64).contiguous();
  const int64_t* p = lengths.data_ptr<int64_t>();
  for (int64_t i = 0; i < lengths.numel(); ++i) {
    const int64_t b = std::clamp<int64_t>((p[i] - 1) / bin_width, 0, static_cast<int64_t>(hist.size()) - 1);
    ++hist[b];
  }
  return hist;
}

}  // namespace bs
