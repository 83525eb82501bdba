#include "trainer/BertModel.h"

#include <torch/version.h>

#include "common/Choices.h"
#include "kernels/FusedOps.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace bs {
namespace {

constexpr double kLayerNormEps = 1e-12;
constexpr double kInitStd = 0.02;  // BERT's initializer_range

// BERT's initialisation: normal(0, 0.02) weights, zero biases.
torch::nn::Linear make_linear(int64_t in, int64_t out) {
  torch::nn::Linear l(torch::nn::LinearOptions(in, out).bias(true));
  torch::NoGradGuard no_grad;
  l->weight.normal_(0.0, kInitStd);
  l->bias.zero_();
  return l;
}

torch::nn::Embedding make_embedding(int64_t count, int64_t dim) {
  torch::nn::Embedding e(torch::nn::EmbeddingOptions(count, dim));
  torch::NoGradGuard no_grad;
  e->weight.normal_(0.0, kInitStd);
  return e;
}

// LibTorch's LayerNorm already starts at weight 1, bias 0.
torch::nn::LayerNorm make_layer_norm(int64_t dim) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(kLayerNormEps).elementwise_affine(true));
}

bool reduced(const torch::Tensor& x) { return x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kHalf; }

// LayerNorm whose statistics are computed in fp32 for bf16/fp16 activations (as production mixed precision
// does: a bf16 variance loses the small differences post-LN BERT depends on).
torch::Tensor layer_norm(torch::nn::LayerNorm& ln, const torch::Tensor& x) {
  if (!reduced(x)) return ln->forward(x);
  return torch::layer_norm(x.to(torch::kFloat), {x.size(-1)}, ln->weight.to(torch::kFloat), ln->bias.to(torch::kFloat),
                           kLayerNormEps)
      .to(x.scalar_type());
}

torch::Tensor apply_dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p <= 0) return x;
  return torch::dropout(x, p, /*train=*/true);
}

void check_config(const ModelConfig& cfg) {
  auto fail = [](const std::string& key, const std::string& what) {
    throw std::invalid_argument("BertForPretraining: model." + key + " " + what +
                                " (fix the `model:` section of the training config)");
  };
  if (cfg.vocab_size <= 0) fail("vocab_size", "must be > 0 here; set it from the dataset's vocab.txt first");
  if (cfg.hidden <= 0) fail("hidden", "must be > 0");
  if (cfg.layers <= 0) fail("layers", "must be > 0");
  if (cfg.heads <= 0 || cfg.hidden % cfg.heads != 0) fail("heads", "must be > 0 and divide model.hidden");
  if (cfg.intermediate <= 0) fail("intermediate", "must be > 0");
  if (cfg.max_position <= 0) fail("max_position", "must be > 0");
  if (cfg.type_vocab_size <= 0) fail("type_vocab_size", "must be > 0");
  if (cfg.dropout < 0 || cfg.dropout >= 1) fail("dropout", "must be in [0, 1)");
}

void check_inputs(const BertInputs& in) {
  auto need = [](const torch::Tensor& t, const char* name, int64_t dim) {
    if (!t.defined() || t.dim() != dim)
      throw std::invalid_argument(std::string("BertForPretraining: BertInputs.") + name + " must be a " +
                                  std::to_string(dim) + "-d int64 tensor (see dataset/Batch.h)");
  };
  need(in.input_ids, "input_ids", 2);
  need(in.segment_ids, "segment_ids", 2);
  need(in.position_ids, "position_ids", 2);
  need(in.attention_ids, "attention_ids", 2);
  need(in.mlm_positions, "mlm_positions", 1);
  need(in.nsp_positions, "nsp_positions", 1);
  if (in.segment_ids.sizes() != in.input_ids.sizes() || in.position_ids.sizes() != in.input_ids.sizes() ||
      in.attention_ids.sizes() != in.input_ids.sizes())
    throw std::invalid_argument(
        "BertForPretraining: input_ids, segment_ids, position_ids and attention_ids must all be [B, L]");
}

}  // namespace

