// The BERT pretraining model: parameter layout and initialisation, forward against an independent float64
// reference (per-row, per-head loops, explicit masks), packing and padding invariance, the loss against a
// hand-computed cross-entropy, the FLOP count, the model configs, and one step of bert-base / bert-large.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "common/TrainConfig.h"
#include "trainer/BertModel.h"

namespace {

using bs::BertForPretraining;
using bs::BertInputs;

bs::ModelConfig small_config(double dropout = 0.0) {
  bs::ModelConfig c;
  c.vocab_size = 29;
  c.hidden = 16;
  c.layers = 2;
  c.heads = 4;
  c.intermediate = 24;
  c.max_position = 16;
  c.type_vocab_size = 2;
  c.dropout = dropout;
  return c;
}

torch::Tensor i64(const std::vector<int64_t>& v) { return torch::tensor(v, torch::kLong); }

// One sequence: tokens, segments (positions are 0..n-1).
struct Seq {
  std::vector<int64_t> tokens, segments;
};

// Rows of packed sequences, padded to `row_len`; flat MLM positions per (row, seq, token) and [CLS] positions.
BertInputs build(const std::vector<std::vector<Seq>>& rows, int64_t row_len,
                 const std::vector<std::vector<std::pair<int64_t, int64_t>>>& masked /*(seq, token) per row*/) {
  const int64_t B = static_cast<int64_t>(rows.size());
  std::vector<int64_t> ids(B * row_len, 0), seg(B * row_len, 0), pos(B * row_len, 0), att(B * row_len, 0);
  std::vector<int64_t> mlm, nsp;
  bool packed = false;
  for (int64_t r = 0; r < B; ++r) {
    int64_t at = 0;
    std::vector<int64_t> starts;
    packed |= rows[r].size() > 1;
    for (std::size_t s = 0; s < rows[r].size(); ++s) {
      starts.push_back(at);
      nsp.push_back(r * row_len + at);
      for (std::size_t t = 0; t < rows[r][s].tokens.size(); ++t, ++at) {
        ids[r * row_len + at] = rows[r][s].tokens[t];
        seg[r * row_len + at] = rows[r][s].segments[t];
        pos[r * row_len + at] = static_cast<int64_t>(t);
        att[r * row_len + at] = static_cast<int64_t>(s) + 1;
      }
    }
    for (auto [s, t] : masked[r]) mlm.push_back(r * row_len + starts[s] + t);
  }
  BertInputs in;
  in.input_ids = i64(ids).view({B, row_len});
  in.segment_ids = i64(seg).view({B, row_len});
  in.position_ids = i64(pos).view({B, row_len});
  in.attention_ids = i64(att).view({B, row_len});
  in.packed = packed;
  in.mlm_positions = i64(mlm);
  in.nsp_positions = i64(nsp);
  return in;
}

const Seq kA{{1, 7, 12, 3, 20, 2}, {0, 0, 0, 1, 1, 1}};
const Seq kB{{1, 9, 2, 25, 2}, {0, 0, 0, 1, 1}};
const Seq kC{{1, 14, 5, 2}, {0, 0, 1, 1}};

BertForPretraining random_model(const bs::ModelConfig& cfg, uint64_t seed = 3) {
  torch::manual_seed(seed);
  BertForPretraining m(cfg);
  m->to(torch::kDouble);
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) p.normal_(0.0, 0.3);  // far from init: attention not uniform
  return m;
}

// ---- independent reference: explicit loops, one row and one head at a time, masks as index sets ----------
torch::Tensor ref_layer_norm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  auto mean = x.mean(-1, true);
  auto var = (x - mean).pow(2).mean(-1, true);
  return (x - mean) / torch::sqrt(var + 1e-12) * w + b;
}
torch::Tensor ref_gelu(const torch::Tensor& x) { return 0.5 * x * (1 + torch::erf(x / std::sqrt(2.0))); }

