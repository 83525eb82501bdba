#include "dataset/PretrainingData.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dataset/Corpus.h"
#include "dataset/VocabTrainer.h"

namespace bs {
namespace fs = std::filesystem;

uint64_t Rng::below(uint64_t n) {
  if (n == 0) throw std::invalid_argument("Rng::below(0)");
  const uint64_t threshold = (0 - n) % n;  // 2^64 mod n: values below it would bias the modulo
  for (;;) {
    const uint64_t x = engine_();
    if (x >= threshold) return x % n;
  }
}

int64_t Rng::between(int64_t lo, int64_t hi) {
  if (hi < lo) throw std::invalid_argument("Rng::between: empty range");
  return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo) + 1));
}

double Rng::uniform() { return static_cast<double>(engine_() >> 11) * (1.0 / 9007199254740992.0); }

namespace {

struct Instance {
  std::vector<int32_t> tokens;  // [CLS] A [SEP] B [SEP], masks applied
  int32_t len_a = 0;            // tokens of segment A (without specials)
  bool random_next = false;
  std::vector<std::pair<int32_t, int32_t>> masked;  // (position, original id), sorted by position
};

// BERT's truncate_seq_pair: drop from the longer segment, at the front or back at random.
void truncate_pair(std::vector<int32_t>& a, std::vector<int32_t>& b, std::size_t max_tokens, Rng& rng) {
  while (a.size() + b.size() > max_tokens) {
    auto& longer = a.size() > b.size() ? a : b;
    if (rng.uniform() < 0.5) {
      longer.erase(longer.begin());
    } else {
      longer.pop_back();
    }
  }
}

// BERT's create_masked_lm_predictions without whole-word masking: every non-special token is a candidate.
void mask_tokens(Instance& inst, const Vocab& vocab, const PretrainingOptions& opts, Rng& rng) {
  std::vector<int32_t> candidates;
  for (std::size_t i = 0; i < inst.tokens.size(); ++i)
    if (inst.tokens[i] != vocab.cls_id() && inst.tokens[i] != vocab.sep_id())
      candidates.push_back(static_cast<int32_t>(i));
  rng.shuffle(candidates);
  const int64_t wanted =
      std::max<int64_t>(1, static_cast<int64_t>(std::nearbyint(inst.tokens.size() * opts.masked_lm_prob)));
  const int64_t to_predict = std::min(opts.max_predictions, wanted);
  const auto& replacements = vocab.ordinary_ids();
  for (int32_t pos : candidates) {
    if (static_cast<int64_t>(inst.masked.size()) >= to_predict) break;
    const int32_t original = inst.tokens[pos];
    int32_t replacement;
    if (rng.uniform() < 0.8) {
      replacement = vocab.mask_id();
    } else if (rng.uniform() < 0.5) {
      replacement = original;
    } else {
      replacement = replacements.empty() ? original : replacements[rng.below(replacements.size())];
    }
    inst.tokens[pos] = replacement;
    inst.masked.emplace_back(pos, original);
  }
  std::sort(inst.masked.begin(), inst.masked.end());
}

// BERT's create_instances_from_document.
void instances_from_document(const std::vector<TokenizedDocument>& docs, std::size_t doc_index, const Vocab& vocab,
                             const PretrainingOptions& opts, Rng& rng, std::vector<Instance>& out) {
  const TokenizedDocument& doc = docs[doc_index];
  const int64_t max_tokens = opts.seq_len - 3;  // [CLS] A [SEP] B [SEP]
  int64_t target = max_tokens;
  if (rng.uniform() < opts.short_seq_prob) target = rng.between(2, max_tokens);

  std::vector<const std::vector<int32_t>*> chunk;
  int64_t chunk_len = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(doc.size()); ++i) {
    chunk.push_back(&doc[i]);
    chunk_len += static_cast<int64_t>(doc[i].size());
    if (i + 1 != static_cast<int64_t>(doc.size()) && chunk_len < target) continue;
    if (!chunk.empty()) {
      std::size_t a_end = 1;
      if (chunk.size() >= 2) a_end = static_cast<std::size_t>(rng.between(1, static_cast<int64_t>(chunk.size()) - 1));
      std::vector<int32_t> a, b;
      for (std::size_t j = 0; j < a_end; ++j) a.insert(a.end(), chunk[j]->begin(), chunk[j]->end());
      bool random_next = false;
      if (chunk.size() == 1 || rng.uniform() < opts.random_next_prob) {
        random_next = true;
        const int64_t target_b = target - static_cast<int64_t>(a.size());
        std::size_t other = doc_index;
        for (int attempt = 0; attempt < 10 && other == doc_index; ++attempt)
          other = static_cast<std::size_t>(rng.below(docs.size()));
        const TokenizedDocument& rdoc = docs[other];
        const std::size_t start = static_cast<std::size_t>(rng.below(rdoc.size()));
        for (std::size_t j = start; j < rdoc.size(); ++j) {
          b.insert(b.end(), rdoc[j].begin(), rdoc[j].end());
          if (static_cast<int64_t>(b.size()) >= target_b) break;
        }
        // The segments not used for A go back to the document for the next chunk.
        i -= static_cast<int64_t>(chunk.size() - a_end);
      } else {
        for (std::size_t j = a_end; j < chunk.size(); ++j) b.insert(b.end(), chunk[j]->begin(), chunk[j]->end());
      }
      truncate_pair(a, b, static_cast<std::size_t>(max_tokens), rng);
      if (!a.empty() && !b.empty()) {
        Instance inst;
        inst.tokens.reserve(a.size() + b.size() + 3);
        inst.tokens.push_back(vocab.cls_id());
        inst.tokens.insert(inst.tokens.end(), a.begin(), a.end());
        inst.tokens.push_back(vocab.sep_id());
        inst.tokens.insert(inst.tokens.end(), b.begin(), b.end());
        inst.tokens.push_back(vocab.sep_id());
        inst.len_a = static_cast<int32_t>(a.size());
        inst.random_next = random_next;
        mask_tokens(inst, vocab, opts, rng);
        out.push_back(std::move(inst));
      }
    }
    chunk.clear();
    chunk_len = 0;
  }
}

