// The BERT model with model.kernels: fused against the same weights on the reference path: same loss and
// gradients on the same batch (float32 tight, bf16 within bf16 tolerances), with padded rows in the batch;
// with dropout, the fused model's masks repeat exactly under the same generator state. model.unpad: the
// unpadded model (token-wise work on the real tokens only) against the padded one on the same weights, padded
// and packed batches, both kernel paths; padding never enters the unpadded computation.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/FusedOps.h"
#include "trainer/BertModel.h"

namespace {

bs::ModelConfig small_config(const std::string& kernels, double dropout, const std::string& unpad = "auto") {
  bs::ModelConfig c;
  c.vocab_size = 101;
  c.hidden = 48;  // 3 heads of 16: not a multiple of 32 lanes in any LayerNorm or GELU row
  c.layers = 2;
  c.heads = 3;
  c.intermediate = 100;
  c.max_position = 32;
  c.dropout = dropout;
  c.kernels = kernels;
  c.unpad = unpad;
  return c;
}

// Three rows of 13 tokens: full, 9 real + 4 padding, 5 real + 8 padding. Unpadded: 27 real tokens of 39, in 28
// rows (unpad_row_granule 2), the last a copy of the first.
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

// Two rows of 13 tokens, packed: row 0 holds sequences of 6 and 5 tokens + 2 padding, row 1 one sequence of
// 8 + 5 padding (the block-diagonal attention bias, with padding).
bs::BertInputs packed_batch(torch::Tensor& mlm_labels, torch::Tensor& nsp_labels) {
  torch::manual_seed(4);
  const int64_t B = 2, L = 13;
  bs::BertInputs in;
  in.input_ids = torch::randint(5, 101, {B, L}, torch::kLong);
  in.segment_ids = torch::zeros({B, L}, torch::kLong);
  in.position_ids = torch::zeros({B, L}, torch::kLong);
  in.attention_ids = torch::zeros({B, L}, torch::kLong);
  const std::vector<std::vector<int64_t>> seqs = {{6, 5}, {8}};
  for (int64_t b = 0; b < B; ++b) {
    int64_t at = 0, id = 1;
    for (int64_t n : seqs[b]) {
      in.attention_ids[b].narrow(0, at, n).fill_(id++);
      in.position_ids[b].narrow(0, at, n).copy_(torch::arange(n, torch::kLong));
      in.segment_ids[b].narrow(0, at + n / 2, n - n / 2).fill_(1);
      at += n;
    }
    in.input_ids[b].narrow(0, at, L - at).fill_(0);
  }
  in.packed = true;
  in.mlm_positions = torch::tensor({2, 7, 10, 15, 19}, torch::kLong);
  in.nsp_positions = torch::tensor({0, 6, 13}, torch::kLong);
  mlm_labels = torch::randint(0, 101, {5}, torch::kLong);
  nsp_labels = torch::tensor({1, 0, 1}, torch::kLong);
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

// ---------------------------------------------------------------------------------------------------------
struct UnpadCase {
  const char* kernels;
  torch::ScalarType dtype;
  bool packed;
  double loss_tol, grad_rtol;
};

void PrintTo(const UnpadCase& c, std::ostream* os) {
  *os << c.kernels << " " << c10::toString(c.dtype) << (c.packed ? " packed" : " padded");
}

class UnpaddedModel : public ::testing::TestWithParam<UnpadCase> {};

TEST_P(UnpaddedModel, SameLossAndGradientsAsThePaddedModel) {
  const auto& c = GetParam();
  torch::Tensor mlm, nsp;
  const auto in = c.packed ? packed_batch(mlm, nsp) : padded_batch(mlm, nsp);
  torch::manual_seed(1);
  bs::BertForPretraining padded(small_config(c.kernels, 0.0, "off"));
  torch::manual_seed(1);
  bs::BertForPretraining unpadded(small_config(c.kernels, 0.0, "on"));
  padded->to(c.dtype);
  unpadded->to(c.dtype);
  const auto want = loss_and_grads(padded, in, mlm, nsp), got = loss_and_grads(unpadded, in, mlm, nsp);
  EXPECT_NEAR(got.loss, want.loss, c.loss_tol);
  const auto names = padded->named_parameters().keys();
  for (std::size_t i = 0; i < want.grads.size(); ++i) {
    const double scale = want.grads[i].abs().max().item<double>() + 1e-12;
    const double err = (got.grads[i] - want.grads[i]).abs().max().item<double>();
    EXPECT_LE(err, c.grad_rtol * scale) << names[i] << ": max gradient difference " << err << " of max " << scale;
  }
}

INSTANTIATE_TEST_SUITE_P(KernelsDtypesLayouts, UnpaddedModel,
                         ::testing::Values(UnpadCase{"reference", torch::kDouble, false, 1e-12, 1e-10},
                                           UnpadCase{"reference", torch::kDouble, true, 1e-12, 1e-10},
                                           UnpadCase{"fused", torch::kDouble, false, 1e-12, 1e-10},
                                           UnpadCase{"fused", torch::kDouble, true, 1e-12, 1e-10},
                                           UnpadCase{"reference", torch::kFloat, false, 1e-5, 1e-4},
                                           UnpadCase{"fused", torch::kFloat, true, 1e-5, 1e-4},
                                           UnpadCase{"fused", torch::kBFloat16, false, 2e-2, 8e-2}),
                         [](const ::testing::TestParamInfo<UnpadCase>& info) {
                           return std::string(info.param.kernels) + "_" + c10::toString(info.param.dtype) +
                                  (info.param.packed ? "_packed" : "_padded");
                         });

// The padding tokens sit at a position no real token has, whose embedding is NaN: the padded model's loss is NaN
// (padding keys reach every score of their row before the mask is added), the unpadded model never computes a
// padding row and stays finite. (Not the word embedding: the tied MLM decoder reads every row of that.)
TEST(UnpaddedModel, PaddingNeverEntersTheComputation) {
  const int64_t poisoned = small_config("auto", 0).max_position - 1;
  for (const char* kernels : {"reference", "fused"}) {
    torch::Tensor mlm, nsp;
    auto in = padded_batch(mlm, nsp);  // real tokens at positions 0..12
    in.position_ids.masked_fill_(in.attention_ids.eq(0), poisoned);
    for (const char* unpad : {"off", "on"}) {
      torch::manual_seed(1);
      bs::BertForPretraining model(small_config(kernels, 0.0, unpad));
      {
        torch::NoGradGuard no_grad;
        model->embeddings->position_embeddings->weight[poisoned].fill_(std::numeric_limits<float>::quiet_NaN());
      }
      const auto r = loss_and_grads(model, in, mlm, nsp);
      SCOPED_TRACE(std::string(kernels) + ", unpad " + unpad);
      if (std::string(unpad) == "off") {
        EXPECT_TRUE(std::isnan(r.loss));
      } else {
        EXPECT_TRUE(std::isfinite(r.loss)) << r.loss;
        for (std::size_t i = 0; i < r.grads.size(); ++i)
          EXPECT_TRUE(torch::isfinite(r.grads[i]).all().item<bool>()) << "parameter " << i;
      }
    }
  }
}

TEST(UnpaddedModel, AutoIsOnOnTheCpuAndOffOnCuda) {
  EXPECT_TRUE(bs::use_unpadded(small_config("auto", 0.1, "auto"), torch::Device(torch::kCPU)));
  EXPECT_FALSE(bs::use_unpadded(small_config("auto", 0.1, "auto"), torch::Device(torch::kCUDA, 0)));
  EXPECT_TRUE(bs::use_unpadded(small_config("auto", 0.1, "on"), torch::Device(torch::kCUDA, 0)));
  EXPECT_FALSE(bs::use_unpadded(small_config("auto", 0.1, "off"), torch::Device(torch::kCPU)));
}

}  // namespace
