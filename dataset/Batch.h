// Micro-batches: which samples go in which row (several per row when packed), and their collation into
// the flat tensors the model reads. Rows are trimmed to the longest row of the micro-batch.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "dataset/ShardIO.h"

namespace bs {

// Sample indices per row; a row holds one sample, or several when the packing sampler fills it.
struct MicroBatch {
  std::vector<std::vector<int64_t>> rows;
  int64_t samples() const;
};

struct BertInputs {
  torch::Tensor input_ids;      // int64 [B, L]
  torch::Tensor segment_ids;    // int64 [B, L]
  torch::Tensor position_ids;   // int64 [B, L]: restart at 0 for every packed sequence
  torch::Tensor attention_ids;  // int64 [B, L]: sequence number within the row (1, 2, ...); 0 = padding.
                                // A token attends only to tokens with the same nonzero id.
  bool packed = false;          // some row holds more than one sequence (needs the block attention mask)
  torch::Tensor mlm_positions;  // int64 [M]: flat indices into B*L of the masked tokens
  torch::Tensor nsp_positions;  // int64 [N]: flat indices into B*L of each sequence's [CLS]
};

struct BertBatch {
  BertInputs inputs;
  torch::Tensor mlm_labels;     // int64 [M]
  torch::Tensor nsp_labels;     // int64 [N]
  int64_t samples = 0;          // sequences in the micro-batch
  int64_t real_tokens = 0;      // non-padding tokens
  int64_t computed_tokens = 0;  // B * L after trimming
};

// `row_len`: length of every row; 0 trims to the longest row of this micro-batch.
BertBatch collate(const ShardData& data, const MicroBatch& mb, int64_t row_len = 0);

// The batch on `device`: on a GPU through pinned host memory with non-blocking copies, so the host goes on
// collating the next micro-batch while the copy and the compute of this one run. On the CPU: itself.
BertBatch to_device(const BertBatch& batch, torch::Device device);

}  // namespace bs
