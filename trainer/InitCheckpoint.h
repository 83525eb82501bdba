// `model.init_checkpoint`: the weights a run starts from, read from a bertsweep checkpoint-<step>.pt (its
// "param.<name>" entries only: no optimizer state, step or RNG) or from a PyTorch state dict written by
// `torch.save(model.state_dict(), f)` with Hugging Face / NVIDIA BERT names (`bert.embeddings...`,
// `bert.encoder.layer.N.attention.self.query.weight`, `cls.predictions...`, `cls.seq_relationship...`);
// query/key/value are fused into this model's qkv projection, the decoder weight is the tied word embedding.
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>

#include "trainer/BertModel.h"

namespace bs {

// The tensors of `path` under this model's parameter names (CPU, as stored). DataError (exit 3) naming the
// file for an unreadable file or one that is neither format.
std::map<std::string, torch::Tensor> read_init_checkpoint(const std::string& path);

// Copies the weights of `path` into `model` (any device/dtype: converted). DataError naming the file and the
// first parameter of the model, in its own order, that the file lacks or holds with another shape (expected
// vs found); nothing is changed then.
void load_init_checkpoint(const std::string& path, BertForPretraining& model);

}  // namespace bs
