#include "kernels/FusedOps.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <mutex>
#include <stdexcept>
#include <string>

#include "kernels/FusedOptimizer.h"
#include "kernels/Philox.h"
#include "kernels/RowKernels.h"

namespace bs::kernels {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Fixed row chunks: the partial sums of dgamma/dbeta/dbias are per chunk and added in chunk order, so the
// gradients do not depend on how at::parallel_for splits the work.
constexpr int64_t kRowChunk = 32;
int64_t chunk_count(int64_t rows) { return (rows + kRowChunk - 1) / kRowChunk; }

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("kernels: " + what);
}

void check_input(const Tensor& x, const char* op) {
  check(x.device().is_cpu(), std::string(op) + " runs on the CPU only (model.kernels: reference on a GPU)");
  const auto s = x.scalar_type();
  check(s == torch::kFloat || s == torch::kDouble || s == torch::kBFloat16,
        std::string(op) + ": float32, float64 or bfloat16 input, not " + std::string(c10::toString(s)));
  check(x.dim() >= 1 && x.size(-1) > 0, std::string(op) + ": input needs a non-empty last dimension");
}

// Parameters (gamma, beta, bias) in the kernels' arithmetic type: float, or double for double input.
torch::ScalarType acc_type(const Tensor& x) {
  return x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}
Tensor as_acc(const Tensor& p, const Tensor& x) { return p.defined() ? p.to(acc_type(x)).contiguous() : Tensor(); }
// The bias in the kernels' type, zeros when there is none (the row kernels take no null bias).
Tensor bias_or_zeros(const Tensor& bias, const Tensor& x) {
  return bias.defined() ? as_acc(bias, x) : torch::zeros({x.size(-1)}, x.options().dtype(acc_type(x)));
}

template <class F>
void for_chunks(int64_t rows, F&& f) {
  const int64_t chunks = chunk_count(rows);
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) f(c, c * kRowChunk, std::min(rows, (c + 1) * kRowChunk));
  });
}

// Calls f with the storage pointer type of x's dtype.
template <class F>
void with_dtype(torch::ScalarType s, F&& f) {
  if (s == torch::kFloat) return f(float{});
  if (s == torch::kDouble) return f(double{});
  return f(Bf16{});
}
template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? reinterpret_cast<T*>(t.data_ptr()) : nullptr;
}

uint64_t draw_key() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get<at::CPUGeneratorImpl>()->random64();
}

// Keep bits [rows, ceil(C/8)] for drop probability p.
Tensor keep_bits(int64_t rows, int64_t cols, double p) {
  RECORD_USER_SCOPE("bs::philox_keep_bits");
  auto bits = torch::empty({rows, keep_bytes_per_row(cols)}, torch::kUInt8);
  const uint64_t key = draw_key();
  const uint32_t threshold = dropout_threshold(p);
  auto* out = bits.data_ptr<uint8_t>();
  for_chunks(rows, [&](int64_t, int64_t r0, int64_t r1) { dropout_keep_bits(key, threshold, r0, r1, cols, out); });
  return bits;
}

// Sums chunk partials [chunks, C] in chunk order into [C] in `like`'s dtype: one pass, the same order on
// every thread count.
template <class A>
void add_partials(const A* partials, int64_t chunks, int64_t C, A* total) {
  for (int64_t j = 0; j < C; ++j) total[j] = partials[j];
  for (int64_t c = 1; c < chunks; ++c) {
    const A* row = partials + c * C;
    for (int64_t j = 0; j < C; ++j) total[j] += row[j];
  }
}
Tensor sum_partials(const Tensor& partials, const Tensor& like) {
  const int64_t chunks = partials.size(0), C = partials.size(1);
  Tensor total = torch::empty({C}, partials.options());
  if (partials.scalar_type() == torch::kDouble)
    add_partials(partials.data_ptr<double>(), chunks, C, total.data_ptr<double>());
  else
    add_partials(partials.data_ptr<float>(), chunks, C, total.data_ptr<float>());
  return total.to(like.scalar_type());
}