ShardData to_shard(const std::vector<Instance>& instances, std::size_t begin, std::size_t end,
                   const PretrainingOptions& opts) {
  const int64_t n = static_cast<int64_t>(end - begin), s = opts.seq_len, p = opts.max_predictions;
  ShardData d;
  d.input_ids = torch::zeros({n, s}, torch::kInt32);
  d.input_mask = torch::zeros({n, s}, torch::kInt32);
  d.segment_ids = torch::zeros({n, s}, torch::kInt32);
  d.masked_lm_positions = torch::zeros({n, p}, torch::kInt32);
  d.masked_lm_ids = torch::zeros({n, p}, torch::kInt32);
  d.next_sentence_labels = torch::zeros({n}, torch::kInt32);
  d.lengths = torch::zeros({n}, torch::kInt32);
  int32_t* ids = d.input_ids.data_ptr<int32_t>();
  int32_t* mask = d.input_mask.data_ptr<int32_t>();
  int32_t* seg = d.segment_ids.data_ptr<int32_t>();
  int32_t* pos = d.masked_lm_positions.data_ptr<int32_t>();
  int32_t* lab = d.masked_lm_ids.data_ptr<int32_t>();
  int32_t* nsp = d.next_sentence_labels.data_ptr<int32_t>();
  int32_t* len = d.lengths.data_ptr<int32_t>();
  for (int64_t r = 0; r < n; ++r) {
    const Instance& inst = instances[begin + r];
    const int64_t L = static_cast<int64_t>(inst.tokens.size());
    for (int64_t t = 0; t < L; ++t) {
      ids[r * s + t] = inst.tokens[t];
      mask[r * s + t] = 1;
      seg[r * s + t] = t >= inst.len_a + 2 ? 1 : 0;  // [CLS] A [SEP] are segment 0
    }
    for (std::size_t k = 0; k < inst.masked.size(); ++k) {
      pos[r * p + k] = inst.masked[k].first;
      lab[r * p + k] = inst.masked[k].second;
    }
    nsp[r] = inst.random_next ? 1 : 0;
    len[r] = static_cast<int32_t>(L);
  }
  return d;
}

