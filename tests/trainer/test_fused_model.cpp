// The BERT model with model.kernels: fused against the same weights on the reference path: same loss and
// gradients on the same batch (float32 tight, bf16 within bf16 tolerances), with padded rows in the batch;
// with dropout, the fused model's masks repeat exactly under the same generator state.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "kernels/FusedOps.h"
#include "trainer/BertModel.h"

namespace {

bs::ModelConfig small_config(const std::string& kernels, double dropout) {
  bs::ModelConfig c;
  c.vocab_size = 101;
  c.hidden = 48;  // 3 heads of 16: not a multiple of 32 lanes in any LayerNorm or GELU row
  c.layers = 2;
  c.heads = 3;
  c.intermediate = 100;
  c.max_position = 32;
  c.dropout = dropout;
  c.kernels = kernels;
  return c;
}

// Three rows of 13 tokens: full, 9 real + 4 padding, 5 real + 8 padding.
bs::BertInputs padded_batch(torch::Tensor& mlm_labels, torch::Tensor& nsp_labels) {
  torch::manual_seed(3);
  const int64_t B = 3, L = 13;
  const int64_t real[] = {13, 9, 5};
  bs::BertInputs in;
  in.input_ids = torch::randint(5, 101, {B, L}, torch::kLong);
  in.segment_ids = torch::zeros({B, L}, torch::kLong);
  in.position_ids = torch::arange(L, torch::kLong).repeat({B, 1});
  in.attention_ids = torch::zeros({B, L}, torch::kLong);
  for (int64_t b = 0; b < B; ++b) {
    in.attention_ids[b].narrow(0, 0, real[b]).fill_(1);
    in.input_ids[b].narrow(0, real[b], L - real[b]).fill_(0);
    in.segment_ids[b].narrow(0, real[b] / 2, real[b] - real[b] / 2).fill_(1);
  }
  in.mlm_positions = torch::tensor({1, 4, 11, 14, 20, 27, 29}, torch::kLong);
  in.nsp_positions = torch::tensor({0, 13, 26}, torch::kLong);
  mlm_labels = torch::randint(0, 101, {7}, torch::kLong);
  nsp_labels = torch::tensor({0, 1, 1}, torch::kLong);
  return in;
}

struct Result {
  double loss;
  std::vector<torch::Tensor> grads;
};

Result loss_and_grads(bs::BertForPretraining& model, const bs::BertInputs& in, const torch::Tensor& mlm,
                      const torch::Tensor& nsp) {
  model->zero_grad();
  auto loss = bs::pretraining_loss(model->forward(in), mlm, nsp, model->fused_kernels()).total;
  loss.backward();
  Result r{loss.item<double>(), {}};
  for (auto& p : model->parameters()) r.grads.push_back(p.grad().to(torch::kFloat).clone());
  return r;
}

void compare(torch::ScalarType dtype, double loss_tol, double grad_rtol) {
  torch::Tensor mlm, nsp;
  const auto in = padded_batch(mlm, nsp);
  torch::manual_seed(1);
  bs::BertForPretraining reference(small_config("reference", 0.0));
  torch::manual_seed(1);
  bs::BertForPretraining fused(small_config("fused", 0.0));
  reference->to(dtype);
  fused->to(dtype);
  const auto want = loss_and_grads(reference, in, mlm, nsp), got = loss_and_grads(fused, in, mlm, nsp);
  EXPECT_NEAR(got.loss, want.loss, loss_tol);
  const auto names = reference->named_parameters().keys();
  for (std::size_t i = 0; i < want.grads.size(); ++i) {
    const double scale = want.grads[i].abs().max().item<double>() + 1e-12;
    const double err = (got.grads[i] - want.grads[i]).abs().max().item<double>();
    EXPECT_LE(err, grad_rtol * scale) << names[i] << ": max gradient difference " << err << " of max " << scale;
  }
}

TEST(FusedModel, Float32LossAndGradientsEqualTheReferencePath) { compare(torch::kFloat, 1e-5, 1e-4); }

TEST(FusedModel, Bf16LossAndGradientsEqualTheReferencePathWithinBf16Tolerance) {
  compare(torch::kBFloat16, 2e-2, 8e-2);
}

TEST(FusedModel, DropoutMasksRepeatUnderTheSameGeneratorState) {
  torch::Tensor mlm, nsp;
  const auto in = padded_batch(mlm, nsp);
  torch::manual_seed(1);
  bs::BertForPretraining model(small_config("fused", 0.1));
  torch::manual_seed(42);
  const auto a = loss_and_grads(model, in, mlm, nsp);
  torch::manual_seed(42);
  const auto b = loss_and_grads(model, in, mlm, nsp);
  const auto c = loss_and_grads(model, in, mlm, nsp);  // the generator moved on: other masks
  EXPECT_EQ(a.loss, b.loss);
  for (std::size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(torch::equal(a.grads[i], b.grads[i]));
  EXPECT_NE(a.loss, c.loss);
}

TEST(FusedModel, AutoIsTheFusedPathWhereItIsBuilt) {
  EXPECT_EQ(bs::use_fused_kernels(small_config("auto", 0.1)), bs::kernels::fused_available());
  EXPECT_FALSE(bs::use_fused_kernels(small_config("reference", 0.1)));
  EXPECT_TRUE(bs::use_fused_kernels(small_config("fused", 0.1)));
}

}  // namespace