// ---------------------------------------------------------------------------------------------------------
struct BiasGelu : torch::autograd::Function<BiasGelu> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x_in, const Tensor& bias_or_x, bool has_bias) {
    RECORD_USER_SCOPE("bs::bias_gelu");
    const Tensor x = x_in.contiguous();
    const Tensor bias = has_bias ? bias_or_x : Tensor();
    const int64_t C = x.size(-1), rows = x.numel() / C;
    const Tensor b = bias_or_zeros(bias, x);
    Tensor y = torch::empty_like(x);
    with_dtype(x.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      for_chunks(rows, [&](int64_t, int64_t r0, int64_t r1) {
        bias_gelu_rows<T>(ptr<T>(x), ptr<Acc<T>>(b), ptr<T>(y), C, r0, r1);
      });
    });
    ctx->save_for_backward({x, bias});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    RECORD_USER_SCOPE("bs::bias_gelu_backward");
    const Tensor &x = saved[0], &bias = saved[1];
    const Tensor dy = grads[0].contiguous();
    const int64_t C = x.size(-1), rows = x.numel() / C;
    const Tensor b = bias_or_zeros(bias, x);
    Tensor dx = torch::empty_like(x);
    const int64_t chunks = chunk_count(rows);
    Tensor partial = torch::zeros({chunks, C}, x.options().dtype(acc_type(x)));  // dbias (unused without bias)
    with_dtype(x.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      for_chunks(rows, [&](int64_t c, int64_t r0, int64_t r1) {
        bias_gelu_grad_rows<T>(ptr<T>(dy), ptr<T>(x), ptr<Acc<T>>(b), ptr<T>(dx), ptr<Acc<T>>(partial) + c * C, C, r0,
                               r1);
      });
    });
    return {dx, bias.defined() ? sum_partials(partial, bias) : Tensor(), Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------------------
struct BiasDropoutAddLayerNorm : torch::autograd::Function<BiasDropoutAddLayerNorm> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x_in, const Tensor& bias_or_x, const Tensor& residual_or_x,
                        const Tensor& gamma, const Tensor& beta, double p, bool training, double eps, bool has_bias,
                        bool has_residual) {
    RECORD_USER_SCOPE("bs::bias_dropout_add_layer_norm");
    const Tensor x = x_in.contiguous();
    const Tensor bias = has_bias ? bias_or_x : Tensor();
    const Tensor residual = has_residual ? residual_or_x.contiguous() : Tensor();
    const int64_t C = x.size(-1), rows = x.numel() / C;
    check(gamma.numel() == C && beta.numel() == C, "layer norm: gamma and beta must have the input's last size");
    check(!residual.defined() || residual.sizes() == x.sizes(), "layer norm: residual must have the input's shape");
    check(!bias.defined() || bias.numel() == C, "layer norm: bias must have the input's last size");
    const bool drop = training && p > 0;
    const Tensor bits = drop ? keep_bits(rows, C, p) : Tensor();
    const Tensor b = bias_or_zeros(bias, x), g = as_acc(gamma, x), be = as_acc(beta, x);
    Tensor sum = torch::empty_like(x), y = torch::empty_like(x);
    Tensor mean = torch::empty({rows}, x.options().dtype(acc_type(x))), rstd = torch::empty_like(mean);
    with_dtype(x.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      LnArgs<T> a;
      a.x = ptr<T>(x);
      a.bias = ptr<Acc<T>>(b);
      a.residual = ptr<T>(residual);
      a.gamma = ptr<Acc<T>>(g);
      a.beta = ptr<Acc<T>>(be);
      a.keep_bits = drop ? bits.data_ptr<uint8_t>() : nullptr;
      a.keep_scale = static_cast<Acc<T>>(drop ? 1.0 / (1.0 - p) : 1.0);
      a.eps = static_cast<Acc<T>>(eps);
      a.cols = C;
      a.sum = ptr<T>(sum);
      a.y = ptr<T>(y);
      a.mean = ptr<Acc<T>>(mean);
      a.rstd = ptr<Acc<T>>(rstd);
      for_chunks(rows, [&](int64_t, int64_t r0, int64_t r1) { layer_norm_rows<T>(a, r0, r1); });
    });
    ctx->save_for_backward({sum, mean, rstd, gamma, bits});
    ctx->saved_data["p"] = drop ? p : 0.0;
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["has_residual"] = residual.defined();
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    RECORD_USER_SCOPE("bs::bias_dropout_add_layer_norm_backward");
    const Tensor &sum = saved[0], &mean = saved[1], &rstd = saved[2], &gamma = saved[3], &bits = saved[4];
    const double p = ctx->saved_data["p"].toDouble();
    const bool has_bias = ctx->saved_data["has_bias"].toBool(), has_res = ctx->saved_data["has_residual"].toBool();
    const Tensor dy = grads[0].contiguous();
    const int64_t C = sum.size(-1), rows = sum.numel() / C;
    const int64_t chunks = chunk_count(rows);
    const Tensor g = as_acc(gamma, sum);
    const auto acc_opts = sum.options().dtype(acc_type(sum));
    Tensor dgamma = torch::zeros({chunks, C}, acc_opts), dbeta = torch::zeros({chunks, C}, acc_opts);
    Tensor dbias = torch::zeros({chunks, C}, acc_opts);  // unused without a bias
    Tensor dx = torch::empty_like(sum);
    // Without dropout d(residual) == d(x): one tensor serves both.
    Tensor dres = has_res && p > 0 ? torch::empty_like(sum) : Tensor();
    with_dtype(sum.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      LnGradArgs<T> a;
      a.dy = ptr<T>(dy);
      a.sum = ptr<T>(sum);
      a.mean = ptr<Acc<T>>(mean);
      a.rstd = ptr<Acc<T>>(rstd);
      a.gamma = ptr<Acc<T>>(g);
      a.keep_bits = p > 0 ? bits.data_ptr<uint8_t>() : nullptr;
      a.keep_scale = static_cast<Acc<T>>(p > 0 ? 1.0 / (1.0 - p) : 1.0);
      a.cols = C;
      a.d_residual = ptr<T>(dres);
      a.dx = ptr<T>(dx);
      for_chunks(rows, [&](int64_t c, int64_t r0, int64_t r1) {
        LnGradArgs<T> own = a;
        own.dgamma = ptr<Acc<T>>(dgamma) + c * C;
        own.dbeta = ptr<Acc<T>>(dbeta) + c * C;
        own.dbias = ptr<Acc<T>>(dbias) + c * C;
        layer_norm_grad_rows<T>(own, r0, r1);
      });
    });
    Tensor d_residual = has_res ? (p > 0 ? dres : dx) : Tensor();
    return {dx,
            has_bias ? sum_partials(dbias, gamma) : Tensor(),
            d_residual,
            sum_partials(dgamma, gamma),
            sum_partials(dbeta, gamma),
            Tensor(),
            Tensor(),
            Tensor(),
            Tensor(),
            Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------------------
struct PhiloxDropout : torch::autograd::Function<PhiloxDropout> {
  static void apply_bits(const Tensor& x, const Tensor& bits, double scale, Tensor& y) {
    RECORD_USER_SCOPE("bs::dropout_apply_bits");
    const int64_t C = x.size(-1), rows = x.numel() / C;
    with_dtype(x.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      for_chunks(rows, [&](int64_t, int64_t r0, int64_t r1) {
        masked_scale_rows<T>(ptr<T>(x), bits.data_ptr<uint8_t>(), static_cast<Acc<T>>(scale), ptr<T>(y), C, r0, r1);
      });
    });
  }
  static Tensor forward(AutogradContext* ctx, const Tensor& x_in, double p) {
    const Tensor x = x_in.contiguous();
    const int64_t C = x.size(-1), rows = x.numel() / C;
    Tensor bits = keep_bits(rows, C, p), y = torch::empty_like(x);
    apply_bits(x, bits, 1.0 / (1.0 - p), y);
    ctx->save_for_backward({bits});
    ctx->saved_data["p"] = p;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Tensor bits = ctx->get_saved_variables()[0];
    const Tensor dy = grads[0].contiguous();
    Tensor dx = torch::empty_like(dy);
    apply_bits(dy, bits, 1.0 / (1.0 - ctx->saved_data["p"].toDouble()), dx);
    return {dx, Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------------------
struct SoftmaxDropout : torch::autograd::Function<SoftmaxDropout> {
  static Tensor forward(AutogradContext* ctx, const Tensor& scores_in, const Tensor& key_bias_in, double p,
                        bool training) {
    RECORD_USER_SCOPE("bs::softmax_dropout");
    const Tensor scores = scores_in.contiguous();
    const int64_t C = scores.size(-1), rows = scores.numel() / C, seqs = key_bias_in.size(0);
    check(key_bias_in.dim() == 2 && key_bias_in.size(1) == C && rows % seqs == 0,
          "softmax_dropout: key_bias must be [sequences, keys] with keys = the scores' last size");
    const Tensor kb = as_acc(key_bias_in, scores);
    const bool drop = training && p > 0;
    const Tensor bits = drop ? keep_bits(rows, C, p) : Tensor();
    Tensor y = torch::empty_like(scores), probs = drop ? torch::empty_like(scores) : y;
    with_dtype(scores.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      SoftmaxArgs<T> a;
      a.scores = ptr<T>(scores);
      a.key_bias = ptr<Acc<T>>(kb);
      a.rows_per_bias = rows / seqs;
      a.keep_bits = drop ? bits.data_ptr<uint8_t>() : nullptr;
      a.keep_scale = static_cast<Acc<T>>(drop ? 1.0 / (1.0 - p) : 1.0);
      a.cols = C;
      a.y = ptr<T>(y);
      a.probs = ptr<T>(probs);
      for_chunks(rows, [&](int64_t, int64_t r0, int64_t r1) { softmax_dropout_rows<T>(a, r0, r1); });
    });
    ctx->save_for_backward({y, bits});
    ctx->saved_data["p"] = drop ? p : 0.0;
    return probs;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_USER_SCOPE("bs::softmax_dropout_backward");
    const auto saved = ctx->get_saved_variables();
    const Tensor &y = saved[0], &bits = saved[1];
    const double p = ctx->saved_data["p"].toDouble();
    const Tensor dp = grads[0].contiguous();
    const int64_t C = y.size(-1), rows = y.numel() / C;
    Tensor ds = torch::empty_like(y);
    with_dtype(y.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      const uint8_t* b = p > 0 ? bits.data_ptr<uint8_t>() : nullptr;
      const auto scale = static_cast<Acc<T>>(p > 0 ? 1.0 / (1.0 - p) : 1.0);
      for_chunks(rows, [&](int64_t, int64_t r0, int64_t r1) {
        softmax_dropout_grad_rows<T>(ptr<T>(dp), ptr<T>(y), b, scale, C, ptr<T>(ds), r0, r1);
      });
    });
    return {ds, Tensor(), Tensor(), Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------------------
struct CrossEntropy : torch::autograd::Function<CrossEntropy> {
  static Tensor forward(AutogradContext* ctx, const Tensor& logits_in, const Tensor& labels_in) {
    RECORD_USER_SCOPE("bs::cross_entropy");
    const Tensor logits = logits_in.contiguous(), labels = labels_in.to(torch::kLong).contiguous();
    const int64_t rows = logits.size(0), C = logits.size(1);
    Tensor loss = torch::empty({rows}, logits.options().dtype(acc_type(logits))), lse = torch::empty_like(loss);
    with_dtype(logits.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      for_chunks(rows, [&](int64_t, int64_t r0, int64_t r1) {
        cross_entropy_rows<T>(ptr<T>(logits), labels.data_ptr<int64_t>(), C, ptr<Acc<T>>(loss), ptr<Acc<T>>(lse), r0,
                              r1);
      });
    });
    ctx->save_for_backward({logits, labels, lse});
    return loss.sum() / static_cast<double>(rows);  // summed in a fixed order by one thread (rows is small)
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_USER_SCOPE("bs::cross_entropy_backward");
    const auto saved = ctx->get_saved_variables();
    const Tensor &logits = saved[0], &labels = saved[1], &lse = saved[2];
    const int64_t rows = logits.size(0), C = logits.size(1);
    const double g = grads[0].item<double>() / static_cast<double>(rows);
    Tensor d = torch::empty_like(logits);
    with_dtype(logits.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      for_chunks(rows, [&](int64_t, int64_t r0, int64_t r1) {
        cross_entropy_grad_rows<T>(ptr<T>(logits), labels.data_ptr<int64_t>(), ptr<Acc<T>>(lse), static_cast<Acc<T>>(g),
                                   C, ptr<T>(d), r0, r1);
      });
    });
    return {d, Tensor()};
  }
};

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  check_input(logits, "cross_entropy");
  check(logits.dim() == 2 && logits.size(0) > 0, "cross_entropy: logits must be [rows > 0, classes]");
  check(labels.dim() == 1 && labels.size(0) == logits.size(0), "cross_entropy: one label per row of the logits");
  if (labels.numel() > 0) {
    const auto lo = labels.min().item<int64_t>(), hi = labels.max().item<int64_t>();
    check(lo >= 0 && hi < logits.size(1), "cross_entropy: labels must be class indices in [0, " +
                                              std::to_string(logits.size(1)) + "), got [" + std::to_string(lo) + ", " +
                                              std::to_string(hi) + "]");
  }
  return CrossEntropy::apply(logits, labels);
}

Tensor softmax_dropout(const Tensor& scores, const Tensor& key_bias, double p, bool training) {
  check_input(scores, "softmax_dropout");
  check(p >= 0 && p < 1, "dropout probability must be in [0, 1)");
  return SoftmaxDropout::apply(scores, key_bias.detach(), p, training);
}

Tensor bias_gelu(const Tensor& x, const Tensor& bias) {
  check_input(x, "bias_gelu");
  check(!bias.defined() || bias.numel() == x.size(-1), "bias_gelu: bias must have the input's last size");
  // LibTorch 1.13's Function::apply cannot take an undefined tensor: x stands in, and a flag says so.
  return BiasGelu::apply(x, bias.defined() ? bias : x, bias.defined());
}

Tensor bias_dropout_add_layer_norm(const Tensor& x, const Tensor& bias, const Tensor& residual, const Tensor& gamma,
                                   const Tensor& beta, double p, bool training, double eps) {
  check_input(x, "bias_dropout_add_layer_norm");
  check(p >= 0 && p < 1, "dropout probability must be in [0, 1)");
  return BiasDropoutAddLayerNorm::apply(x, bias.defined() ? bias : x, residual.defined() ? residual : x, gamma, beta, p,
                                        training, eps, bias.defined(), residual.defined());
}

Tensor dropout(const Tensor& x, double p, bool training) {
  check(p >= 0 && p < 1, "dropout probability must be in [0, 1)");
  if (!training || p == 0 || x.numel() == 0) return x;
  check_input(x, "dropout");
  return PhiloxDropout::apply(x, p);
}

void adam_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepArgs& s) {
  RECORD_USER_SCOPE("bs::fused_adam");
  AdamRowArgs a;
  a.decay_mult = static_cast<float>(s.decoupled ? 1.0 - s.lr * s.weight_decay : 1.0);
  a.l2 = static_cast<float>(s.decoupled ? 0.0 : s.weight_decay);
  a.b1 = static_cast<float>(s.beta1);
  a.b2 = static_cast<float>(s.beta2);
  a.eps = static_cast<float>(s.eps);
  a.step_size = static_cast<float>(s.step_size);
  a.inv_sqrt_bc2 = static_cast<float>(1.0 / s.sqrt_bc2);
  constexpr int64_t kChunk = 1 << 14;  // elements: element-wise, so any split gives the same result
  at::parallel_for(0, (n + kChunk - 1) / kChunk, 1,
                   [&](int64_t c0, int64_t c1) { adam_rows(p, g, m, v, a, c0 * kChunk, std::min(n, c1 * kChunk)); });
}

const char* kernel_isa() { return isa_name(active_isa()); }

bool fused_available() {
#if defined(__x86_64__) && defined(__GNUC__)
  return true;
#else
  return false;
#endif
}

}  // namespace bs::kernels