// ---- the prepare pipeline ----

std::string join_ints(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string yaml_quote(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return q + "\"";
}

void write_text_file(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw DataError("cannot write " + tmp.string());
  }
  fs::rename(tmp, path);
}

std::string make_temp_dir_beside(const fs::path& out) {
  std::string templ = out.string() + ".tmp-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw DataError("cannot create the temp folder " + templ + " (is the parent writable?)");
  const mode_t mask = umask(0);  // mkdtemp makes 0700; a dataset folder gets the usual permissions
  umask(mask);
  chmod(buf.data(), 0777 & ~mask);
  return buf.data();
}

// The files `data prepare` writes into a dataset folder; --force replaces a folder holding only these.
bool is_dataset_file(const std::string& name) {
  if (name == "eval.hdf5" || name == "vocab.txt" || name == "meta.yaml") return true;
  return name.size() == 16 && name.rfind("train_", 0) == 0 && name.substr(11) == ".hdf5" &&
         std::all_of(name.begin() + 6, name.begin() + 11, [](char c) { return c >= '0' && c <= '9'; });
}

struct Split {
  std::vector<TokenizedDocument> train, eval;
  int64_t train_tokens = 0, eval_tokens = 0;
};

}  // namespace

void check_dataset_out(const std::string& out, bool force) {
  const fs::path p(out);
  std::error_code ec;
  const auto st = fs::symlink_status(p, ec);
  if (!fs::exists(st)) return;
  if (!fs::is_directory(st))
    throw DataError("--out " + out + " exists and is not a folder; bertsweep never replaces it (give a new folder)");
  if (fs::is_empty(p, ec)) return;
  if (!force)
    throw DataError("--out " + out +
                    " already exists and is not empty (use --force to replace a dataset "
                    "that `bertsweep data prepare` made)");
  // --force: only a folder that this command made, holding nothing else, is replaced.
  std::ifstream meta(p / "meta.yaml");
  std::string first, second;
  std::getline(meta, first);
  std::getline(meta, second);
  if (first.rfind("# bertsweep data prepare", 0) != 0 || second != "format: mlperf-bert-hdf5")
    throw DataError("--out " + out +
                    " is not a dataset made by `bertsweep data prepare` (no meta.yaml saying so); "
                    "--force replaces only such a folder, so give a new --out");
  for (const auto& e : fs::directory_iterator(p, ec))
    if (!is_dataset_file(e.path().filename().string()) || !e.is_regular_file(ec))
      throw DataError("--out " + out + " holds " + e.path().filename().string() +
                      ", which `bertsweep data prepare` did not write; --force replaces only a folder holding "
                      "nothing else (move that file out, or give a new --out)");
}

ShardData create_pretraining_instances(const std::vector<TokenizedDocument>& docs, const Vocab& vocab,
                                       const PretrainingOptions& opts, Rng& rng) {
  if (opts.seq_len < 5) throw std::invalid_argument("seq_len must be at least 5");
  if (opts.max_predictions < 1) throw std::invalid_argument("max_predictions must be at least 1");
  if (vocab.cls_id() < 0 || vocab.sep_id() < 0 || vocab.mask_id() < 0)
    throw std::invalid_argument("the vocab lacks [CLS], [SEP] or [MASK]");
  std::vector<TokenizedDocument> kept;
  for (const auto& d : docs) {
    TokenizedDocument nd;
    for (const auto& s : d)
      if (!s.empty()) nd.push_back(s);
    if (!nd.empty()) kept.push_back(std::move(nd));
  }
  std::vector<Instance> instances;
  for (int64_t dupe = 0; dupe < opts.dupe_factor; ++dupe)
    for (std::size_t i = 0; i < kept.size(); ++i) instances_from_document(kept, i, vocab, opts, rng, instances);
  rng.shuffle(instances);
  return to_shard(instances, 0, instances.size(), opts);
}

