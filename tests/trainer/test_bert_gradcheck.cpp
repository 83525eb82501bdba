// Backward of the BERT pretraining model against central finite differences in float64, on a tiny model,
// for unpacked (key-padding mask) and packed (block-diagonal mask) inputs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "trainer/BertModel.h"

namespace {

using bs::BertForPretraining;
using bs::BertInputs;

bs::ModelConfig tiny_config() {
  bs::ModelConfig c;
  c.vocab_size = 13;
  c.hidden = 8;
  c.layers = 1;
  c.heads = 2;
  c.intermediate = 16;
  c.max_position = 8;
  c.type_vocab_size = 2;
  c.dropout = 0.0;
  return c;
}

torch::Tensor i64(const std::vector<int64_t>& v, std::vector<int64_t> shape) {
  return torch::tensor(v, torch::kLong).reshape(shape);
}

// Two rows of 6: a full sequence and one of 4 tokens + 2 padding.
BertInputs unpacked_inputs() {
  BertInputs in;
  in.input_ids = i64({1, 5, 7, 2, 9, 2, 1, 11, 3, 2, 0, 0}, {2, 6});
  in.segment_ids = i64({0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0}, {2, 6});
  in.position_ids = i64({0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}, {2, 6});
  in.attention_ids = i64({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 6});
  in.packed = false;
  in.mlm_positions = i64({1, 4, 7, 8}, {4});
  in.nsp_positions = i64({0, 6}, {2});
  return in;
}

// Row 0 packs a sequence of 3 and one of 2 (+1 padding); row 1 holds one sequence of 5 (+1 padding).
BertInputs packed_inputs() {
  BertInputs in;
  in.input_ids = i64({1, 6, 2, 1, 12, 0, 1, 4, 8, 10, 2, 0}, {2, 6});
  in.segment_ids = i64({0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 1, 0}, {2, 6});
  in.position_ids = i64({0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 0}, {2, 6});
  in.attention_ids = i64({1, 1, 1, 2, 2, 0, 1, 1, 1, 1, 1, 0}, {2, 6});
  in.packed = true;
  in.mlm_positions = i64({1, 4, 8, 9}, {4});
  in.nsp_positions = i64({0, 3, 6}, {3});
  return in;
}

// Cross-entropy loss plus a fixed random projection of every logit, so that each logit's gradient matters.
struct Objective {
  BertForPretraining model;
  BertInputs in;
  torch::Tensor mlm_labels, nsp_labels, mlm_weights, nsp_weights;

  torch::Tensor operator()() {
    auto out = model->forward(in);
    auto loss = bs::pretraining_loss(out, mlm_labels, nsp_labels);
    return loss.total + (out.mlm_logits * mlm_weights).sum() + (out.nsp_logits * nsp_weights).sum();
  }
};

Objective make_objective(const BertInputs& in, const std::string& kernels = "reference") {
  torch::manual_seed(7);
  auto cfg = tiny_config();
  cfg.kernels = kernels;
  Objective f{BertForPretraining(cfg), in, {}, {}, {}, {}};
  f.model->to(torch::kDouble);
  f.model->train();  // dropout is 0: training mode must still be deterministic
  {
    // Larger-than-init random weights so attention is far from uniform and LayerNorm is nontrivial.
    torch::NoGradGuard no_grad;
    for (auto& p : f.model->parameters()) p.normal_(0.0, 0.5);
  }
  const int64_t M = in.mlm_positions.size(0), N = in.nsp_positions.size(0);
  f.mlm_labels = torch::randint(0, 13, {M}, torch::kLong);
  f.nsp_labels = torch::randint(0, 2, {N}, torch::kLong);
  f.mlm_weights = torch::randn({M, 13}, torch::kDouble) * 0.1;
  f.nsp_weights = torch::randn({N, 2}, torch::kDouble) * 0.1;
  return f;
}

// Compares the autograd gradient of every entry of `name` with (f(p+h) - f(p-h)) / 2h.
void check_parameter(Objective& f, const std::string& name) {
  auto params = f.model->named_parameters();
  ASSERT_TRUE(params.contains(name)) << "no parameter " << name;
  torch::Tensor p = params[name];
  f.model->zero_grad();
  f().backward();
  ASSERT_TRUE(p.grad().defined()) << name;
  auto analytic = p.grad().clone().reshape({-1});
  ASSERT_GT(analytic.abs().max().item<double>(), 1e-6) << name << ": gradient is all zero, nothing checked";

  torch::NoGradGuard no_grad;
  auto flat = p.view({-1});
  const double h = 1e-6;
  int64_t bad = 0;
  for (int64_t i = 0; i < flat.numel(); ++i) {
    const double orig = flat[i].item<double>();
    flat[i] = orig + h;
    const double up = f().item<double>();
    flat[i] = orig - h;
    const double down = f().item<double>();
    flat[i] = orig;
    const double numeric = (up - down) / (2 * h);
    const double a = analytic[i].item<double>();
    const double tol = 1e-6 * std::max(std::abs(a), std::abs(numeric)) + 1e-8;
    if (std::abs(a - numeric) > tol && bad++ < 5)
      ADD_FAILURE() << name << "[" << i << "]: autograd " << a << " vs finite difference " << numeric;
  }
  EXPECT_EQ(bad, 0) << name << ": " << bad << " of " << flat.numel() << " entries differ";
}

const std::vector<std::string> kChecked = {
    "embeddings.word_embeddings.weight",  // tied: input embedding and MLM decoder
    "embeddings.position_embeddings.weight",
    "encoder.0.attention.qkv.weight",
    "encoder.0.attention.LayerNorm.weight",
    "encoder.0.ffn.intermediate.bias",
    "encoder.0.ffn.LayerNorm.bias",
    "mlm.decoder_bias",
    "nsp.pooler.weight",
    "nsp.classifier.weight",
};

TEST(BertGradcheck, UnpackedMatchesFiniteDifferences) {
  auto f = make_objective(unpacked_inputs());
  for (const auto& name : kChecked) check_parameter(f, name);
}

TEST(BertGradcheck, PackedMatchesFiniteDifferences) {
  auto f = make_objective(packed_inputs());
  for (const auto& name : kChecked) check_parameter(f, name);
}

// The same checks through the fused CPU kernels (kernels/FusedOps.h) in float64.
TEST(BertGradcheck, FusedKernelsUnpackedMatchesFiniteDifferences) {
  auto f = make_objective(unpacked_inputs(), "fused");
  for (const auto& name : kChecked) check_parameter(f, name);
}

TEST(BertGradcheck, FusedKernelsPackedMatchesFiniteDifferences) {
  auto f = make_objective(packed_inputs(), "fused");
  for (const auto& name : kChecked) check_parameter(f, name);
}

}  // namespace
