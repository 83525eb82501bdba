// The fused CPU kernels against the operator-by-operator reference: Philox's published test vectors, the
// dropout mask's rate and reproducibility, and forward and backward of each fused op on every ISA variant this
// CPU runs: float64 against central finite differences, float32 against LibTorch's own operators, bf16 within
// bf16 tolerances. Sizes are odd on purpose (not multiples of 8 or 16 lanes).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "kernels/FusedOps.h"
#include "kernels/Philox.h"
#include "kernels/FusedOptimizer.h"
#include "kernels/RowKernels.h"

namespace {

namespace k = bs::kernels;
using torch::Tensor;

std::vector<k::Isa> runnable_isas() {
  std::vector<k::Isa> out = {k::Isa::kScalar};
  if (k::best_isa() != k::Isa::kScalar) out.push_back(k::Isa::kAvx2);
  if (k::best_isa() == k::Isa::kAvx512) out.push_back(k::Isa::kAvx512);
  return out;
}

struct IsaGuard {
  explicit IsaGuard(k::Isa isa) { k::force_isa(isa); }
  ~IsaGuard() { k::force_isa(k::best_isa()); }
};

// Random123's known-answer vectors for philox4x32 with 10 rounds.
TEST(Philox, KnownAnswerVectors) {
  EXPECT_EQ(k::philox4x32_10({0, 0, 0, 0}, 0, 0), (k::PhiloxWords{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(k::philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, 0xffffffff, 0xffffffff),
            (k::PhiloxWords{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(k::philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0xa4093822, 0x299f31d0),
            (k::PhiloxWords{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// The vectorised generator against the scalar philox4x32_10, element by element: odd widths (blocks that
// straddle rows), a chunk starting mid-tensor, a key with both halves set, on every ISA variant.
TEST(PhiloxDropout, KeepBitsEqualTheScalarGeneratorOnEveryIsa) {
  const uint64_t key = 0x0123456789abcdefull;
  const uint32_t threshold = k::dropout_threshold(0.3);
  for (const int64_t cols : {1, 7, 37, 128, 333}) {
    const int64_t rows = 41, row_bytes = k::keep_bytes_per_row(cols);
    for (const auto isa : runnable_isas()) {
      IsaGuard guard(isa);
      std::vector<uint8_t> bits(rows * row_bytes, 0xAA);
      k::dropout_keep_bits(key, threshold, 0, 5, cols, bits.data());
      k::dropout_keep_bits(key, threshold, 5, rows, cols, bits.data());  // a second chunk
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const uint64_t e = static_cast<uint64_t>(r * cols + c), block = e >> 2;
          const auto w = k::philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0, 0},
                                          static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
          const bool keep = w[e & 3] >= threshold;
          ASSERT_EQ(((bits[r * row_bytes + (c >> 3)] >> (c & 7)) & 1) != 0, keep)
              << k::isa_name(isa) << " cols " << cols << " row " << r << " col " << c;
        }
    }
  }
}

TEST(PhiloxDropout, RateAndScaleAndSameMaskForTheSameGeneratorState) {
  const auto x = torch::ones({301, 37});
  torch::manual_seed(5);
  const auto a = k::dropout(x, 0.1, true);
  torch::manual_seed(5);
  const auto b = k::dropout(x, 0.1, true);
  EXPECT_TRUE(torch::equal(a, b));
  const auto c = k::dropout(x, 0.1, true);  // the next key: another mask
  EXPECT_FALSE(torch::equal(a, c));
  const double kept = (a != 0).to(torch::kDouble).mean().item<double>();
  EXPECT_NEAR(kept, 0.9, 0.01);  // 11,137 draws: 5 sigma is 0.0045
  EXPECT_TRUE(torch::allclose(a.masked_select(a != 0), torch::full({1}, 1.0 / 0.9)));
  EXPECT_TRUE(torch::equal(k::dropout(x, 0.1, false), x));
}

TEST(PhiloxDropout, MaskDoesNotDependOnThreadCount) {
  const auto x = torch::randn({257, 129});
  const int threads = torch::get_num_threads();
  torch::set_num_threads(1);
  torch::manual_seed(11);
  const auto one = k::dropout(x, 0.3, true);
  torch::set_num_threads(2);
  torch::manual_seed(11);
  const auto two = k::dropout(x, 0.3, true);
  torch::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, two));
}

// Central differences of sum(f(inputs) * w) in float64 against autograd.
void expect_gradients_match_finite_differences(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                               std::vector<Tensor> inputs, const std::string& what) {
  for (auto& t : inputs) t = t.to(torch::kDouble).detach().requires_grad_(true);
  const auto w = torch::randn_like(f(inputs).detach());
  auto loss = (f(inputs) * w).sum();
  const auto grads = torch::autograd::grad({loss}, inputs);
  torch::NoGradGuard no_grad;
  const double h = 1e-6;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    auto flat = inputs[i].view({-1});
    auto g = grads[i].view({-1});
    for (int64_t e = 0; e < flat.numel(); ++e) {
      const double v = flat[e].item<double>();
      flat[e] = v + h;
      const double up = (f(inputs) * w).sum().item<double>();
      flat[e] = v - h;
      const double down = (f(inputs) * w).sum().item<double>();
      flat[e] = v;
      const double numeric = (up - down) / (2 * h);
      ASSERT_NEAR(g[e].item<double>(), numeric, 1e-6 + 1e-5 * std::abs(numeric))
          << what << ": input " << i << " element " << e;
    }
  }
}

TEST(FusedOps, BiasGeluGradientsMatchFiniteDifferencesInFloat64) {
  torch::manual_seed(1);
  for (auto isa : runnable_isas()) {
    IsaGuard guard(isa);
    expect_gradients_match_finite_differences([](const std::vector<Tensor>& in) { return k::bias_gelu(in[0], in[1]); },
                                              {torch::randn({5, 19}) * 2, torch::randn({19})},
                                              std::string("bias_gelu ") + k::isa_name(isa));
    expect_gradients_match_finite_differences([](const std::vector<Tensor>& in) { return k::bias_gelu(in[0], {}); },
                                              {torch::randn({3, 7})}, "gelu without bias");
  }
}

TEST(FusedOps, LayerNormGradientsMatchFiniteDifferencesInFloat64WithAndWithoutDropout) {
  torch::manual_seed(2);
  for (double p : {0.0, 0.25}) {
    // The same generator state before every call: the same mask for each finite difference.
    auto f = [p](const std::vector<Tensor>& in) {
      torch::manual_seed(99);
      return k::bias_dropout_add_layer_norm(in[0], in[1], in[2], in[3], in[4], p, true, 1e-12);
    };
    expect_gradients_match_finite_differences(
        f, {torch::randn({6, 21}), torch::randn({21}), torch::randn({6, 21}), torch::randn({21}), torch::randn({21})},
        "layer norm p=" + std::to_string(p));
  }
  expect_gradients_match_finite_differences(
      [](const std::vector<Tensor>& in) {
        return k::bias_dropout_add_layer_norm(in[0], {}, {}, in[1], in[2], 0, false, 1e-12);
      },
      {torch::randn({4, 9}), torch::randn({9}), torch::randn({9})}, "plain layer norm");
}

// Forward and every gradient of the fused op against the reference built from LibTorch's operators.
void expect_close(const std::vector<Tensor>& got, const std::vector<Tensor>& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto g = got[i].to(torch::kDouble), w = want[i].to(torch::kDouble);
    const double err = ((g - w).abs() - rtol * w.abs()).max().item<double>();
    EXPECT_LE(err, atol) << what << ": output/gradient " << i << " max |got - want| "
                         << (g - w).abs().max().item<double>();
  }
}

std::vector<Tensor> run_with_grads(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                   const std::vector<Tensor>& inputs, const Tensor& dy) {
  std::vector<Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().requires_grad_(true));
  auto y = f(leaves);
  y.backward(dy.to(y.scalar_type()));
  std::vector<Tensor> out = {y.detach()};
  for (auto& l : leaves) out.push_back(l.grad());
  return out;
}

TEST(FusedOps, BiasGeluMatchesLibTorchInFloat32AndBf16OnEveryIsa) {
  torch::manual_seed(3);
  for (auto shape : {std::vector<int64_t>{37, 131}, std::vector<int64_t>{2, 3, 1025}}) {
    const auto x = torch::randn(shape) * 3, b = torch::randn({shape.back()}), dy = torch::randn(shape);
    auto reference = [](const std::vector<Tensor>& in) { return torch::gelu(in[0] + in[1]); };
    const auto want = run_with_grads(reference, {x, b}, dy);
    for (auto isa : runnable_isas()) {
      IsaGuard guard(isa);
      auto fused = [](const std::vector<Tensor>& in) { return k::bias_gelu(in[0], in[1]); };
      expect_close(run_with_grads(fused, {x, b}, dy), want, 1e-5, 1e-5, std::string("fp32 ") + k::isa_name(isa));
      // bf16 in and out: one bf16 rounding of the result (2^-8 relative), the bias gradient summed in float.
      const auto bx = x.to(torch::kBFloat16), bb = b.to(torch::kBFloat16);
      const auto want16 = run_with_grads(reference, {bx.to(torch::kFloat), bb.to(torch::kFloat)},
                                         dy.to(torch::kBFloat16).to(torch::kFloat));
      const auto got16 = run_with_grads(fused, {bx, bb}, dy);
      expect_close({got16[0], got16[1]}, {want16[0], want16[1]}, 8e-3, 1e-3, std::string("bf16 ") + k::isa_name(isa));
      expect_close({got16[2]}, {want16[2]}, 2e-2, 0.05 * std::sqrt(double(x.numel() / shape.back())),
                   std::string("bf16 dbias ") + k::isa_name(isa));
    }
  }
}

// LayerNorm(dropout(x + b) + residual) from LibTorch's operators, the dropout mask taken from kernels::dropout
// of ones under the same generator state (the same key, so the same bits).
Tensor reference_ln(const std::vector<Tensor>& in, double p, uint64_t seed) {
  Tensor h = in[0] + in[1];
  if (p > 0) {
    torch::manual_seed(seed);
    const auto mask =
        k::dropout(torch::ones(h.sizes(), h.options().dtype(torch::kFloat).requires_grad(false)), p, true);
    h = h * mask.to(h.scalar_type());
  }
  return torch::layer_norm(h + in[2], {h.size(-1)}, in[3], in[4], 1e-12);
}

TEST(FusedOps, ResidualDropoutLayerNormMatchesLibTorchInFloat32AndBf16OnEveryIsa) {
  torch::manual_seed(4);
  for (double p : {0.0, 0.1}) {
    for (auto shape : {std::vector<int64_t>{67, 257}, std::vector<int64_t>{3, 5, 19}}) {
      const int64_t C = shape.back();
      std::vector<Tensor> in = {torch::randn(shape), torch::randn({C}) * 0.1, torch::randn(shape),
                                1 + 0.1 * torch::randn({C}), 0.1 * torch::randn({C})};
      const auto dy = torch::randn(shape);
      const auto want = run_with_grads([p](const std::vector<Tensor>& t) { return reference_ln(t, p, 7); }, in, dy);
      for (auto isa : runnable_isas()) {
        IsaGuard guard(isa);
        auto fused = [p](const std::vector<Tensor>& t) {
          torch::manual_seed(7);
          return k::bias_dropout_add_layer_norm(t[0], t[1], t[2], t[3], t[4], p, true, 1e-12);
        };
        const std::string what = std::string(k::isa_name(isa)) + " p=" + std::to_string(p) + " C=" + std::to_string(C);
        expect_close(run_with_grads(fused, in, dy), want, 1e-4, 1e-4, "fp32 " + what);
        std::vector<Tensor> in16;
        for (const auto& t : in) in16.push_back(t.to(torch::kBFloat16));
        std::vector<Tensor> in16f;
        for (const auto& t : in16) in16f.push_back(t.to(torch::kFloat));
        const auto want16 = run_with_grads([p](const std::vector<Tensor>& t) { return reference_ln(t, p, 7); }, in16f,
                                           dy.to(torch::kBFloat16).to(torch::kFloat));
        const auto got16 = run_with_grads(fused, in16, dy);
        // The fused op rounds the residual sum to bf16 before the statistics (as the reference model's bf16
        // add does): ~2^-8 relative on each element, ~1e-2 on the normalised output.
        expect_close({got16[0], got16[1], got16[3]}, {want16[0], want16[1], want16[3]}, 2e-2, 3e-2, "bf16 " + what);
        const double rows = static_cast<double>(in[0].numel() / C);
        expect_close({got16[2], got16[4], got16[5]}, {want16[2], want16[4], want16[5]}, 3e-2, 0.03 * std::sqrt(rows),
                     "bf16 param grads " + what);
      }
    }
  }
}

// A [B, 1, 1, L] padding mask as the model builds it: 0 for real keys, -1e4 for padded ones (the last `pad`
// keys of every other sequence), given to the fused op as [B, L].
Tensor key_mask(int64_t B, int64_t L, int64_t pad) {
  auto kb = torch::zeros({B, L});
  for (int64_t b = 1; b < B; b += 2) kb[b].slice(0, L - pad).fill_(-1e4);
  return kb;
}

TEST(FusedOps, SoftmaxDropoutGradientsMatchFiniteDifferencesInFloat64WithAndWithoutDropout) {
  torch::manual_seed(6);
  const auto kb = key_mask(2, 11, 3).to(torch::kDouble);
  for (double p : {0.0, 0.3}) {
    auto f = [p, kb](const std::vector<Tensor>& in) {
      torch::manual_seed(77);  // the same mask for every finite difference
      return k::softmax_dropout(in[0], kb, p, true);
    };
    expect_gradients_match_finite_differences(f, {torch::randn({2, 3, 5, 11})}, "softmax p=" + std::to_string(p));
  }
}

// softmax(scores + mask) from LibTorch, then the same Philox mask as kernels::dropout under the same seed.
Tensor reference_softmax_dropout(const Tensor& scores, const Tensor& kb, double p, uint64_t seed) {
  const int64_t B = kb.size(0), L = kb.size(1);
  auto y = torch::softmax(scores.to(torch::kFloat) + kb.view({B, 1, 1, L}), -1);
  if (p == 0) return y;
  torch::manual_seed(seed);
  return y * k::dropout(torch::ones_like(y), p, true);
}

TEST(FusedOps, SoftmaxDropoutMatchesLibTorchInFloat32AndBf16WithPaddingOnEveryIsa) {
  torch::manual_seed(8);
  for (double p : {0.0, 0.1}) {
    for (auto shape : {std::vector<int64_t>{4, 3, 7, 37}, std::vector<int64_t>{2, 2, 129, 129}}) {
      const int64_t B = shape[0], L = shape.back();
      const auto kb = key_mask(B, L, L / 3);
      const auto scores = torch::randn(shape) * 2, dy = torch::randn(shape);
      auto reference = [&](const std::vector<Tensor>& in) { return reference_softmax_dropout(in[0], kb, p, 21); };
      auto fused = [&](const std::vector<Tensor>& in) {
        torch::manual_seed(21);
        return k::softmax_dropout(in[0], kb, p, true);
      };
      const auto want = run_with_grads(reference, {scores}, dy);
      const auto want16 = run_with_grads(reference, {scores.to(torch::kBFloat16).to(torch::kFloat)},
                                         dy.to(torch::kBFloat16).to(torch::kFloat));
      for (auto isa : runnable_isas()) {
        IsaGuard guard(isa);
        const std::string what = "p=" + std::to_string(p) + " L=" + std::to_string(L) + " " + k::isa_name(isa);
        const auto got = run_with_grads(fused, {scores}, dy);
        expect_close(got, want, 1e-5, 1e-6, "fp32 " + what);
        // A padded key gets exactly nothing.
        EXPECT_EQ(
            got[0].index({1, torch::indexing::Slice(), torch::indexing::Slice(), L - 1}).abs().max().item<float>(),
            0.0f);
        // bf16: the softmax and the result each rounded once (2^-8 relative); the gradient from the bf16 softmax.
        const auto got16 = run_with_grads(fused, {scores.to(torch::kBFloat16)}, dy);
        expect_close({got16[0]}, {want16[0]}, 1e-2, 1e-3, "bf16 " + what);
        expect_close({got16[1]}, {want16[1]}, 2e-2, 2e-3, "bf16 grad " + what);
      }
    }
  }
}

TEST(FusedOps, CrossEntropyGradientsMatchFiniteDifferencesInFloat64) {
  torch::manual_seed(9);
  const auto labels = torch::tensor({3, 0, 6, 6, 1}, torch::kLong);
  expect_gradients_match_finite_differences(
      [labels](const std::vector<Tensor>& in) { return k::cross_entropy(in[0], labels); }, {torch::randn({5, 7}) * 2},
      "cross entropy");
}

TEST(FusedOps, CrossEntropyMatchesLibTorchInFloat32AndBf16OnEveryIsa) {
  torch::manual_seed(10);
  for (auto shape : {std::vector<int64_t>{37, 1031}, std::vector<int64_t>{3, 2}}) {
    const auto logits = torch::randn(shape) * 4;
    const auto labels = torch::randint(shape[1], {shape[0]}, torch::kLong);
    auto reference = [&](const std::vector<Tensor>& in) {
      return torch::nll_loss(torch::log_softmax(in[0].to(torch::kFloat), -1), labels);
    };
    auto fused = [&](const std::vector<Tensor>& in) { return k::cross_entropy(in[0], labels); };
    const auto want = run_with_grads(reference, {logits}, torch::ones({}));
    const auto want16 = run_with_grads(reference, {logits.to(torch::kBFloat16)}, torch::ones({}));
    for (auto isa : runnable_isas()) {
      IsaGuard guard(isa);
      const std::string what = "classes " + std::to_string(shape[1]) + " " + k::isa_name(isa);
      expect_close(run_with_grads(fused, {logits}, torch::ones({})), want, 1e-5, 1e-7, "fp32 " + what);
      // bf16 logits: the loss in float from the same bf16 values; the gradient rounded once to bf16.
      const auto got16 = run_with_grads(fused, {logits.to(torch::kBFloat16)}, torch::ones({}));
      EXPECT_EQ(got16[0].scalar_type(), torch::kFloat);
      expect_close(got16, want16, 1e-2, 1e-6, "bf16 " + what);
    }
  }
}

TEST(FusedOps, CrossEntropyRefusesLabelsOutsideTheClasses) {
  const auto logits = torch::randn({2, 5});
  try {
    k::cross_entropy(logits, torch::tensor({1, 5}, torch::kLong));
    FAIL() << "a label of 5 with 5 classes was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[0, 5)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(k::cross_entropy(logits, torch::tensor({-1, 0}, torch::kLong)), std::invalid_argument);
}

// The one-pass Adam update against the same rule in float64 from LibTorch ops, AdamW and L2, on a length that
// is no multiple of the vector width or of the thread chunk, on every ISA.
TEST(FusedAdam, OnePassUpdateMatchesTheRuleInFloat64OnEveryIsa) {
  torch::manual_seed(12);
  const int64_t n = (1 << 14) * 2 + 37;
  const auto p0 = torch::randn({n}), g = torch::randn({n}), m0 = torch::randn({n}) * 0.1, v0 = torch::rand({n}) * 0.01;
  for (const bool decoupled : {true, false}) {
    k::AdamStepArgs a;
    a.lr = 0.01;
    a.beta1 = 0.9;
    a.beta2 = 0.98;
    a.eps = 1e-6;
    a.weight_decay = 0.1;
    a.step_size = -a.lr / (1 - std::pow(0.9, 3));
    a.sqrt_bc2 = std::sqrt(1 - std::pow(0.98, 3));
    a.decoupled = decoupled;
    auto p = p0.to(torch::kDouble), gd = g.to(torch::kDouble);
    if (decoupled) p = p * (1 - a.lr * a.weight_decay);
    else
      gd = gd + a.weight_decay * p0.to(torch::kDouble);
    const auto m = 0.9 * m0.to(torch::kDouble) + 0.1 * gd, v = 0.98 * v0.to(torch::kDouble) + 0.02 * gd * gd;
    const auto want = p + a.step_size * m / (v.sqrt() / a.sqrt_bc2 + a.eps);
    for (auto isa : runnable_isas()) {
      IsaGuard guard(isa);
      auto pf = p0.clone(), mf = m0.clone(), vf = v0.clone();
      k::adam_step(pf.data_ptr<float>(), g.data_ptr<float>(), mf.data_ptr<float>(), vf.data_ptr<float>(), n, a);
      const std::string what = std::string(decoupled ? "adamw " : "adam l2 ") + k::isa_name(isa);
      // float arithmetic and float coefficients (1 - 0.98f is 2e-8 off): a few float ulps of the terms
      // (|p| < 5, |m| < 0.6, v < 0.4 here).
      auto err = [](const Tensor& got, const Tensor& ref) {
        return (got.to(torch::kDouble) - ref).abs().max().item<double>();
      };
      EXPECT_LT(err(pf, want), 4e-6) << what;
      EXPECT_LT(err(mf, m), 3e-7) << what;
      EXPECT_LT(err(vf, v), 1e-6) << what;
    }
  }
}

TEST(FusedOps, ForcingAnIsaTheCpuLacksIsRefused) {
  if (k::best_isa() == k::Isa::kAvx512) GTEST_SKIP() << "this CPU runs every variant";
  EXPECT_THROW(k::force_isa(k::Isa::kAvx512), std::invalid_argument);
}

TEST(FusedOps, BadInputsAreRefusedNamingTheOp) {
  try {
    k::bias_gelu(torch::randn({2, 3}).to(torch::kInt), {});
    FAIL() << "int input accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("bias_gelu"), std::string::npos) << e.what();
  }
  EXPECT_THROW(k::bias_dropout_add_layer_norm(torch::randn({2, 3}), {}, {}, torch::ones({4}), torch::zeros({4}), 0,
                                              false, 1e-12),
               std::invalid_argument);
  EXPECT_THROW(k::dropout(torch::randn({2, 3}), 1.0, true), std::invalid_argument);
}

}  // namespace
