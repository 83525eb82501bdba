// Pretraining shards in MLPerf BERT's HDF5 layout, and the dataset folder that `data prepare` writes.
// Datasets per shard: input_ids, input_mask, segment_ids [N, seq_len]; masked_lm_positions,
// masked_lm_ids [N, max_pred] (0-padded); next_sentence_labels [N]. Any integer dtype is accepted on read.
#pragma once
#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "common/Errors.h"
#include "common/TrainConfig.h"

namespace bs {

struct ShardData {
  torch::Tensor input_ids;             // int32 [N, S]
  torch::Tensor input_mask;            // int32 [N, S]
  torch::Tensor segment_ids;           // int32 [N, S]
  torch::Tensor masked_lm_positions;   // int32 [N, P]
  torch::Tensor masked_lm_ids;         // int32 [N, P]
  torch::Tensor next_sentence_labels;  // int32 [N]
  torch::Tensor lengths;               // int32 [N]: real tokens per sample (sum of input_mask)
  int64_t size() const { return input_ids.defined() ? input_ids.size(0) : 0; }
  int64_t seq_len() const { return input_ids.size(1); }
  int64_t max_predictions() const { return masked_lm_positions.size(1); }
  // Samples [begin, end) of the six stored fields, as views (lengths left undefined).
  ShardData rows(int64_t begin, int64_t end) const;
};

// Reads one shard; DataError naming the file for a missing file, a missing dataset, wrong shapes or a truncated file.
ShardData read_shard(const std::string& path);
// Writes to `path + ".tmp"` and renames, so a crash never leaves a half-written shard under the real name.
void write_shard(const std::string& path, const ShardData& data);
// Concatenates shards (same seq_len and max_predictions required).
ShardData concat_shards(const std::vector<ShardData>& shards);

// A prepared dataset folder: train shards (*.hdf5 other than the eval file), an eval file, vocab.txt.
struct Dataset {
  ShardData train;
  ShardData eval;
  int64_t vocab_size = 0;  // lines of vocab.txt when present, else 1 + max token id seen
  std::string dir;
  std::vector<std::string> train_files;
};
// Every value of a shard in range: ids in [0, vocab_size) (vocab_size 0: only non-negative), segments,
// next-sentence labels and mask in {0, 1}, masked positions inside the sequence, no sample without a real
// token. DataError naming the file, the dataset, the sample and the value.
// Then check_shard_structure.
void check_shard_values(const ShardData& data, const std::string& file, int64_t vocab_size);

// The structure of BERT pretraining data (what `data prepare` and MLPerf's create_pretraining_data write), so
// that data a model cannot learn from is refused instead of training to accuracy 0: input_mask a prefix of
// ones with at least kMinRealTokens; real tokens never [PAD] (id 0); segment_ids 0 then 1 within the real
// tokens, [CLS] in segment 0; the masked tokens first in masked_lm_ids, their positions after [CLS], inside
// the real tokens and strictly increasing, unused positions 0; at least one masked token in the shard.
// Vectorised over every row (a small share of start-up: see BENCHMARKS.md). DataError naming the file,
// the dataset, the first sample and the rule.
constexpr int64_t kMinRealTokens = 3;
void check_shard_structure(const ShardData& data, const std::string& file);

// Loads data.dir / data.eval_file of a training config and validates it before training: seq_len against
// data.seq_len, the shards listed in meta.yaml present and the counts equal, the vocab's special tokens,
// and check_shard_values on every shard. DataError naming the file otherwise.
Dataset load_dataset(const DataConfig& cfg);

// Sequence-length histogram (bins of `bin_width` tokens) of a shard, for `data inspect` and the sampler report.
std::vector<int64_t> length_histogram(const ShardData& data, int64_t bin_width);

}  // namespace bs