bs::BertOutputs reference_forward(BertForPretraining& m, const BertInputs& in) {
  torch::NoGradGuard no_grad;
  auto P = m->named_parameters();
  auto p = [&](const std::string& n) { return P[n].detach(); };
  const auto& cfg = m->config();
  const int64_t B = in.input_ids.size(0), L = in.input_ids.size(1), H = cfg.hidden, nh = cfg.heads, d = H / nh;
  auto hidden = torch::zeros({B * L, H}, torch::kDouble);
  for (int64_t t = 0; t < B * L; ++t) {
    auto e = p("embeddings.word_embeddings.weight")[in.input_ids.view(-1)[t].item<int64_t>()] +
             p("embeddings.position_embeddings.weight")[in.position_ids.view(-1)[t].item<int64_t>()] +
             p("embeddings.token_type_embeddings.weight")[in.segment_ids.view(-1)[t].item<int64_t>()];
    hidden[t] = ref_layer_norm(e, p("embeddings.LayerNorm.weight"), p("embeddings.LayerNorm.bias"));
  }
  auto att = in.attention_ids.view(-1);
  for (int64_t l = 0; l < cfg.layers; ++l) {
    const std::string pre = "encoder." + std::to_string(l) + ".";
    auto W = p(pre + "attention.qkv.weight"), bq = p(pre + "attention.qkv.bias");
    auto next = torch::zeros_like(hidden);
    for (int64_t r = 0; r < B; ++r) {
      for (int64_t i = 0; i < L; ++i) {
        const int64_t qi = r * L + i, id = att[qi].item<int64_t>();
        if (id == 0) continue;  // padding queries do not matter
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < L; ++j)
          if (att[r * L + j].item<int64_t>() == id) keys.push_back(r * L + j);
        auto ctx = torch::zeros({H}, torch::kDouble);
        for (int64_t h = 0; h < nh; ++h) {
          auto Wq = W.slice(0, h * d, (h + 1) * d), Wk = W.slice(0, H + h * d, H + (h + 1) * d),
               Wv = W.slice(0, 2 * H + h * d, 2 * H + (h + 1) * d);
          auto q = torch::mv(Wq, hidden[qi]) + bq.slice(0, h * d, (h + 1) * d);
          std::vector<double> s;
          std::vector<torch::Tensor> vs;
          for (auto kj : keys) {
            auto k = torch::mv(Wk, hidden[kj]) + bq.slice(0, H + h * d, H + (h + 1) * d);
            s.push_back(torch::dot(q, k).item<double>() / std::sqrt(static_cast<double>(d)));
            vs.push_back(torch::mv(Wv, hidden[kj]) + bq.slice(0, 2 * H + h * d, 2 * H + (h + 1) * d));
          }
          double mx = *std::max_element(s.begin(), s.end()), z = 0;
          for (double v : s) z += std::exp(v - mx);
          auto head = torch::zeros({d}, torch::kDouble);
          for (std::size_t j = 0; j < s.size(); ++j) head += std::exp(s[j] - mx) / z * vs[j];
          ctx.slice(0, h * d, (h + 1) * d).copy_(head);
        }
        auto a = torch::mv(p(pre + "attention.output.weight"), ctx) + p(pre + "attention.output.bias");
        a = ref_layer_norm(a + hidden[qi], p(pre + "attention.LayerNorm.weight"), p(pre + "attention.LayerNorm.bias"));
        auto f = ref_gelu(torch::mv(p(pre + "ffn.intermediate.weight"), a) + p(pre + "ffn.intermediate.bias"));
        f = torch::mv(p(pre + "ffn.output.weight"), f) + p(pre + "ffn.output.bias");
        next[qi] = ref_layer_norm(f + a, p(pre + "ffn.LayerNorm.weight"), p(pre + "ffn.LayerNorm.bias"));
      }
    }
    hidden = next;
  }
  bs::BertOutputs out;
  std::vector<torch::Tensor> mlm, nsp;
  for (int64_t k = 0; k < in.mlm_positions.size(0); ++k) {
    auto x = hidden[in.mlm_positions[k].item<int64_t>()];
    x = ref_gelu(torch::mv(p("mlm.transform.weight"), x) + p("mlm.transform.bias"));
    x = ref_layer_norm(x, p("mlm.LayerNorm.weight"), p("mlm.LayerNorm.bias"));
    mlm.push_back(torch::mv(p("embeddings.word_embeddings.weight"), x) + p("mlm.decoder_bias"));
  }
  for (int64_t k = 0; k < in.nsp_positions.size(0); ++k) {
    auto x = torch::tanh(torch::mv(p("nsp.pooler.weight"), hidden[in.nsp_positions[k].item<int64_t>()]) +
                         p("nsp.pooler.bias"));
    nsp.push_back(torch::mv(p("nsp.classifier.weight"), x) + p("nsp.classifier.bias"));
  }
  out.mlm_logits = torch::stack(mlm);
  out.nsp_logits = torch::stack(nsp);
  return out;
}