// `auto` is the fused path wherever it is built (x86-64): measured faster end to end in bf16 and fp32
// (BENCHMARKS.md section 10); `reference` stays as the numerical reference. On a GPU both run LibTorch's ops.
bool use_fused_kernels(const ModelConfig& cfg) {
  const auto kind = parse_choice<KernelsKind>(cfg.kernels);
  if (kind == KernelsKind::kReference) return false;
  if (kernels::fused_available()) return true;
  if (kind == KernelsKind::kAuto) return false;
  throw std::invalid_argument(
      "BertForPretraining: model.kernels: fused is not built for this CPU (x86-64 only); use auto or reference");
}

bool use_unpadded(const ModelConfig& cfg, const torch::Device& device) {
  switch (parse_choice<UnpadKind>(cfg.unpad)) {
    case UnpadKind::kOn: return true;
    case UnpadKind::kOff: return false;
    case UnpadKind::kAuto: break;
  }
  return device.is_cpu();
}

// ---------------------------------------------------------------------------------------------------------
BertEmbeddingsImpl::BertEmbeddingsImpl(const ModelConfig& cfg) : dropout(cfg.dropout), fused(use_fused_kernels(cfg)) {
  word_embeddings = register_module("word_embeddings", make_embedding(cfg.vocab_size, cfg.hidden));
  position_embeddings = register_module("position_embeddings", make_embedding(cfg.max_position, cfg.hidden));
  token_type_embeddings = register_module("token_type_embeddings", make_embedding(cfg.type_vocab_size, cfg.hidden));
  LayerNorm = register_module("LayerNorm", make_layer_norm(cfg.hidden));
}

torch::Tensor BertEmbeddingsImpl::forward(const BertInputs& in, const torch::Tensor& real_rows) {
  auto ids = [&](const torch::Tensor& t) {
    auto flat = t.reshape({-1});
    return real_rows.defined() ? flat.index_select(0, real_rows) : flat;
  };
  auto x = word_embeddings->forward(ids(in.input_ids));
  x = x + position_embeddings->forward(ids(in.position_ids));
  x.add_(token_type_embeddings->forward(ids(in.segment_ids)));
  if (fused && x.is_cpu()) {
    auto y =
        kernels::bias_dropout_add_layer_norm(x, {}, {}, LayerNorm->weight, LayerNorm->bias, 0, false, kLayerNormEps);
    return kernels::dropout(y, dropout, is_training());
  }
  return apply_dropout(layer_norm(LayerNorm, x), dropout, is_training());
}

// dropout(softmax(scores + bias)) of [B,h,L,L] scores, which it may overwrite; the softmax in fp32.
static torch::Tensor attention_probs(torch::Tensor scores, const torch::Tensor& bias, double p, bool fuse, int64_t rows,
                                     int64_t row_len) {
  if (fuse && bias.size(2) == 1)  // padding mask [B,1,1,L]: mask, softmax and dropout in one pass
    return kernels::softmax_dropout(scores, bias.view({rows, row_len}), p, p > 0);
  scores.add_(bias);  // broadcast [B,1,1,L] or [B,1,L,L]
  torch::Tensor probs;
  if (reduced(scores)) {
    probs = torch::softmax(scores, -1, torch::kFloat).to(scores.scalar_type());  // fp32 softmax
  } else if (torch::GradMode::is_enabled()) {
    probs = torch::softmax(scores, -1);  // autograd keeps its output; no in-place variant
  } else {
    probs = at::softmax_out(scores, scores, -1);  // eval: in place, the scores are not needed again
  }
  return fuse ? kernels::dropout(probs, p, p > 0) : apply_dropout(probs, p, true);
}

// gelu(linear(x)) on the fused path. In bf16 LibTorch's GELU after the biased GEMM (oneDNN's JIT eltwise)
// measured faster end to end than kernels::bias_gelu after the bias-free GEMM (bert-mini batch 64 on Zen 5:
// 12,870 vs 11,810 tokens/s), in fp32 the fused kernel is (5,230 vs 4,610): each precision takes its faster one.
static torch::Tensor bias_gelu(torch::nn::Linear linear, const torch::Tensor& x) {
  if (reduced(x)) return torch::gelu(linear->forward(x));
  return kernels::bias_gelu(torch::linear(x, linear->weight), linear->bias);
}

