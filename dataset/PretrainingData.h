// Pretraining instances as in BERT's create_pretraining_data.py (sentence-pair chunks of a target length,
// 50% random next sentence from another document, 15% masking with 80/10/10) and the whole
// `data prepare` pipeline: corpus -> vocab -> tokens -> instances -> MLPerf-layout shards.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dataset/ShardIO.h"
#include "dataset/Tokenizer.h"

namespace bs {

// Reproducible random numbers on any machine: only raw std::mt19937_64 output (whose sequence the standard
// fixes) is used; std::uniform_*_distribution differs between standard libraries.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  uint64_t next() { return engine_(); }
  uint64_t below(uint64_t n);               // uniform in [0, n), n > 0 (rejection, no modulo bias)
  int64_t between(int64_t lo, int64_t hi);  // uniform in [lo, hi], like Python's randint
  double uniform();                         // uniform in [0, 1) with 53 random bits
  template <class T>
  void shuffle(std::vector<T>& v) {  // Fisher-Yates from the back, as Python's random.shuffle
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  std::mt19937_64 engine_;
};

struct PretrainingOptions {
  int64_t seq_len = 128;
  int64_t max_predictions = 20;  // masked positions per sequence (MLPerf uses 76 at 512)
  int64_t dupe_factor = 5;       // passes over the documents, each with different chunks and masks
  double short_seq_prob = 0.1;   // chance a document uses a random shorter target length
  double masked_lm_prob = 0.15;
  double random_next_prob = 0.5;
};

using TokenizedDocument = std::vector<std::vector<int32_t>>;  // sentences of token ids

// All instances of `dupe_factor` passes over `docs`, shuffled; random next sentences come from `docs` only.
ShardData create_pretraining_instances(const std::vector<TokenizedDocument>& docs, const Vocab& vocab,
                                       const PretrainingOptions& opts, Rng& rng);

struct PrepareOptions {
  std::string corpus = "brown";  // "brown" or a folder of plain-text files
  std::string vocab_file;        // empty: train a vocab of vocab_size on the training documents
  int64_t vocab_size = 8192;
  std::string out;             // the dataset folder
  int64_t max_docs = 0;        // 0: all documents
  int64_t eval_every = 20;     // every k-th document is held out for eval.hdf5
  int64_t shard_size = 50000;  // instances per train_NNNNN.hdf5
  uint64_t seed = 12345;
  bool force = false;  // replace an existing --out
  PretrainingOptions pretraining;
};

struct PrepareSummary {
  int64_t documents = 0, train_documents = 0, eval_documents = 0;
  int64_t train_instances = 0, eval_instances = 0;
  int64_t vocab_size = 0;
  std::vector<std::string> files;  // final paths of everything written
};

// Refuses (DataError naming --out) an output that exists and is not an empty folder, unless `force` and it
// is a dataset that `data prepare` made (meta.yaml says so) holding only its files: nothing else is replaced.
void check_dataset_out(const std::string& out, bool force);

// Builds opts.out in a sibling temp folder (out.tmp-XXXXXX) and renames it into place at the end, so a
// failure never leaves a half-written dataset under the real name. `progress` gets one line per stage.
PrepareSummary prepare_pretraining_data(const PrepareOptions& opts,
                                        const std::function<void(const std::string&)>& progress = {});

}  // namespace bs