void expect_close(const torch::Tensor& a, const torch::Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double diff = (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
  EXPECT_LE(diff, tol) << what << ": max abs difference " << diff;
}

// ---- layout and initialisation ---------------------------------------------------------------------------
TEST(BertModel, ParameterNamesFollowForwardOrderAndCountMatchesFormula) {
  auto cfg = small_config();
  BertForPretraining m(cfg);
  auto named = m->named_parameters();
  std::vector<std::string> names;
  for (const auto& kv : named) names.push_back(kv.key());
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "embeddings.word_embeddings.weight");
  EXPECT_EQ(names.back(), "nsp.classifier.bias");
  auto index_of = [&](const std::string& n) {
    auto it = std::find(names.begin(), names.end(), n);
    EXPECT_NE(it, names.end()) << "missing parameter " << n;
    return it - names.begin();
  };
  EXPECT_LT(index_of("embeddings.LayerNorm.bias"), index_of("encoder.0.attention.qkv.weight"));
  EXPECT_LT(index_of("encoder.0.ffn.LayerNorm.bias"), index_of("encoder.1.attention.qkv.weight"));
  EXPECT_LT(index_of("encoder.1.ffn.LayerNorm.bias"), index_of("mlm.transform.weight"));
  EXPECT_LT(index_of("mlm.decoder_bias"), index_of("nsp.pooler.weight"));
  for (const auto& kv : named) {
    const auto& n = kv.key();
    const bool is_bias = n.find("bias") != std::string::npos, is_ln = n.find("LayerNorm") != std::string::npos;
    if (kv.value().dim() == 1) {
      EXPECT_TRUE(is_bias || is_ln) << n << " is 1-d but would get weight decay";
    } else
      EXPECT_FALSE(is_bias || is_ln) << n << " is a matrix but would be excluded from weight decay";
  }
  const int64_t V = cfg.vocab_size, H = cfg.hidden, I = cfg.intermediate;
  const int64_t per_layer = (3 * H * H + 3 * H) + (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H;
  const int64_t expected = V * H + cfg.max_position * H + cfg.type_vocab_size * H + 2 * H + cfg.layers * per_layer +
                           (H * H + H + 2 * H + V) + (H * H + H + 2 * H + 2);
  EXPECT_EQ(m->num_parameters(), expected);
  // Tied decoder: no separate [V, H] decoder matrix.
  for (const auto& kv : named)
    if (kv.key() != "embeddings.word_embeddings.weight") {
      EXPECT_NE(kv.value().sizes(), (std::vector<int64_t>{V, H})) << kv.key();
    }
}

TEST(BertModel, InitialisationIsBerts) {
  bs::ModelConfig cfg = small_config();
  cfg.hidden = 128;
  cfg.intermediate = 256;
  cfg.heads = 2;
  cfg.vocab_size = 500;
  torch::manual_seed(1);
  BertForPretraining m(cfg);
  for (const auto& kv : m->named_parameters()) {
    const auto& n = kv.key();
    const auto& p = kv.value();
    if (n.find("LayerNorm.weight") != std::string::npos) {
      EXPECT_TRUE(torch::all(p == 1).item<bool>()) << n;
    } else if (n.find("bias") != std::string::npos) {
      EXPECT_TRUE(torch::all(p == 0).item<bool>()) << n;
    } else {
      ASSERT_EQ(p.dim(), 2) << n;
      EXPECT_NEAR(p.mean().item<double>(), 0.0, 0.02 * 5 / std::sqrt(double(p.numel()))) << n;
      EXPECT_NEAR(p.std().item<double>(), 0.02, 0.02 * 0.15) << n;
    }
  }
}

TEST(BertModel, RejectsConfigWithoutVocabSize) {
  auto cfg = small_config();
  cfg.vocab_size = 0;
  EXPECT_THROW(BertForPretraining{cfg}, std::invalid_argument);
}

// ---- forward numerics ------------------------------------------------------------------------------------
TEST(BertModel, UnpackedForwardMatchesFloat64Reference) {
  auto m = random_model(small_config());
  m->eval();
  auto in = build({{kA}, {kC}, {kB}}, 7, {{{0, 1}, {0, 4}}, {{0, 2}}, {{0, 1}, {0, 3}}});
  torch::NoGradGuard no_grad;
  auto out = m->forward(in);
  auto ref = reference_forward(m, in);
  EXPECT_EQ(out.mlm_logits.sizes(), (std::vector<int64_t>{5, 29}));
  EXPECT_EQ(out.nsp_logits.sizes(), (std::vector<int64_t>{3, 2}));
  expect_close(out.mlm_logits, ref.mlm_logits, 1e-10, "mlm logits");
  expect_close(out.nsp_logits, ref.nsp_logits, 1e-10, "nsp logits");
}

TEST(BertModel, PackedForwardMatchesFloat64Reference) {
  auto m = random_model(small_config());
  m->eval();
  auto in = build({{kA, kC}, {kB}}, 11, {{{0, 1}, {1, 2}}, {{0, 3}}});
  ASSERT_TRUE(in.packed);
  auto out = m->forward(in);  // grad mode on: the out-of-place softmax path
  auto ref = reference_forward(m, in);
  expect_close(out.mlm_logits, ref.mlm_logits, 1e-10, "mlm logits");
  expect_close(out.nsp_logits, ref.nsp_logits, 1e-10, "nsp logits");
}

TEST(BertModel, PackedRowEqualsSeparatePaddedRows) {
  auto m = random_model(small_config());
  m->train();  // dropout 0: training mode is deterministic too
  auto packed = build({{kA, kB}}, 12, {{{0, 1}, {0, 4}, {1, 1}, {1, 3}}});
  auto separate = build({{kA}, {kB}}, 12, {{{0, 1}, {0, 4}}, {{0, 1}, {0, 3}}});
  ASSERT_TRUE(packed.packed);
  ASSERT_FALSE(separate.packed);
  auto a = m->forward(packed), b = m->forward(separate);
  expect_close(a.mlm_logits, b.mlm_logits, 1e-12, "mlm logits");
  expect_close(a.nsp_logits, b.nsp_logits, 1e-12, "nsp logits");
  // Without the block mask the two sequences would see each other: the test can fail.
  packed.packed = false;
  auto leaky = m->forward(packed);
  EXPECT_GT((leaky.mlm_logits - b.mlm_logits).abs().max().item<double>(), 1e-3);
}

TEST(BertModel, PaddingDoesNotChangeLogitsOfRealTokens) {
  auto m = random_model(small_config());
  m->eval();
  torch::NoGradGuard no_grad;
  auto alone = build({{kC}}, 4, {{{0, 1}, {0, 2}}});
  auto padded = build({{kA}, {kC}}, 9, {{{0, 3}}, {{0, 1}, {0, 2}}});
  auto a = m->forward(alone), b = m->forward(padded);
  expect_close(a.mlm_logits, b.mlm_logits.slice(0, 1, 3), 1e-12, "mlm logits");
  expect_close(a.nsp_logits, b.nsp_logits.slice(0, 1, 2), 1e-12, "nsp logits");
  // Different pad token ids behind the mask change nothing either.
  auto junk = padded;
  junk.input_ids = padded.input_ids.clone();
  junk.input_ids[0].slice(0, 6, 9).fill_(17);  // row 0 holds kA (6 tokens), row 1 kC (4 tokens)
  junk.input_ids[1].slice(0, 4, 9).fill_(23);
  expect_close(m->forward(junk).mlm_logits, b.mlm_logits, 1e-12, "mlm logits with other pad ids");
}

TEST(BertModel, NoGradEvalMatchesGradModeAndFloat32MatchesFloat64) {
  auto m = random_model(small_config());
  m->eval();
  auto in = build({{kA, kC}, {kB}}, 11, {{{0, 1}, {1, 2}}, {{0, 3}}});
  auto with_grad = m->forward(in);
  torch::Tensor no_grad_logits;
  {
    torch::NoGradGuard g;
    no_grad_logits = m->forward(in).mlm_logits;  // in-place softmax path
  }
  expect_close(no_grad_logits, with_grad.mlm_logits, 1e-12, "no-grad vs grad mode");
  m->to(torch::kFloat);
  auto f32 = m->forward(in);
  EXPECT_EQ(f32.mlm_logits.scalar_type(), torch::kFloat);
  expect_close(f32.mlm_logits, with_grad.mlm_logits, 1e-3, "float32 vs float64");
}

TEST(BertModel, DropoutOnlyInTraining) {
  torch::manual_seed(5);
  BertForPretraining m(small_config(0.3));
  auto in = build({{kA}, {kB}}, 6, {{{0, 1}}, {{0, 2}}});
  m->train();
  auto a = m->forward(in).mlm_logits, b = m->forward(in).mlm_logits;
  EXPECT_GT((a - b).abs().max().item<double>(), 0.0);
  m->eval();
  auto c = m->forward(in).mlm_logits, d = m->forward(in).mlm_logits;
  EXPECT_TRUE(torch::equal(c, d));
}

TEST(BertModel, Bfloat16RunsForwardAndBackward) {
  auto m = random_model(small_config());
  auto in = build({{kA, kC}, {kB}}, 11, {{{0, 1}, {1, 2}}, {{0, 3}}});
  auto ref = m->forward(in);
  m->to(torch::kBFloat16);
  auto out = m->forward(in);
  EXPECT_EQ(out.mlm_logits.scalar_type(), torch::kBFloat16);
  auto loss = bs::pretraining_loss(out, i64({3, 4, 5}), i64({0, 1, 1}));
  EXPECT_EQ(loss.total.scalar_type(), torch::kFloat);
  loss.total.backward();
  auto g = m->embeddings->word_embeddings->weight.grad();
  ASSERT_TRUE(g.defined());
  EXPECT_EQ(g.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::isfinite(g).all().item<bool>());
  // bf16 keeps ~3 significant digits; logits are O(10) here.
  const double scale = ref.mlm_logits.abs().max().item<double>();
  expect_close(out.mlm_logits, ref.mlm_logits, 0.1 * scale, "bf16 vs float64");
}

TEST(BertModel, RunsOnCudaWhenAvailable) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  auto m = random_model(small_config());
  auto in = build({{kA, kC}, {kB}}, 11, {{{0, 1}, {1, 2}}, {{0, 3}}});
  auto ref = m->forward(in);
  m->to(torch::kCUDA);
  for (auto* t :
       {&in.input_ids, &in.segment_ids, &in.position_ids, &in.attention_ids, &in.mlm_positions, &in.nsp_positions})
    *t = t->to(torch::kCUDA);
  auto out = m->forward(in);
  expect_close(out.mlm_logits.cpu(), ref.mlm_logits, 1e-9, "cuda vs cpu");
}

