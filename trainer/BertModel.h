// BERT for pretraining (MLM + NSP) on LibTorch: embeddings, post-LayerNorm encoder layers, the two heads,
// the pretraining loss and the FLOP count the efficiency benchmark divides by.
//
// Activations run flat as [rows, H] so every projection is one GEMM; attention reshapes views of the fused QKV
// projection into [B, heads, L, head_dim] and uses batched matmul. Unpadded (model.unpad), the rows are the T
// real tokens of the micro-batch, gathered once, and attention runs per sequence in groups of about equal
// length (trainer/TokenLayout.h: the QKV rows scattered into the groups' slots, the context gathered back).
// The MLM head only sees the M masked rows.
// Everything follows the dtype/device of the parameters and inputs (float32, float64, bf16, CUDA).
#pragma once
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>

#include "common/TrainConfig.h"
#include "dataset/Batch.h"
#include "trainer/TokenLayout.h"

namespace bs {

struct BertOutputs {
  torch::Tensor mlm_logits;  // [M, vocab]: one row per entry of inputs.mlm_positions
  torch::Tensor nsp_logits;  // [N, 2]: one row per entry of inputs.nsp_positions
};

// Whether model.kernels selects the fused CPU kernels (`auto` = fused wherever they are built, see
// BertModel.cpp). Throws invalid_argument for `fused` on a build without them.
bool use_fused_kernels(const ModelConfig& cfg);

// Whether model.unpad computes only the real tokens of inputs on `device` (auto: on the CPU).
bool use_unpadded(const ModelConfig& cfg, const torch::Device& device);

// Word + position + segment embeddings, summed, LayerNorm, dropout. Returns [B*L, H], or [R, H] of the
// positions `real_rows` (TokenLayout::real_rows) when it is defined.
class BertEmbeddingsImpl : public torch::nn::Module {
 public:
  explicit BertEmbeddingsImpl(const ModelConfig& cfg);
  torch::Tensor forward(const BertInputs& in, const torch::Tensor& real_rows = {});

  torch::nn::Embedding word_embeddings{nullptr};  // also the (tied) MLM decoder weight
  torch::nn::Embedding position_embeddings{nullptr};
  torch::nn::Embedding token_type_embeddings{nullptr};
  torch::nn::LayerNorm LayerNorm{nullptr};
  double dropout = 0;
  bool fused = false;  // kernels/FusedOps.h on CPU tensors
};
TORCH_MODULE(BertEmbeddings);

// Multi-head self-attention with a fused QKV projection, output projection, residual, post-LayerNorm.
class BertAttentionImpl : public torch::nn::Module {
 public:
  explicit BertAttentionImpl(const ModelConfig& cfg);
  // x: [B*L, H], or [R, H] of the positions layout.real_rows when it is defined.
  torch::Tensor forward(const torch::Tensor& x, const TokenLayout& layout);
  torch::Tensor attend(const torch::Tensor& qkv_rows, const torch::Tensor& bias, int64_t sequences, int64_t length);

  torch::nn::Linear qkv{nullptr};     // H -> 3H: [query; key; value]
  torch::nn::Linear output{nullptr};  // H -> H
  torch::nn::LayerNorm LayerNorm{nullptr};
  int64_t heads = 0;
  double dropout = 0;
  bool fused = false;  // kernels/FusedOps.h on CPU tensors
};
TORCH_MODULE(BertAttention);

// GELU (erf) feed-forward, residual, post-LayerNorm.
class BertFeedForwardImpl : public torch::nn::Module {
 public:
  explicit BertFeedForwardImpl(const ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear intermediate{nullptr};  // H -> I
  torch::nn::Linear output{nullptr};        // I -> H
  torch::nn::LayerNorm LayerNorm{nullptr};
  double dropout = 0;
  bool fused = false;  // kernels/FusedOps.h on CPU tensors
};
TORCH_MODULE(BertFeedForward);

class BertLayerImpl : public torch::nn::Module {
 public:
  explicit BertLayerImpl(const ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x, const TokenLayout& layout);

  BertAttention attention{nullptr};
  BertFeedForward ffn{nullptr};
};
TORCH_MODULE(BertLayer);

// MLM head on the gathered masked rows: dense + GELU + LayerNorm, then the tied decoder with its own bias.
class BertMlmHeadImpl : public torch::nn::Module {
 public:
  explicit BertMlmHeadImpl(const ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& masked_hidden, const torch::Tensor& word_embeddings);

  torch::nn::Linear transform{nullptr};
  torch::nn::LayerNorm LayerNorm{nullptr};
  torch::Tensor decoder_bias;  // [vocab]
  bool fused = false;
};
TORCH_MODULE(BertMlmHead);

// NSP head on each sequence's [CLS] row: pooler dense + tanh, then a 2-way classifier.
class BertNspHeadImpl : public torch::nn::Module {
 public:
  explicit BertNspHeadImpl(const ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& cls_hidden);

  torch::nn::Linear pooler{nullptr};
  torch::nn::Linear classifier{nullptr};
};
TORCH_MODULE(BertNspHead);

// Parameter names: embeddings.*, encoder.<i>.attention.*, encoder.<i>.ffn.*, mlm.*, nsp.* (registered in
// forward order; biases contain "bias", LayerNorm parameters "LayerNorm").
class BertForPretrainingImpl : public torch::nn::Module {
 public:
  explicit BertForPretrainingImpl(const ModelConfig& cfg);
  BertOutputs forward(const BertInputs& in);
  const ModelConfig& config() const { return cfg_; }
  int64_t num_parameters() const;
  bool fused_kernels() const;  // model.kernels resolves to the fused path (kernels/FusedOps.h)

  BertEmbeddings embeddings{nullptr};
  torch::nn::ModuleList encoder{nullptr};
  BertMlmHead mlm{nullptr};
  BertNspHead nsp{nullptr};

 private:
  ModelConfig cfg_;
};
TORCH_MODULE(BertForPretraining);

// MLM cross-entropy over masked positions (mean) + NSP cross-entropy (mean); returns {total, mlm, nsp}.
// Reduced-precision logits are upcast to float32 for the loss; `fused` (CPU): kernels::cross_entropy, float
// arithmetic on the logits as they are, no float copy.
struct PretrainingLoss {
  torch::Tensor total, mlm, nsp;
};
PretrainingLoss pretraining_loss(const BertOutputs& out, const torch::Tensor& mlm_labels,
                                 const torch::Tensor& nsp_labels, bool fused = false);

// Training FLOPs of one step on a micro-batch of `rows` rows of `row_len` tokens with `masked_tokens` MLM
// predictions (formula in BertModel.cpp).
double training_flops(const ModelConfig& cfg, int64_t rows, int64_t row_len, int64_t masked_tokens);

}  // namespace bs