namespace {

using Say = std::function<void(const std::string&)>;

// Every eval_every-th document is held out (at least the last one).
std::vector<char> held_out_documents(std::size_t n, int64_t eval_every) {
  std::vector<char> is_eval(n, 0);
  bool any_eval = false;
  for (std::size_t i = 0; i < n; ++i)
    if ((static_cast<int64_t>(i) + 1) % eval_every == 0) {
      is_eval[i] = 1;
      any_eval = true;
    }
  if (!any_eval) is_eval.back() = 1;
  return is_eval;
}

// The given vocab, or WordPiece trained on the training documents only (the eval text stays unseen).
Vocab vocab_for(const PrepareOptions& opts, const std::vector<Document>& docs, const std::vector<char>& is_eval,
                const Say& say) {
  if (!opts.vocab_file.empty()) {
    Vocab vocab = Vocab::load(opts.vocab_file);
    say("vocab " + opts.vocab_file + ": " + std::to_string(vocab.size()) + " tokens");
    return vocab;
  }
  VocabTrainerOptions vo;
  vo.vocab_size = opts.vocab_size;
  VocabTrainer trainer(vo);
  for (std::size_t i = 0; i < docs.size(); ++i)
    if (!is_eval[i])
      for (const auto& s : docs[i].sentences) trainer.add_text(s);
  Vocab vocab = trainer.train();
  say("trained a WordPiece vocab of " + std::to_string(vocab.size()) + " tokens from " +
      std::to_string(trainer.distinct_words()) + " distinct words");
  return vocab;
}

Split tokenize_documents(const std::vector<Document>& docs, const std::vector<char>& is_eval, const Vocab& vocab) {
  Tokenizer tokenizer(vocab);
  Split split;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    TokenizedDocument td;
    int64_t n = 0;
    for (const auto& s : docs[i].sentences) {
      td.push_back(tokenizer.encode(s));
      n += static_cast<int64_t>(td.back().size());
    }
    (is_eval[i] ? split.eval : split.train).push_back(std::move(td));
    (is_eval[i] ? split.eval_tokens : split.train_tokens) += n;
  }
  return split;
}

// Refuse before building what would not fit: each instance holds its tokens, segments and mask (int32)
// plus its predictions, and is built in a vector before it is copied into tensors (about 3x that).
void check_instances_fit_in_memory(const PretrainingOptions& p, int64_t train_tokens) {
  const double instances = double(p.dupe_factor) * double(train_tokens) / double(std::max<int64_t>(1, p.seq_len - 3));
  const double bytes = 3.0 * instances * (3.0 * p.seq_len + 2.0 * p.max_predictions + 2) * 4;
  const double have = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (have > 0 && bytes > 0.7 * have) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "about %.3g instances needing ~%.1f GiB while this machine has %.1f GiB", instances,
                  bytes / 1073741824.0, have / 1073741824.0);
    throw std::invalid_argument("--dupe-factor " + std::to_string(p.dupe_factor) + " with " +
                                std::to_string(train_tokens) + " training tokens makes " + buf +
                                "; lower --dupe-factor or use --max-docs");
  }
}