// ---------------------------------------------------------------------------------------------------------
BertAttentionImpl::BertAttentionImpl(const ModelConfig& cfg)
    : heads(cfg.heads), dropout(cfg.dropout), fused(use_fused_kernels(cfg)) {
  qkv = register_module("qkv", make_linear(cfg.hidden, 3 * cfg.hidden));
  output = register_module("output", make_linear(cfg.hidden, cfg.hidden));
  LayerNorm = register_module("LayerNorm", make_layer_norm(cfg.hidden));
}

// Attention of `sequences` rows of `length` tokens: qkv_rows [sequences*length, 3H], bias [sequences,1,1,length]
// (key padding) or [sequences,1,length,length] (packed, block diagonal). Returns the context, [sequences*length, H].
torch::Tensor BertAttentionImpl::attend(const torch::Tensor& qkv_rows, const torch::Tensor& bias, int64_t sequences,
                                        int64_t length) {
  const int64_t H = qkv_rows.size(1) / 3, d = H / heads;
  // [n*L, 3H] -> [3, n, heads, L, d]: views only, no per-head loop.
  auto qkv_all = qkv_rows.view({sequences, length, 3, heads, d}).permute({2, 0, 3, 1, 4});
  auto q = qkv_all[0], k = qkv_all[1], v = qkv_all[2];
  const double attn_p = is_training() ? dropout : 0.0;
  const bool fuse = fused && qkv_rows.is_cpu();
  torch::Tensor context;
#if TORCH_VERSION_MAJOR >= 2
  // PyTorch 2.x: the fused kernel (flash / memory-efficient on CUDA, math elsewhere); same 1/sqrt(d) scale.
  // In bf16/fp16 the explicit path below keeps the softmax in fp32 whatever kernel would be picked.
  if (!reduced(q) && !fuse) context = at::scaled_dot_product_attention(q, k, v, bias, attn_p, /*is_causal=*/false);
#endif
  if (!context.defined()) {
    // Scale q ([n,h,L,d]) rather than the scores ([n,h,L,L]): fewer elements when L > d.
    auto scores = torch::matmul(q * (1.0 / std::sqrt(static_cast<double>(d))), k.transpose(-2, -1));
    const auto probs = attention_probs(scores, bias, attn_p, fuse, sequences, length);
    context = torch::matmul(probs, v);  // [n,h,L,d]
  }
  return context.permute({0, 2, 1, 3}).reshape({sequences * length, H});
}

torch::Tensor BertAttentionImpl::forward(const torch::Tensor& x, const TokenLayout& layout) {
  const int64_t H = x.size(1);
  const bool fuse = fused && x.is_cpu();
  auto qkv_rows = qkv->forward(x);
  torch::Tensor merged;
  if (!layout.unpadded()) {
    merged = attend(qkv_rows, layout.bias, layout.rows, layout.row_len);
  } else {
    // The T real rows into their groups' slots. Empty slots get zero rows: the bias masks them as keys and
    // their query outputs are never gathered.
    const int64_t T = layout.real_tokens;
    auto slotted = torch::zeros({layout.slots, 3 * H}, qkv_rows.options())
                       .index_copy_(0, layout.slot_of_row.narrow(0, 0, T), qkv_rows.narrow(0, 0, T));
    std::vector<torch::Tensor> contexts;
    for (const auto& g : layout.groups) {
      const int64_t n = g.sequences * g.length;
      contexts.push_back(attend(slotted.narrow(0, g.first_slot, n),
                                layout.bias.narrow(0, g.first_slot, n).view({g.sequences, 1, 1, g.length}), g.sequences,
                                g.length));
    }
    merged = (contexts.size() == 1 ? contexts[0] : torch::cat(contexts)).index_select(0, layout.slot_of_row);
  }
  if (fuse)  // the projection without its bias; bias, dropout, residual and LayerNorm in one pass
    return kernels::bias_dropout_add_layer_norm(torch::linear(merged, output->weight), output->bias, x,
                                                LayerNorm->weight, LayerNorm->bias, dropout, is_training(),
                                                kLayerNormEps);
  auto out = apply_dropout(output->forward(merged), dropout, is_training());
  return layer_norm(LayerNorm, out.add_(x));
}