// ---- loss ------------------------------------------------------------------------------------------------
double hand_cross_entropy(const std::vector<std::vector<double>>& logits, const std::vector<int64_t>& labels) {
  double total = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    double z = 0;
    for (double v : logits[i]) z += std::exp(v);
    total += std::log(z) - logits[i][labels[i]];
  }
  return total / logits.size();
}

TEST(BertModel, LossMatchesHandComputedCrossEntropy) {
  std::vector<std::vector<double>> mlm = {{0.5, -1.0, 2.0, 0.0}, {1.5, 1.5, -0.5, 3.0}, {-2.0, 0.1, 0.2, 0.3}};
  std::vector<std::vector<double>> nsp = {{0.3, -0.7}, {2.0, 1.0}};
  std::vector<int64_t> mlm_labels = {2, 0, 3}, nsp_labels = {1, 0};
  auto to_tensor = [](const std::vector<std::vector<double>>& rows) {
    std::vector<torch::Tensor> t;
    for (const auto& r : rows) t.push_back(torch::tensor(r, torch::kDouble));
    return torch::stack(t);
  };
  bs::BertOutputs out{to_tensor(mlm), to_tensor(nsp)};
  auto loss = bs::pretraining_loss(out, i64(mlm_labels), i64(nsp_labels));
  const double want_mlm = hand_cross_entropy(mlm, mlm_labels), want_nsp = hand_cross_entropy(nsp, nsp_labels);
  EXPECT_NEAR(loss.mlm.item<double>(), want_mlm, 1e-12);
  EXPECT_NEAR(loss.nsp.item<double>(), want_nsp, 1e-12);
  EXPECT_NEAR(loss.total.item<double>(), want_mlm + want_nsp, 1e-12);
  // float32 logits give the same to float precision.
  auto f = bs::pretraining_loss({out.mlm_logits.to(torch::kFloat), out.nsp_logits.to(torch::kFloat)}, i64(mlm_labels),
                                i64(nsp_labels));
  EXPECT_NEAR(f.total.item<double>(), want_mlm + want_nsp, 1e-5);
}