// train_00000.hdf5, ... of shard_size instances each; returns their names.
std::vector<std::string> write_train_shards(const fs::path& dir, const ShardData& train, int64_t shard_size,
                                            const Say& say) {
  std::vector<std::string> names;
  const int64_t n = train.size();
  const int64_t shards = (n + shard_size - 1) / shard_size;
  for (int64_t k = 0; k < shards; ++k) {
    const int64_t b = k * shard_size, e = std::min(n, b + shard_size);
    char name[32];
    std::snprintf(name, sizeof name, "train_%05lld.hdf5", static_cast<long long>(k));
    write_shard((dir / name).string(), train.rows(b, e));
    names.push_back(name);
    say("wrote shard " + std::string(name) + " (" + std::to_string(e - b) + " instances)");
  }
  return names;
}

// meta.yaml: how the folder was made, its counts and length histograms (read by `data inspect` and `train`).
std::string meta_yaml(const PrepareOptions& opts, const PrepareSummary& sum, const Split& split, const ShardData& train,
                      const ShardData& eval, const std::vector<std::string>& shard_names) {
  const int64_t bin = std::max<int64_t>(1, opts.pretraining.seq_len / 8);
  auto masked_count = [](const ShardData& d) { return d.masked_lm_positions.ne(0).sum().item<int64_t>(); };
  std::ostringstream meta;
  meta << "# bertsweep data prepare: MLPerf BERT HDF5 layout\n"
       << "format: mlperf-bert-hdf5\n"
       << "corpus: " << yaml_quote(opts.corpus) << "\n"
       << "max_docs: " << opts.max_docs << "\n"
       << "documents: " << sum.documents << "\n"
       << "train_documents: " << sum.train_documents << "\n"
       << "eval_documents: " << sum.eval_documents << "\n"
       << "eval_every: " << opts.eval_every << "\n"
       << "vocab: " << yaml_quote(opts.vocab_file.empty() ? "trained" : opts.vocab_file) << "\n"
       << "vocab_size: " << sum.vocab_size << "\n"
       << "seed: " << opts.seed << "\n"
       << "seq_len: " << opts.pretraining.seq_len << "\n"
       << "max_predictions: " << opts.pretraining.max_predictions << "\n"
       << "dupe_factor: " << opts.pretraining.dupe_factor << "\n"
       << "short_seq_prob: " << opts.pretraining.short_seq_prob << "\n"
       << "masked_lm_prob: " << opts.pretraining.masked_lm_prob << "\n"
       << "train_tokens: " << split.train_tokens << "\n"
       << "eval_tokens: " << split.eval_tokens << "\n"
       << "train_instances: " << sum.train_instances << "\n"
       << "eval_instances: " << sum.eval_instances << "\n"
       << "train_masked_positions: " << masked_count(train) << "\n"
       << "train_random_next: " << train.next_sentence_labels.sum().item<int64_t>() << "\n"
       << "shard_size: " << opts.shard_size << "\n"
       << "shards: [";
  for (std::size_t k = 0; k < shard_names.size(); ++k) meta << (k ? ", " : "") << shard_names[k];
  meta << "]\n"
       << "length_histogram:\n"
       << "  bin_width: " << bin << "\n"
       << "  train: " << join_ints(length_histogram(train, bin)) << "\n"
       << "  eval: " << join_ints(length_histogram(eval, bin)) << "\n";
  return meta.str();
}

// Swap `tmp` into place as `out_path`: an old folder (with --force) is moved aside first and removed last.
void move_into_place(const fs::path& tmp, const fs::path& out_path, bool force) {
  std::error_code ec;
  fs::path old;
  check_dataset_out(out_path.string(), force);  // again: it may have changed while we worked
  if (fs::exists(fs::symlink_status(out_path, ec))) {
    old = make_temp_dir_beside(fs::path(out_path.string() + ".old"));
    fs::rename(out_path, old / "dataset");
  }
  fs::rename(tmp, out_path);
  if (!old.empty()) fs::remove_all(old, ec);
}

}  // namespace

