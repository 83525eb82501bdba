// Internal to kernels/: the row kernels behind FusedOps, on raw pointers. Each is compiled for AVX-512
// (x86-64-v4), AVX2+FMA and the baseline ISA from one body; the variant runs that this CPU supports, unless a
// test forces a lower one. Storage is float, double or bf16 (uint16_t bits); arithmetic is float (double for
// double). bf16 results are rounded to nearest even, as c10::BFloat16 does.
#pragma once
#include <cstdint>

namespace bs::kernels {

enum class Isa { kScalar, kAvx2, kAvx512 };
const char* isa_name(Isa isa);
Isa best_isa();           // the best variant this CPU runs
Isa active_isa();         // the variant in use (best_isa unless forced)
void force_isa(Isa isa);  // tests: run a lower variant; throws if the CPU lacks it

template <class T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <class T>
using Acc = typename AccOf<T>::type;

// One LayerNorm call's operands: y = LN(dropout(x + bias) + residual) over rows of `cols`.
template <class T>
struct LnArgs {
  const T* x = nullptr;
  const Acc<T>* bias = nullptr;        // [cols], never null (zeros when the op has no bias)
  const T* residual = nullptr;         // or null
  const Acc<T>* gamma = nullptr;       // [cols]
  const Acc<T>* beta = nullptr;        // [cols]
  const uint8_t* keep_bits = nullptr;  // dropout keep bits (Philox.h layout) or null: no dropout
  Acc<T> keep_scale = 1;               // 1 / (1 - p)
  Acc<T> eps = 1e-12;
  int64_t cols = 0;
  T* sum = nullptr;        // out [rows, cols]: dropout(x + bias) + residual (kept for backward)
  T* y = nullptr;          // out [rows, cols]
  Acc<T>* mean = nullptr;  // out [rows]
  Acc<T>* rstd = nullptr;  // out [rows]
};

template <class T>
struct LnGradArgs {
  const T* dy = nullptr;
  const T* sum = nullptr;
  const Acc<T>* mean = nullptr;
  const Acc<T>* rstd = nullptr;
  const Acc<T>* gamma = nullptr;
  const uint8_t* keep_bits = nullptr;
  Acc<T> keep_scale = 1;
  int64_t cols = 0;
  T* d_residual = nullptr;   // out: d sum
  T* dx = nullptr;           // out: through the dropout
  Acc<T>* dgamma = nullptr;  // accumulated [cols] (one partial per row chunk)
  Acc<T>* dbeta = nullptr;
  Acc<T>* dbias = nullptr;  // never null (a scratch row when the op has no bias)
};

// Rows [begin, end). bias and dbias are never null: FusedOps passes zeros / a scratch row, so the loops carry
// no branch and vectorise.
template <class T>
void bias_gelu_rows(const T* x, const Acc<T>* bias, T* y, int64_t cols, int64_t begin, int64_t end);
template <class T>
void bias_gelu_grad_rows(const T* dy, const T* x, const Acc<T>* bias, T* dx, Acc<T>* dbias, int64_t cols, int64_t begin,
                         int64_t end);
template <class T>
void layer_norm_rows(const LnArgs<T>& a, int64_t begin, int64_t end);
template <class T>
void layer_norm_grad_rows(const LnGradArgs<T>& a, int64_t begin, int64_t end);
// y = x * keep * scale (dropout with precomputed keep bits); used forward and backward.
template <class T>
void masked_scale_rows(const T* x, const uint8_t* keep_bits, Acc<T> scale, T* y, int64_t cols, int64_t begin,
                       int64_t end);

// Attention probabilities of post-scale scores: y = softmax(scores + key_bias) over rows of `cols` keys, then
// probs = dropout(y). Row r belongs to sequence r / rows_per_bias (heads * queries rows per sequence).
template <class T>
struct SoftmaxArgs {
  const T* scores = nullptr;
  const Acc<T>* key_bias = nullptr;  // [sequences, cols]: 0 or the mask's large negative
  int64_t rows_per_bias = 1;
  const uint8_t* keep_bits = nullptr;  // or null: no dropout, probs is not written
  Acc<T> keep_scale = 1;
  int64_t cols = 0;
  T* y = nullptr;      // out: the softmax (kept for backward)
  T* probs = nullptr;  // out: after dropout (when keep_bits)
};
template <class T>
void softmax_dropout_rows(const SoftmaxArgs<T>& a, int64_t begin, int64_t end);
// dscores = y * (d - sum(d * y)), d = dprobs through the dropout (keep_bits null: none).
template <class T>
void softmax_dropout_grad_rows(const T* dprobs, const T* y, const uint8_t* keep_bits, Acc<T> keep_scale, int64_t cols,
                               T* dscores, int64_t begin, int64_t end);

// Cross-entropy rows: loss[r] = logsumexp(logits[r]) - logits[r][label[r]], lse[r] kept for backward; and
// dlogits[r] = (softmax(logits[r]) - onehot(label[r])) * scale. Labels are checked by the caller.
template <class T>
void cross_entropy_rows(const T* logits, const int64_t* labels, int64_t cols, Acc<T>* loss, Acc<T>* lse, int64_t begin,
                        int64_t end);
template <class T>
void cross_entropy_grad_rows(const T* logits, const int64_t* labels, const Acc<T>* lse, Acc<T> scale, int64_t cols,
                             T* dlogits, int64_t begin, int64_t end);

// Adam over elements [begin, end) of flat float buffers (FusedOptimizer.h has the rule).
struct AdamRowArgs {
  float decay_mult = 1, l2 = 0, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, step_size = 0, inv_sqrt_bc2 = 1;
};
void adam_rows(float* p, const float* g, float* m, float* v, const AdamRowArgs& a, int64_t begin, int64_t end);

using Bf16 = uint16_t;

}  // namespace bs::kernels