TEST(BertModel, LossWithoutMaskedTokensIsZeroAndFinite) {
  auto out = bs::BertOutputs{torch::zeros({0, 7}, torch::kDouble).requires_grad_(),
                             torch::tensor({{0.0, 1.0}}, torch::kDouble).requires_grad_()};
  auto loss = bs::pretraining_loss(out, torch::zeros({0}, torch::kLong), i64({1}));
  EXPECT_EQ(loss.mlm.item<double>(), 0.0);
  EXPECT_NEAR(loss.total.item<double>(), std::log(1 + std::exp(-1.0)), 1e-12);
  loss.total.backward();
  EXPECT_TRUE(out.nsp_logits.grad().defined());
}

// ---- FLOPs -----------------------------------------------------------------------------------------------
// Counts matmul FLOPs from the model's own weight matrices: each [out, in] weight applied to the rows it sees.
TEST(BertModel, TrainingFlopsCountEveryWeightMatrixAndAttention) {
  auto cfg = small_config();
  BertForPretraining m(cfg);
  const int64_t rows = 3, row_len = 10, masked = 7;
  double forward = 0;
  for (const auto& kv : m->named_parameters()) {
    const auto& n = kv.key();
    const auto& p = kv.value();
    if (p.dim() != 2 || n.rfind("embeddings.", 0) == 0) continue;  // lookups are not matmuls
    const double tokens = n.rfind("encoder.", 0) == 0 ? rows * row_len : n.rfind("mlm.", 0) == 0 ? masked : rows;
    forward += 2.0 * p.numel() * tokens;
  }
  forward += 2.0 * cfg.vocab_size * cfg.hidden * masked;                      // tied decoder: the word embedding matrix
  forward += cfg.layers * 2 * (2.0 * rows * row_len * row_len * cfg.hidden);  // QK^T and PV
  EXPECT_DOUBLE_EQ(bs::training_flops(cfg, rows, row_len, masked), 3 * forward);
}