PrepareSummary prepare_pretraining_data(const PrepareOptions& opts,
                                        const std::function<void(const std::string&)>& progress) {
  const Say say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  if (opts.out.empty()) throw std::invalid_argument("the output folder is not set");
  if (opts.eval_every < 2) throw std::invalid_argument("eval_every must be at least 2");
  if (opts.shard_size < 1) throw std::invalid_argument("shard_size must be at least 1");
  const fs::path out = fs::absolute(opts.out).lexically_normal();
  const fs::path out_path = out.has_filename() ? out : out.parent_path();
  check_dataset_out(out_path.string(), opts.force);

  // 1. Corpus, split by document.
  std::vector<Document> docs = load_corpus(opts.corpus, opts.max_docs);
  if (docs.size() < 2)
    throw DataError("corpus " + opts.corpus + " has " + std::to_string(docs.size()) +
                    " documents; at least 2 are needed (one for eval)");
  const std::vector<char> is_eval = held_out_documents(docs.size(), opts.eval_every);
  PrepareSummary sum;
  sum.documents = static_cast<int64_t>(docs.size());
  int64_t sentences = 0;
  for (const auto& d : docs) sentences += static_cast<int64_t>(d.sentences.size());
  say("read " + std::to_string(docs.size()) + " documents (" + std::to_string(sentences) + " sentences) from " +
      opts.corpus);

  // 2. Vocab; 3. tokens.
  const Vocab vocab = vocab_for(opts, docs, is_eval, say);
  sum.vocab_size = vocab.size();
  const Split split = tokenize_documents(docs, is_eval, vocab);
  docs.clear();
  sum.train_documents = static_cast<int64_t>(split.train.size());
  sum.eval_documents = static_cast<int64_t>(split.eval.size());
  say("tokenized: " + std::to_string(split.train_tokens) + " training tokens in " +
      std::to_string(sum.train_documents) + " documents, " + std::to_string(split.eval_tokens) + " eval tokens in " +
      std::to_string(sum.eval_documents) + " documents");
  check_instances_fit_in_memory(opts.pretraining, split.train_tokens);

  // 4. Instances: training with the dupe factor; eval once, with its own seed, masks fixed in the file.
  Rng train_rng(opts.seed);
  ShardData train = create_pretraining_instances(split.train, vocab, opts.pretraining, train_rng);
  PretrainingOptions eval_opts = opts.pretraining;
  eval_opts.dupe_factor = 1;
  Rng eval_rng(opts.seed ^ 0x9E3779B97F4A7C15ULL);
  ShardData eval = create_pretraining_instances(split.eval, vocab, eval_opts, eval_rng);
  sum.train_instances = train.size();
  sum.eval_instances = eval.size();
  if (sum.train_instances == 0 || sum.eval_instances == 0)
    throw DataError("corpus " + opts.corpus + " gives no " + (sum.train_instances == 0 ? "training" : "eval") +
                    " instances (too little text)");
  say("made " + std::to_string(sum.train_instances) + " training instances and " + std::to_string(sum.eval_instances) +
      " eval instances");

  // 5. Files, in a temp folder renamed into place at the end.
  std::error_code ec;
  fs::create_directories(out_path.parent_path(), ec);
  const fs::path tmp = make_temp_dir_beside(out_path);
  try {
    const std::vector<std::string> shards = write_train_shards(tmp, train, opts.shard_size, say);
    write_shard((tmp / "eval.hdf5").string(), eval);
    vocab.save((tmp / "vocab.txt").string());
    write_text_file(tmp / "meta.yaml", meta_yaml(opts, sum, split, train, eval, shards));
    move_into_place(tmp, out_path, opts.force);
    for (const auto& n : shards) sum.files.push_back((out_path / n).string());
    for (const char* n : {"eval.hdf5", "vocab.txt", "meta.yaml"}) sum.files.push_back((out_path / n).string());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  say("dataset ready in " + out_path.string());
  return sum;
}

}  // namespace bs
