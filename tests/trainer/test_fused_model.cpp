// The BERT model with model.kernels: fused against the same weights on the reference path: same loss and
// gradients on the same batch (float32 tight, bf16 within bf16 tolerances), with padded rows in the batch;
// with dropout, the fused model's masks repeat exactly under the same generator state. model.unpad: the
// unpadded model (token-wise work on the real tokens only) against the padded one on the same weights, padded
// and packed batches, both kernel paths; padding never enters the unpadded computation.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <ostream>
#include <string>
#include <utility>
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
// rows (unpad_row_granule 2), the last a copy of the first; attention in two groups (13 and 9 as two rows of 13
// slots, 5 in a row of 8).
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
// 10 + 3 padding (the block-diagonal attention bias, with padding). Unpadded, attention runs in two groups:
// the 6 and the 5 as two rows of 8 slots, the 10 as one row of 13.
bs::BertInputs packed_batch(torch::Tensor& mlm_labels, torch::Tensor& nsp_labels) {
  torch::manual_seed(4);
  const int64_t B = 2, L = 13;
  bs::BertInputs in;
  in.input_ids = torch::randint(5, 101, {B, L}, torch::kLong);
  in.segment_ids = torch::zeros({B, L}, torch::kLong);
  in.position_ids = torch::zeros({B, L}, torch::kLong);
  in.attention_ids = torch::zeros({B, L}, torch::kLong);
  const std::vector<std::vector<int64_t>> seqs = {{6, 5}, {10}};
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

// ---------------------------------------------------------------------------------------------------------
// The unpadded attention layout on its own: every real token in exactly one slot, the tokens of a sequence
// left-aligned in order in one row of their group, the group at most one quantum longer than the sequence, the
// bias open exactly on the filled slots, and fewer score elements than the padded [B, L, L].
void check_layout(const bs::BertInputs& in) {
  const auto layout = bs::make_token_layout(in, true, torch::TensorOptions().dtype(torch::kFloat));
  ASSERT_TRUE(layout.unpadded());
  const int64_t L = in.input_ids.size(1), q = bs::attention_length_quantum(L), T = layout.real_tokens;
  const auto ids = in.attention_ids.reshape({-1});
  ASSERT_EQ(T, ids.ne(0).sum().item<int64_t>());
  const auto positions = layout.real_rows.narrow(0, 0, T), slots = layout.slot_of_row.narrow(0, 0, T);
  EXPECT_TRUE(torch::equal(positions, ids.ne(0).nonzero().squeeze(1)));
  EXPECT_EQ(std::get<0>(torch::_unique(slots)).numel(), T) << "two tokens share an attention slot";
  // The groups tile the slots, longest first.
  int64_t at = 0;
  for (std::size_t i = 0; i < layout.groups.size(); ++i) {
    const auto& g = layout.groups[i];
    EXPECT_EQ(g.first_slot, at);
    if (i > 0) {
      EXPECT_LT(g.length, layout.groups[i - 1].length);
    }
    at += g.sequences * g.length;
  }
  EXPECT_EQ(at, layout.slots);
  auto group_of = [&](int64_t slot) {
    for (const auto& g : layout.groups)
      if (slot < g.first_slot + g.sequences * g.length) return g;
    ADD_FAILURE() << "slot " << slot << " outside every group";
    return bs::AttentionGroup{};
  };
  // Each sequence (row, attention id): its k-th token at the k-th slot of one group row.
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> sequences;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = positions[t].item<int64_t>();
    sequences[{p / L, in.packed ? ids[p].item<int64_t>() : 1}].push_back(slots[t].item<int64_t>());
  }
  for (const auto& [key, seq] : sequences) {
    const auto g = group_of(seq[0]);
    const int64_t n = static_cast<int64_t>(seq.size());
    EXPECT_EQ((seq[0] - g.first_slot) % g.length, 0) << "sequence of row " << key.first << " not left-aligned";
    EXPECT_GE(g.length, n);
    EXPECT_TRUE(g.length % q == 0 || g.length == L) << "group length " << g.length;
    for (int64_t k = 0; k < n; ++k) EXPECT_EQ(seq[k], seq[0] + k);
  }
  EXPECT_EQ(layout.bias.numel(), layout.slots);
  EXPECT_EQ(layout.bias.eq(0).sum().item<int64_t>(), T);
  EXPECT_TRUE(layout.bias.index_select(0, slots).eq(0).all().item<bool>());
  EXPECT_LT(layout.attention_scores(), in.input_ids.size(0) * L * L);
  // Without the joins of small groups, every sequence is at most one quantum short of its group's length; the
  // joins add at most 1/8 of the padded score work.
  int64_t unjoined = 0;
  for (const auto& [key, seq] : sequences) {
    const int64_t n = static_cast<int64_t>(seq.size()), len = std::min(L, (n + q - 1) / q * q);
    unjoined += len * len;
  }
  EXPECT_LE(layout.attention_scores(), unjoined + in.input_ids.size(0) * L * L / 8);
}

TEST(TokenLayout, UnpaddedAttentionPutsEachSequenceInAGroupOfItsLength) {
  torch::Tensor mlm, nsp;
  const auto padded = padded_batch(mlm, nsp), packed = packed_batch(mlm, nsp);
  check_layout(padded);
  check_layout(packed);
  // The groups the comments of padded_batch() and packed_batch() describe.
  const auto a = bs::make_token_layout(padded, true, torch::kFloat),
             b = bs::make_token_layout(packed, true, torch::kFloat);
  ASSERT_EQ(a.groups.size(), 2u);
  EXPECT_EQ(a.groups[0].sequences, 2);
  EXPECT_EQ(a.groups[0].length, 13);
  EXPECT_EQ(a.groups[1].sequences, 1);
  EXPECT_EQ(a.groups[1].length, 8);
  ASSERT_EQ(b.groups.size(), 2u);
  EXPECT_EQ(b.groups[0].length, 13);
  EXPECT_EQ(b.groups[1].sequences, 2);
  EXPECT_EQ(b.groups[1].length, 8);
  // Random batches of 128-token rows: presorted-like lengths and packed rows of 1-5 segments.
  torch::manual_seed(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t B = 16, L = 128;
    bs::BertInputs in;
    in.input_ids = torch::zeros({B, L}, torch::kLong);
    in.attention_ids = torch::zeros({B, L}, torch::kLong);
    in.packed = trial % 2 == 1;
    for (int64_t b = 0; b < B; ++b) {
      int64_t at = 0, id = 1;
      const int64_t segments = in.packed ? torch::randint(1, 6, {1}).item<int64_t>() : 1;
      for (int64_t s = 0; s < segments && at < L; ++s) {
        const int64_t n = std::min(L - at, torch::randint(1, in.packed ? 60 : L + 1, {1}).item<int64_t>());
        in.attention_ids[b].narrow(0, at, n).fill_(id++);
        at += n;
      }
    }
    SCOPED_TRACE("random batch " + std::to_string(trial));
    check_layout(in);
  }
}

TEST(TokenLayout, AFullUnpackedBatchStaysPadded) {
  bs::BertInputs in;
  in.input_ids = torch::zeros({4, 16}, torch::kLong);
  in.attention_ids = torch::ones({4, 16}, torch::kLong);
  EXPECT_FALSE(bs::make_token_layout(in, true, torch::kFloat).unpadded());
  EXPECT_FALSE(bs::make_token_layout(in, false, torch::kFloat).unpadded());
}

}  // namespace