// ---------------------------------------------------------------------------------------------------------
BertFeedForwardImpl::BertFeedForwardImpl(const ModelConfig& cfg) : dropout(cfg.dropout), fused(use_fused_kernels(cfg)) {
  intermediate = register_module("intermediate", make_linear(cfg.hidden, cfg.intermediate));
  output = register_module("output", make_linear(cfg.intermediate, cfg.hidden));
  LayerNorm = register_module("LayerNorm", make_layer_norm(cfg.hidden));
}

torch::Tensor BertFeedForwardImpl::forward(const torch::Tensor& x) {
  if (fused && x.is_cpu()) {
    auto h = bias_gelu(intermediate, x);
    return kernels::bias_dropout_add_layer_norm(torch::linear(h, output->weight), output->bias, x, LayerNorm->weight,
                                                LayerNorm->bias, dropout, is_training(), kLayerNormEps);
  }
  auto h = torch::gelu(intermediate->forward(x));  // erf form (the default)
  auto out = apply_dropout(output->forward(h), dropout, is_training());
  return layer_norm(LayerNorm, out.add_(x));
}

// ---------------------------------------------------------------------------------------------------------
BertLayerImpl::BertLayerImpl(const ModelConfig& cfg) {
  attention = register_module("attention", BertAttention(cfg));
  ffn = register_module("ffn", BertFeedForward(cfg));
}

torch::Tensor BertLayerImpl::forward(const torch::Tensor& x, const TokenLayout& layout) {
  return ffn->forward(attention->forward(x, layout));
}

// ---------------------------------------------------------------------------------------------------------
BertMlmHeadImpl::BertMlmHeadImpl(const ModelConfig& cfg) : fused(use_fused_kernels(cfg)) {
  transform = register_module("transform", make_linear(cfg.hidden, cfg.hidden));
  LayerNorm = register_module("LayerNorm", make_layer_norm(cfg.hidden));
  decoder_bias = register_parameter("decoder_bias", torch::zeros({cfg.vocab_size}));
}

torch::Tensor BertMlmHeadImpl::forward(const torch::Tensor& masked_hidden, const torch::Tensor& word_embeddings) {
  torch::Tensor h;
  if (fused && masked_hidden.is_cpu())
    h = kernels::bias_dropout_add_layer_norm(bias_gelu(transform, masked_hidden), {}, {}, LayerNorm->weight,
                                             LayerNorm->bias, 0, false, kLayerNormEps);
  else
    h = layer_norm(LayerNorm, torch::gelu(transform->forward(masked_hidden)));
  return torch::linear(h, word_embeddings, decoder_bias);  // [M, vocab]
}

// ---------------------------------------------------------------------------------------------------------
BertNspHeadImpl::BertNspHeadImpl(const ModelConfig& cfg) {
  pooler = register_module("pooler", make_linear(cfg.hidden, cfg.hidden));
  classifier = register_module("classifier", make_linear(cfg.hidden, 2));
}

torch::Tensor BertNspHeadImpl::forward(const torch::Tensor& cls_hidden) {
  return classifier->forward(torch::tanh(pooler->forward(cls_hidden)));
}

// ---------------------------------------------------------------------------------------------------------
BertForPretrainingImpl::BertForPretrainingImpl(const ModelConfig& cfg) : cfg_(cfg) {
  check_config(cfg);
  embeddings = register_module("embeddings", BertEmbeddings(cfg));
  encoder = register_module("encoder", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.layers; ++i) encoder->push_back(BertLayer(cfg));
  mlm = register_module("mlm", BertMlmHead(cfg));
  nsp = register_module("nsp", BertNspHead(cfg));
}