// ---- configs and full-size models ------------------------------------------------------------------------
std::string model_config_path(const std::string& name) {
  return std::string(BERTSWEEP_TEST_SOURCE_DIR) + "/configs/models/" + name + ".yaml";
}

TEST(BertModel, ModelConfigsLoadWithTheirSizes) {
  struct Want {
    std::string name;
    int64_t layers, hidden, heads, intermediate;
  };
  for (const auto& w : std::vector<Want>{{"bert-tiny", 2, 128, 2, 512},
                                         {"bert-mini", 4, 256, 4, 1024},
                                         {"bert-small", 4, 512, 8, 2048},
                                         {"bert-base", 12, 768, 12, 3072},
                                         {"bert-large", 24, 1024, 16, 4096}}) {
    auto c = bs::TrainConfig::load(model_config_path(w.name)).model;
    EXPECT_EQ(c.layers, w.layers) << w.name;
    EXPECT_EQ(c.hidden, w.hidden) << w.name;
    EXPECT_EQ(c.heads, w.heads) << w.name;
    EXPECT_EQ(c.intermediate, w.intermediate) << w.name;
    EXPECT_EQ(c.max_position, 512) << w.name;
    EXPECT_EQ(c.vocab_size, 0) << w.name;
  }
}

void one_training_step(const std::string& name, int64_t expected_encoder_params) {
  auto cfg = bs::TrainConfig::load(model_config_path(name)).model;
  cfg.vocab_size = 1000;  // small vocab: the test is about the encoder
  torch::manual_seed(2);
  BertForPretraining m(cfg);
  const int64_t H = cfg.hidden, V = cfg.vocab_size;
  EXPECT_EQ(m->num_parameters(),
            expected_encoder_params + V * H + 512 * H + 2 * H + 2 * H + (H * H + 3 * H + V) + (H * H + 3 * H + 2))
      << name;
  m->train();
  const int64_t L = 16;
  Seq s{{}, {}};
  for (int64_t i = 0; i < L; ++i) {
    s.tokens.push_back((i * 37 + 5) % V);
    s.segments.push_back(i < L / 2 ? 0 : 1);
  }
  auto in = build({{s}}, L, {{{0, 3}, {0, 9}, {0, 14}}});
  auto out = m->forward(in);
  auto loss = bs::pretraining_loss(out, i64({1, 2, 3}), i64({1}));
  // Near-uniform predictions at init: the MLM loss is close to log(V).
  EXPECT_NEAR(loss.mlm.item<double>(), std::log(double(V)), 1.0) << name;
  loss.total.backward();
  for (const auto& kv : m->named_parameters()) {
    ASSERT_TRUE(kv.value().grad().defined()) << name << ": no gradient for " << kv.key();
    ASSERT_TRUE(torch::isfinite(kv.value().grad()).all().item<bool>()) << name << ": " << kv.key();
  }
  EXPECT_GT(m->embeddings->word_embeddings->weight.grad().abs().sum().item<double>(), 0.0);
}

TEST(BertModel, BertBaseRunsOneTrainingStep) { one_training_step("bert-base", 12 * 7087872); }
TEST(BertModel, BertLargeRunsOneTrainingStep) { one_training_step("bert-large", 24 * 12596224); }

}  // namespace