BertOutputs BertForPretrainingImpl::forward(const BertInputs& in) {
  check_inputs(in);
  const int64_t row_len = in.input_ids.size(1);
  if (row_len > cfg_.max_position)
    throw std::invalid_argument("BertForPretraining: rows of " + std::to_string(row_len) +
                                " tokens exceed model.max_position " + std::to_string(cfg_.max_position));
  const auto layout =
      make_token_layout(in, use_unpadded(cfg_, in.input_ids.device()), embeddings->word_embeddings->weight.options());
  // The heads' rows among the activations: flat positions, or (unpadded) their rank among the real tokens.
  torch::Tensor mlm_rows = in.mlm_positions, nsp_rows = in.nsp_positions;
  if (layout.unpadded()) {
    const auto row_of = in.attention_ids.reshape({-1}).ne(0).cumsum(0).sub_(1);  // masked and [CLS]: real tokens
    mlm_rows = row_of.index_select(0, in.mlm_positions);
    nsp_rows = row_of.index_select(0, in.nsp_positions);
  }
  auto hidden = embeddings->forward(in, layout.real_rows);  // [activation rows, H]
  for (const auto& layer : *encoder) hidden = layer->as<BertLayerImpl>()->forward(hidden, layout);

  BertOutputs out;
  // Gather first: the head transform and the vocab projection run on M rows, not B*L.
  out.mlm_logits = mlm->forward(hidden.index_select(0, mlm_rows), embeddings->word_embeddings->weight);
  out.nsp_logits = nsp->forward(hidden.index_select(0, nsp_rows));
  return out;
}

bool BertForPretrainingImpl::fused_kernels() const { return use_fused_kernels(cfg_); }

int64_t BertForPretrainingImpl::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

// ---------------------------------------------------------------------------------------------------------
PretrainingLoss pretraining_loss(const BertOutputs& out, const torch::Tensor& mlm_labels,
                                 const torch::Tensor& nsp_labels, bool fused) {
  auto upcast = [](const torch::Tensor& t) {
    auto s = t.scalar_type();
    return (s == torch::kHalf || s == torch::kBFloat16) ? t.to(torch::kFloat) : t;
  };
  auto mean_ce = [&](const torch::Tensor& logits, const torch::Tensor& labels) {
    if (fused && logits.is_cpu() && labels.numel() > 0) return kernels::cross_entropy(logits, labels);
    auto l = upcast(logits);
    if (labels.numel() == 0) return l.sum() * 0;  // no targets: a zero that still connects the graph
    return torch::nll_loss(torch::log_softmax(l, -1), labels.to(l.device()));
  };
  PretrainingLoss loss;
  loss.mlm = mean_ce(out.mlm_logits, mlm_labels);
  loss.nsp = mean_ce(out.nsp_logits, nsp_labels);
  loss.total = loss.mlm + loss.nsp;
  return loss;
}

// Matmul FLOPs (2 per multiply-add) of one forward pass; training = 3x forward (backward computes the grads
// of both matmul operands, twice the forward's work). With T = rows*row_len tokens, M masked tokens and
// N = rows [CLS] tokens (one per row; packed rows have a few more, negligible):
//   encoder layers: layers * (2*T*(3H*H + H*H + 2*H*I)   QKV, attention output, two FFN matrices
//                              + 4*rows*row_len^2*H)       Q.K^T and P.V over all heads, full L x L
//   MLM head:       2*M*H*H + 2*M*H*V                      transform and tied decoder
//   NSP head:       2*N*H*H + 2*N*H*2                      pooler and classifier
// Embedding lookups, LayerNorm, softmax and GELU are not matmuls and are not counted.
double training_flops(const ModelConfig& cfg, int64_t rows, int64_t row_len, int64_t masked_tokens) {
  const double H = cfg.hidden, I = cfg.intermediate, V = cfg.vocab_size, Ly = cfg.layers;
  const double T = static_cast<double>(rows) * row_len, L = row_len, M = masked_tokens, N = rows;
  const double encoder = Ly * (2 * T * (4 * H * H + 2 * H * I) + 4 * rows * L * L * H);
  const double heads = 2 * M * H * H + 2 * M * H * V + 2 * N * H * H + 2 * N * H * 2;
  return 3 * (encoder + heads);
}

}  // namespace bs
