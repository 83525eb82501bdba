// Row kernels: one body per operation (the *_body templates), instantiated per ISA by attribute (not by
// per-file -m flags, so no inline function of a shared header is ever compiled for a wider ISA than the
// caller runs). Loops are written for GCC's vectoriser: fixed 16-lane accumulators make every reduction's
// order the same on every ISA and thread count.
#include "kernels/RowKernels.h"

#include "kernels/Philox.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace bs::kernels {
namespace {

#define BS_INLINE inline __attribute__((always_inline))

BS_INLINE float load(float v) { return v; }
BS_INLINE double load(double v) { return v; }
BS_INLINE float load(Bf16 v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
BS_INLINE void store(float* p, float v) { *p = v; }
BS_INLINE void store(double* p, double v) { *p = v; }
BS_INLINE void store(Bf16* p, float v) {  // round to nearest even; NaN stays a quiet NaN
  uint32_t u;
  __builtin_memcpy(&u, &v, 4);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  *p = static_cast<Bf16>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
}

// exp in float: n = round(x / ln 2), r = x - n ln 2 (two-part ln 2), Cephes' degree-6 polynomial for e^r,
// then 2^n by the exponent bits. Clamped to float's normal range; about 1 ulp.
BS_INLINE float exp_f(float x) {
  x = x < -87.0f ? -87.0f : x;  // two plain selects: vmaxps / vminps, no masked duplicate of the polynomial
  x = x > 88.0f ? 88.0f : x;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, 4);
  return p * scale;
}
BS_INLINE double exp_f(double x) { return std::exp(x); }

// erf in float from erfc's Chebyshev fit (Numerical Recipes' erfcc, fractional error < 1.2e-7).
// Branch-free: the sign is taken off and put back by bit operations, so the vectoriser computes one path.
BS_INLINE float erf_f(float x) {
  uint32_t ux;
  __builtin_memcpy(&ux, &x, 4);
  const uint32_t sign = ux & 0x80000000u, uz = ux & 0x7FFFFFFFu;
  float z;
  __builtin_memcpy(&z, &uz, 4);
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t + -0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t + -1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t + -0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t + -1.26551223f;
  const float erfc = t * exp_f(-z * z + p);
  const float e = 1.0f - erfc;  // erf(|x|) >= 0: the sign bit is free
  uint32_t ue;
  __builtin_memcpy(&ue, &e, 4);
  ue |= sign;
  float r;
  __builtin_memcpy(&r, &ue, 4);
  return r;
}
BS_INLINE double erf_f(double x) { return std::erf(x); }

BS_INLINE bool kept(const uint8_t* bits, int64_t c) { return (bits[c >> 3] >> (c & 7)) & 1u; }

// One row's keep bits as multipliers (scale where kept, 0 where dropped), 16 columns per step so the loop
// vectorises (a broadcast word, lane-varying shifts); the main loops then multiply without a branch.
template <class A>
BS_INLINE void expand_keep(const uint8_t* __restrict bits, int64_t cols, A scale, A* __restrict out) {
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    const uint32_t w = bits[c >> 3] | (static_cast<uint32_t>(bits[(c >> 3) + 1]) << 8);
    for (int k = 0; k < 16; ++k) out[c + k] = ((w >> k) & 1u) ? scale : A(0);
  }
  for (; c < cols; ++c) out[c] = kept(bits, c) ? scale : A(0);
}

// Row reductions with 16 fixed lanes: the same order on every ISA and thread count.
template <class T>
BS_INLINE Acc<T> sum_row(const T* __restrict v, int64_t cols) {
  using A = Acc<T>;
  A lanes[16] = {};
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16)
    for (int k = 0; k < 16; ++k) lanes[k] += load(v[c + k]);
  for (int k = 0; c < cols; ++c, ++k) lanes[k] += load(v[c]);
  A s = 0;
  for (int k = 0; k < 16; ++k) s += lanes[k];
  return s;
}
template <class T>
BS_INLINE Acc<T> sq_dev_row(const T* __restrict v, Acc<T> mean, int64_t cols) {
  using A = Acc<T>;
  A lanes[16] = {};
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16)
    for (int k = 0; k < 16; ++k) {
      const A d = load(v[c + k]) - mean;
      lanes[k] += d * d;
    }
  for (int k = 0; c < cols; ++c, ++k) {
    const A d = load(v[c]) - mean;
    lanes[k] += d * d;
  }
  A s = 0;
  for (int k = 0; k < 16; ++k) s += lanes[k];
  return s;
}
// sum(dy * gamma) and sum(dy * gamma * xhat) of one row, xhat = (s - mean) * rstd.
template <class T>
BS_INLINE void ln_grad_sums(const T* __restrict dy, const Acc<T>* __restrict gamma, const T* __restrict s, Acc<T> mean,
                            Acc<T> rstd, int64_t cols, Acc<T>& g1, Acc<T>& g2) {
  using A = Acc<T>;
  A l1[16] = {}, l2[16] = {};
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16)
    for (int k = 0; k < 16; ++k) {
      const A dg = load(dy[c + k]) * gamma[c + k];
      l1[k] += dg;
      l2[k] += dg * ((load(s[c + k]) - mean) * rstd);
    }
  for (int k = 0; c < cols; ++c, ++k) {
    const A dg = load(dy[c]) * gamma[c];
    l1[k] += dg;
    l2[k] += dg * ((load(s[c]) - mean) * rstd);
  }
  g1 = g2 = 0;
  for (int k = 0; k < 16; ++k) {
    g1 += l1[k];
    g2 += l2[k];
  }
}

// The column loops as functions of restrict-qualified parameters: GCC keeps a parameter's restrict through
// inlining (not a local's), and without it the several output streams of a row defeat the vectoriser.
template <class T, bool kRes, bool kDrop>
BS_INLINE void ln_sum_row(const T* __restrict x, const Acc<T>* __restrict bias, const Acc<T>* __restrict keep,
                          const T* __restrict res, int64_t C, T* __restrict sum) {
  for (int64_t c = 0; c < C; ++c) {
    Acc<T> h = load(x[c]) + bias[c];
    if constexpr (kDrop) h *= keep[c];
    if constexpr (kRes) h += load(res[c]);
    store(sum + c, h);
  }
}
template <class T>
BS_INLINE void ln_out_row(const T* __restrict sum, const Acc<T>* __restrict gamma, const Acc<T>* __restrict beta,
                          Acc<T> mean, Acc<T> rstd, int64_t C, T* __restrict y) {
  for (int64_t c = 0; c < C; ++c) store(y + c, (load(sum[c]) - mean) * rstd * gamma[c] + beta[c]);
}
template <class T, bool kDrop, bool kDres>
BS_INLINE void ln_grad_row(const T* __restrict dyr, const T* __restrict sr, const Acc<T>* __restrict gamma,
                           const Acc<T>* __restrict keep, Acc<T> mean, Acc<T> rstd, Acc<T> g1, Acc<T> g2, int64_t C,
                           T* __restrict dres, T* __restrict dxr, Acc<T>* __restrict dgamma, Acc<T>* __restrict dbeta,
                           Acc<T>* __restrict dbias) {
  using A = Acc<T>;
  for (int64_t c = 0; c < C; ++c) {
    const A dy = load(dyr[c]);
    const A xhat = (load(sr[c]) - mean) * rstd;
    const A ds = rstd * (dy * gamma[c] - g1 - xhat * g2);
    if constexpr (kDres) store(dres + c, ds);
    A dh = ds;
    if constexpr (kDrop) dh *= keep[c];
    store(dxr + c, dh);
    dgamma[c] += dy * xhat;
    dbeta[c] += dy;
    dbias[c] += dh;
  }
}
template <class T>
BS_INLINE void scale_row(const T* __restrict x, const Acc<T>* __restrict k, int64_t cols, T* __restrict y) {
  for (int64_t c = 0; c < cols; ++c) store(y + c, load(x[c]) * k[c]);
}
template <class T>
BS_INLINE void scale_row_acc(const Acc<T>* __restrict x, const Acc<T>* __restrict k, int64_t cols, T* __restrict y) {
  for (int64_t c = 0; c < cols; ++c) store(y + c, x[c] * k[c]);
}

// bias and dbias are never null (FusedOps passes zeros / a scratch row): no branch in the loops.
template <class T>
BS_INLINE void bias_gelu_body(const T* __restrict x, const Acc<T>* __restrict bias, T* __restrict y, int64_t cols,
                              int64_t begin, int64_t end) {
  using A = Acc<T>;
  for (int64_t r = begin; r < end; ++r) {
    const T* __restrict xr = x + r * cols;
    T* __restrict yr = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const A v = load(xr[c]) + bias[c];
      store(yr + c, A(0.5) * v * (A(1) + erf_f(v * A(0.70710678118654752440))));
    }
  }
}

template <class T>
BS_INLINE void bias_gelu_grad_body(const T* __restrict dy, const T* __restrict x, const Acc<T>* __restrict bias,
                                   T* __restrict dx, Acc<T>* __restrict dbias, int64_t cols, int64_t begin,
                                   int64_t end) {
  using A = Acc<T>;
  for (int64_t r = begin; r < end; ++r) {
    const T* __restrict xr = x + r * cols;
    const T* __restrict dyr = dy + r * cols;
    T* __restrict dxr = dx + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const A v = load(xr[c]) + bias[c];
      const A cdf = A(0.5) * (A(1) + erf_f(v * A(0.70710678118654752440)));
      const A pdf = exp_f(A(-0.5) * v * v) * A(0.39894228040143267794);  // 1/sqrt(2 pi)
      const A g = load(dyr[c]) * (cdf + v * pdf);
      store(dxr + c, g);
      dbias[c] += g;
    }
  }
}

// kRes: a residual is added; kDrop: dropout by the expanded keep multipliers `keep` (scratch of cols).
template <class T, bool kRes, bool kDrop>
BS_INLINE void layer_norm_rows_of(const LnArgs<T>& a, int64_t begin, int64_t end, Acc<T>* __restrict keep) {
  using A = Acc<T>;
  const int64_t C = a.cols;
  const A* __restrict bias = a.bias;
  const A* __restrict gamma = a.gamma;
  const A* __restrict beta = a.beta;
  for (int64_t r = begin; r < end; ++r) {
    const T* __restrict xr = a.x + r * C;
    const T* __restrict res = kRes ? a.residual + r * C : nullptr;
    if constexpr (kDrop) expand_keep(a.keep_bits + r * keep_bytes_per_row(C), C, a.keep_scale, keep);
    T* __restrict sr = a.sum + r * C;
    ln_sum_row<T, kRes, kDrop>(xr, bias, keep, res, C, sr);
    // Statistics of the stored (rounded) sum: backward sees exactly what forward normalised.
    const A mean = sum_row(sr, C) / A(C);
    const A var = sq_dev_row(sr, mean, C) / A(C);
    const A rstd = A(1) / std::sqrt(var + a.eps);
    a.mean[r] = mean;
    a.rstd[r] = rstd;
    ln_out_row(sr, gamma, beta, mean, rstd, C, a.y + r * C);
  }
}

template <class T>
BS_INLINE void layer_norm_body(const LnArgs<T>& a, int64_t begin, int64_t end) {
  std::vector<Acc<T>> keep(a.keep_bits ? a.cols : 0);
  if (a.residual) {
    if (a.keep_bits) return layer_norm_rows_of<T, true, true>(a, begin, end, keep.data());
    return layer_norm_rows_of<T, true, false>(a, begin, end, nullptr);
  }
  if (a.keep_bits) return layer_norm_rows_of<T, false, true>(a, begin, end, keep.data());
  return layer_norm_rows_of<T, false, false>(a, begin, end, nullptr);
}

// kDrop: through the dropout (keep multipliers); kDres: d(residual) differs from dx and is written too.
template <class T, bool kDrop, bool kDres>
BS_INLINE void layer_norm_grad_rows_of(const LnGradArgs<T>& a, int64_t begin, int64_t end, Acc<T>* __restrict keep) {
  using A = Acc<T>;
  const int64_t C = a.cols;
  const A* __restrict gamma = a.gamma;
  A* __restrict dgamma = a.dgamma;
  A* __restrict dbeta = a.dbeta;
  A* __restrict dbias = a.dbias;
  for (int64_t r = begin; r < end; ++r) {
    const T* __restrict dyr = a.dy + r * C;
    const T* __restrict sr = a.sum + r * C;
    const A mean = a.mean[r], rstd = a.rstd[r];
    A g1, g2;
    ln_grad_sums(dyr, gamma, sr, mean, rstd, C, g1, g2);
    g1 /= A(C);
    g2 /= A(C);
    if constexpr (kDrop) expand_keep(a.keep_bits + r * keep_bytes_per_row(C), C, a.keep_scale, keep);
    ln_grad_row<T, kDrop, kDres>(dyr, sr, gamma, keep, mean, rstd, g1, g2, C, kDres ? a.d_residual + r * C : nullptr,
                                 a.dx + r * C, dgamma, dbeta, dbias);
  }
}

template <class T>
BS_INLINE void layer_norm_grad_body(const LnGradArgs<T>& a, int64_t begin, int64_t end) {
  std::vector<Acc<T>> keep(a.keep_bits ? a.cols : 0);
  if (!a.keep_bits) return layer_norm_grad_rows_of<T, false, false>(a, begin, end, nullptr);
  if (a.d_residual) return layer_norm_grad_rows_of<T, true, true>(a, begin, end, keep.data());
  return layer_norm_grad_rows_of<T, true, false>(a, begin, end, keep.data());
}

template <class T>
BS_INLINE void masked_scale_body(const T* __restrict x, const uint8_t* __restrict keep_bits, Acc<T> scale,
                                 T* __restrict y, int64_t cols, int64_t begin, int64_t end) {
  using A = Acc<T>;
  std::vector<A> keep(cols);
  A* __restrict k = keep.data();
  for (int64_t r = begin; r < end; ++r) {
    expand_keep(keep_bits + r * keep_bytes_per_row(cols), cols, scale, k);
    scale_row(x + r * cols, k, cols, y + r * cols);
  }
}

template <class T>
BS_INLINE void softmax_row(const T* __restrict s, const Acc<T>* __restrict kb, int64_t C, Acc<T>* __restrict e,
                           T* __restrict y) {
  using A = Acc<T>;
  A lanes[16];
  for (int k = 0; k < 16; ++k) lanes[k] = -std::numeric_limits<A>::infinity();
  int64_t c = 0;
  for (; c + 16 <= C; c += 16)
    for (int k = 0; k < 16; ++k) {
      const A h = load(s[c + k]) + kb[c + k];
      e[c + k] = h;
      lanes[k] = h > lanes[k] ? h : lanes[k];
    }
  for (int k = 0; c < C; ++c, ++k) {
    const A h = load(s[c]) + kb[c];
    e[c] = h;
    lanes[k] = h > lanes[k] ? h : lanes[k];
  }
  A m = lanes[0];
  for (int k = 1; k < 16; ++k) m = lanes[k] > m ? lanes[k] : m;
  A sums[16] = {};
  c = 0;
  for (; c + 16 <= C; c += 16)
    for (int k = 0; k < 16; ++k) {
      const A x = e[c + k] - m;
      const A v = x < A(-87) ? A(0) : exp_f(x);  // a masked key gives exactly 0, as LibTorch's softmax does
      e[c + k] = v;
      sums[k] += v;
    }
  for (int k = 0; c < C; ++c, ++k) {
    const A x = e[c] - m;
    const A v = x < A(-87) ? A(0) : exp_f(x);
    e[c] = v;
    sums[k] += v;
  }
  A total = 0;
  for (int k = 0; k < 16; ++k) total += sums[k];
  const A inv = A(1) / total;
  for (c = 0; c < C; ++c) {
    e[c] *= inv;
    store(y + c, e[c]);
  }
}

template <class T>
BS_INLINE void softmax_dropout_body(const SoftmaxArgs<T>& a, int64_t begin, int64_t end) {
  using A = Acc<T>;
  const int64_t C = a.cols;
  std::vector<A> scratch(a.keep_bits ? 2 * C : C);
  A* e = scratch.data();
  A* keep = a.keep_bits ? scratch.data() + C : nullptr;
  for (int64_t r = begin; r < end; ++r) {
    softmax_row(a.scores + r * C, a.key_bias + (r / a.rows_per_bias) * C, C, e, a.y + r * C);
    if (!a.keep_bits) continue;
    expand_keep(a.keep_bits + r * keep_bytes_per_row(C), C, a.keep_scale, keep);
    scale_row_acc(e, keep, C, a.probs + r * C);
  }
}

template <class T>
BS_INLINE void softmax_dropout_grad_body(const T* __restrict dprobs, const T* __restrict y,
                                         const uint8_t* __restrict keep_bits, Acc<T> keep_scale, int64_t cols,
                                         T* __restrict dscores, int64_t begin, int64_t end) {
  using A = Acc<T>;
  std::vector<A> scratch(2 * cols);
  A* __restrict d = scratch.data();
  A* __restrict keep = scratch.data() + cols;
  for (int64_t r = begin; r < end; ++r) {
    const T* __restrict dp = dprobs + r * cols;
    const T* __restrict yr = y + r * cols;
    if (keep_bits) {
      expand_keep(keep_bits + r * keep_bytes_per_row(cols), cols, keep_scale, keep);
      for (int64_t c = 0; c < cols; ++c) d[c] = load(dp[c]) * keep[c];
    } else {
      for (int64_t c = 0; c < cols; ++c) d[c] = load(dp[c]);
    }
    A lanes[16] = {};
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16)
      for (int k = 0; k < 16; ++k) lanes[k] += d[c + k] * load(yr[c + k]);
    for (int k = 0; c < cols; ++c, ++k) lanes[k] += d[c] * load(yr[c]);
    A dot = 0;
    for (int k = 0; k < 16; ++k) dot += lanes[k];
    T* __restrict ds = dscores + r * cols;
    for (c = 0; c < cols; ++c) store(ds + c, load(yr[c]) * (d[c] - dot));
  }
}

// Row max with 16 lanes (exact in any order) and the sum of exp(x - max) with 16 fixed lanes.
template <class T>
BS_INLINE Acc<T> max_row(const T* __restrict x, int64_t C) {
  using A = Acc<T>;
  A lanes[16];
  for (int k = 0; k < 16; ++k) lanes[k] = -std::numeric_limits<A>::infinity();
  int64_t c = 0;
  for (; c + 16 <= C; c += 16)
    for (int k = 0; k < 16; ++k) {
      const A v = load(x[c + k]);
      lanes[k] = v > lanes[k] ? v : lanes[k];
    }
  for (int k = 0; c < C; ++c, ++k) {
    const A v = load(x[c]);
    lanes[k] = v > lanes[k] ? v : lanes[k];
  }
  A m = lanes[0];
  for (int k = 1; k < 16; ++k) m = lanes[k] > m ? lanes[k] : m;
  return m;
}
template <class T>
BS_INLINE Acc<T> sum_exp_row(const T* __restrict x, Acc<T> m, int64_t C) {
  using A = Acc<T>;
  A lanes[16] = {};
  int64_t c = 0;
  for (; c + 16 <= C; c += 16)
    for (int k = 0; k < 16; ++k) lanes[k] += exp_f(load(x[c + k]) - m);
  for (int k = 0; c < C; ++c, ++k) lanes[k] += exp_f(load(x[c]) - m);
  A s = 0;
  for (int k = 0; k < 16; ++k) s += lanes[k];
  return s;
}

template <class T>
BS_INLINE void cross_entropy_body(const T* __restrict logits, const int64_t* __restrict labels, int64_t cols,
                                  Acc<T>* __restrict loss, Acc<T>* __restrict lse, int64_t begin, int64_t end) {
  using A = Acc<T>;
  for (int64_t r = begin; r < end; ++r) {
    const T* __restrict x = logits + r * cols;
    const A m = max_row(x, cols);
    const A l = m + std::log(sum_exp_row(x, m, cols));
    lse[r] = l;
    loss[r] = l - load(x[labels[r]]);
  }
}

template <class T>
BS_INLINE void cross_entropy_grad_body(const T* __restrict logits, const int64_t* __restrict labels,
                                       const Acc<T>* __restrict lse, Acc<T> scale, int64_t cols, T* __restrict dlogits,
                                       int64_t begin, int64_t end) {
  using A = Acc<T>;
  for (int64_t r = begin; r < end; ++r) {
    const T* __restrict x = logits + r * cols;
    T* __restrict d = dlogits + r * cols;
    const A l = lse[r];
    for (int64_t c = 0; c < cols; ++c) store(d + c, exp_f(load(x[c]) - l) * scale);
    const int64_t y = labels[r];
    store(d + y, (exp_f(load(x[y]) - l) - A(1)) * scale);
  }
}

BS_INLINE void adam_body(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                         const AdamRowArgs& a, int64_t begin, int64_t end) {
  const float decay = a.decay_mult, l2 = a.l2, b1 = a.b1, b2 = a.b2, eps = a.eps, step = a.step_size;
  const float inv_bc2 = a.inv_sqrt_bc2, c1 = 1.0f - b1, c2 = 1.0f - b2;
  for (int64_t i = begin; i < end; ++i) {
    const float pi = p[i] * decay;
    const float gi = g[i] + l2 * p[i];  // l2 = 0 for AdamW
    const float mi = b1 * m[i] + c1 * gi;
    const float vi = b2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + step * mi / (std::sqrt(vi) * inv_bc2 + eps);
  }
}

// Dropout keep bits (Philox.h's layout) for rows [begin, end): Philox4x32-10 for 16 blocks at a time in
// structure-of-arrays form, so the 32x32->64 multiplies of a round are one vector instruction per 8 or 16
// lanes (vpmuludq), then a compare and bit pack per row. Same words as philox4x32_10 for every block.
constexpr int kPhiloxLanes = 16;

BS_INLINE void philox_blocks(uint64_t first_block, uint32_t key0, uint32_t key1, uint32_t* __restrict out) {
  uint32_t c0[kPhiloxLanes], c1[kPhiloxLanes], c2[kPhiloxLanes], c3[kPhiloxLanes];
  for (int i = 0; i < kPhiloxLanes; ++i) {
    const uint64_t b = first_block + static_cast<uint64_t>(i);
    c0[i] = static_cast<uint32_t>(b);
    c1[i] = static_cast<uint32_t>(b >> 32);
    c2[i] = 0;
    c3[i] = 0;
  }
  for (int round = 0; round < 10; ++round) {
    for (int i = 0; i < kPhiloxLanes; ++i) {
      const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0[i];
      const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2[i];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[i] ^ key0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[i] ^ key1;
      c1[i] = static_cast<uint32_t>(p1);
      c3[i] = static_cast<uint32_t>(p0);
      c0[i] = n0;
      c2[i] = n2;
    }
    key0 += 0x9E3779B9u;
    key1 += 0xBB67AE85u;
  }
  for (int i = 0; i < kPhiloxLanes; ++i) {
    out[4 * i] = c0[i];
    out[4 * i + 1] = c1[i];
    out[4 * i + 2] = c2[i];
    out[4 * i + 3] = c3[i];
  }
}

BS_INLINE void keep_bits_body(uint64_t key, uint32_t threshold, int64_t begin, int64_t end, int64_t cols,
                              uint8_t* __restrict bits) {
  if (begin >= end) return;
  const auto k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  const int64_t row_bytes = keep_bytes_per_row(cols);
  // The words of every block the rows touch, generated once (a block may straddle two rows).
  const uint64_t b0 = static_cast<uint64_t>(begin * cols) >> 2;
  const uint64_t b1 = (static_cast<uint64_t>(end * cols) + 3) >> 2;
  const uint64_t groups = (b1 - b0 + kPhiloxLanes - 1) / kPhiloxLanes;
  std::vector<uint32_t> words(groups * kPhiloxLanes * 4);
  for (uint64_t g = 0; g < groups; ++g)
    philox_blocks(b0 + g * kPhiloxLanes, k0, k1, words.data() + g * kPhiloxLanes * 4);
  for (int64_t r = begin; r < end; ++r) {
    const uint32_t* __restrict w = words.data() + (static_cast<uint64_t>(r * cols) - 4 * b0);
    uint8_t* __restrict out = bits + r * row_bytes;
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      uint32_t byte = 0;
      for (int k = 0; k < 8; ++k) byte |= static_cast<uint32_t>(w[c + k] >= threshold) << k;
      out[c >> 3] = static_cast<uint8_t>(byte);
    }
    if (c < cols) {
      uint32_t byte = 0;
      for (int k = 0; c + k < cols; ++k) byte |= static_cast<uint32_t>(w[c + k] >= threshold) << k;
      out[c >> 3] = static_cast<uint8_t>(byte);
    }
  }
}

// The three variants of each body, and a dispatch on the active ISA (the baseline only off x86-64).
#if defined(__x86_64__)
#define BS_VARIANTS(NAME, BODY, PARAMS, ARGS)                           \
  template <class T>                                                    \
  __attribute__((target("arch=x86-64-v4"))) void NAME##_avx512 PARAMS { \
    BODY<T> ARGS;                                                       \
  }                                                                     \
  template <class T>                                                    \
  __attribute__((target("avx2,fma"))) void NAME##_avx2 PARAMS {         \
    BODY<T> ARGS;                                                       \
  }                                                                     \
  template <class T>                                                    \
  void NAME##_scalar PARAMS {                                           \
    BODY<T> ARGS;                                                       \
  }

#define BS_DISPATCH(NAME, ARGS)                        \
  if constexpr (!std::is_same_v<T, double>) {          \
    switch (active_isa()) {                            \
      case Isa::kAvx512: return NAME##_avx512<T> ARGS; \
      case Isa::kAvx2: return NAME##_avx2<T> ARGS;     \
      case Isa::kScalar: break;                        \
    }                                                  \
  }                                                    \
  return NAME##_scalar<T> ARGS;
#else
#define BS_VARIANTS(NAME, BODY, PARAMS, ARGS) \
  template <class T>                          \
  void NAME##_scalar PARAMS {                 \
    BODY<T> ARGS;                             \
  }
#define BS_DISPATCH(NAME, ARGS) return NAME##_scalar<T> ARGS;
#endif

BS_VARIANTS(gelu, bias_gelu_body, (const T* x, const Acc<T>* bias, T* y, int64_t cols, int64_t b, int64_t e),
            (x, bias, y, cols, b, e))
BS_VARIANTS(gelu_grad, bias_gelu_grad_body,
            (const T* dy, const T* x, const Acc<T>* bias, T* dx, Acc<T>* db, int64_t cols, int64_t b, int64_t e),
            (dy, x, bias, dx, db, cols, b, e))
BS_VARIANTS(ln, layer_norm_body, (const LnArgs<T>& a, int64_t b, int64_t e), (a, b, e))
BS_VARIANTS(ln_grad, layer_norm_grad_body, (const LnGradArgs<T>& a, int64_t b, int64_t e), (a, b, e))
BS_VARIANTS(softmax, softmax_dropout_body, (const SoftmaxArgs<T>& a, int64_t b, int64_t e), (a, b, e))
BS_VARIANTS(softmax_grad, softmax_dropout_grad_body,
            (const T* dp, const T* y, const uint8_t* bits, Acc<T> s, int64_t cols, T* ds, int64_t b, int64_t e),
            (dp, y, bits, s, cols, ds, b, e))
BS_VARIANTS(xent, cross_entropy_body,
            (const T* x, const int64_t* y, int64_t cols, Acc<T>* loss, Acc<T>* lse, int64_t b, int64_t e),
            (x, y, cols, loss, lse, b, e))
BS_VARIANTS(xent_grad, cross_entropy_grad_body,
            (const T* x, const int64_t* y, const Acc<T>* lse, Acc<T> s, int64_t cols, T* d, int64_t b, int64_t e),
            (x, y, lse, s, cols, d, b, e))
BS_VARIANTS(mscale, masked_scale_body,
            (const T* x, const uint8_t* bits, Acc<T> s, T* y, int64_t cols, int64_t b, int64_t e),
            (x, bits, s, y, cols, b, e))

#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void keep_bits_avx512(uint64_t key, uint32_t t, int64_t b, int64_t e,
                                                                int64_t cols, uint8_t* bits) {
  keep_bits_body(key, t, b, e, cols, bits);
}
__attribute__((target("avx2,fma"))) void keep_bits_avx2(uint64_t key, uint32_t t, int64_t b, int64_t e, int64_t cols,
                                                        uint8_t* bits) {
  keep_bits_body(key, t, b, e, cols, bits);
}
#endif
void keep_bits_scalar(uint64_t key, uint32_t t, int64_t b, int64_t e, int64_t cols, uint8_t* bits) {
  keep_bits_body(key, t, b, e, cols, bits);
}
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void adam_avx512(float* p, const float* g, float* m, float* v,
                                                           const AdamRowArgs& a, int64_t b, int64_t e) {
  adam_body(p, g, m, v, a, b, e);
}
__attribute__((target("avx2,fma"))) void adam_avx2(float* p, const float* g, float* m, float* v, const AdamRowArgs& a,
                                                   int64_t b, int64_t e) {
  adam_body(p, g, m, v, a, b, e);
}
#endif
void adam_scalar(float* p, const float* g, float* m, float* v, const AdamRowArgs& a, int64_t b, int64_t e) {
  adam_body(p, g, m, v, a, b, e);
}

std::atomic<int> forced_isa{-1};

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kScalar: return "scalar";
  }
  return "?";
}

Isa best_isa() {
  static const Isa best = [] {
#if !defined(__x86_64__)
    return Isa::kScalar;
#else
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd"))
      return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
    return Isa::kScalar;
#endif
  }();
  return best;
}

Isa active_isa() {
  const int f = forced_isa.load(std::memory_order_relaxed);
  return f < 0 ? best_isa() : static_cast<Isa>(f);
}

void force_isa(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(best_isa()))
    throw std::invalid_argument(std::string("kernels: this CPU cannot run the ") + isa_name(isa) +
                                " variant (best: " + isa_name(best_isa()) + ")");
  forced_isa.store(static_cast<int>(isa));
}

void dropout_keep_bits(uint64_t key, uint32_t threshold, int64_t row_begin, int64_t row_end, int64_t cols,
                       uint8_t* bits) {
#if defined(__x86_64__)
  switch (active_isa()) {
    case Isa::kAvx512: return keep_bits_avx512(key, threshold, row_begin, row_end, cols, bits);
    case Isa::kAvx2: return keep_bits_avx2(key, threshold, row_begin, row_end, cols, bits);
    case Isa::kScalar: break;
  }
#endif
  keep_bits_scalar(key, threshold, row_begin, row_end, cols, bits);
}

void adam_rows(float* p, const float* g, float* m, float* v, const AdamRowArgs& a, int64_t begin, int64_t end) {
#if defined(__x86_64__)
  switch (active_isa()) {
    case Isa::kAvx512: return adam_avx512(p, g, m, v, a, begin, end);
    case Isa::kAvx2: return adam_avx2(p, g, m, v, a, begin, end);
    case Isa::kScalar: break;
  }
#endif
  adam_scalar(p, g, m, v, a, begin, end);
}

template <class T>
void bias_gelu_rows(const T* x, const Acc<T>* bias, T* y, int64_t cols, int64_t begin, int64_t end) {
  BS_DISPATCH(gelu, (x, bias, y, cols, begin, end))
}
template <class T>
void bias_gelu_grad_rows(const T* dy, const T* x, const Acc<T>* bias, T* dx, Acc<T>* dbias, int64_t cols, int64_t begin,
                         int64_t end) {
  BS_DISPATCH(gelu_grad, (dy, x, bias, dx, dbias, cols, begin, end))
}
template <class T>
void layer_norm_rows(const LnArgs<T>& a, int64_t begin, int64_t end) {
  BS_DISPATCH(ln, (a, begin, end))
}
template <class T>
void layer_norm_grad_rows(const LnGradArgs<T>& a, int64_t begin, int64_t end) {
  BS_DISPATCH(ln_grad, (a, begin, end))
}
template <class T>
void masked_scale_rows(const T* x, const uint8_t* keep_bits, Acc<T> scale, T* y, int64_t cols, int64_t begin,
                       int64_t end) {
  BS_DISPATCH(mscale, (x, keep_bits, scale, y, cols, begin, end))
}

template <class T>
void softmax_dropout_rows(const SoftmaxArgs<T>& a, int64_t begin, int64_t end) {
  BS_DISPATCH(softmax, (a, begin, end))
}
template <class T>
void softmax_dropout_grad_rows(const T* dprobs, const T* y, const uint8_t* keep_bits, Acc<T> keep_scale, int64_t cols,
                               T* dscores, int64_t begin, int64_t end) {
  BS_DISPATCH(softmax_grad, (dprobs, y, keep_bits, keep_scale, cols, dscores, begin, end))
}

template <class T>
void cross_entropy_rows(const T* logits, const int64_t* labels, int64_t cols, Acc<T>* loss, Acc<T>* lse, int64_t begin,
                        int64_t end) {
  BS_DISPATCH(xent, (logits, labels, cols, loss, lse, begin, end))
}
template <class T>
void cross_entropy_grad_rows(const T* logits, const int64_t* labels, const Acc<T>* lse, Acc<T> scale, int64_t cols,
                             T* dlogits, int64_t begin, int64_t end){
    BS_DISPATCH(xent_grad, (logits, labels, lse, scale, cols, dlogits, begin, end))}

#define BS_INSTANTIATE(T)                                                                                          \
  template void bias_gelu_rows<T>(const T*, const Acc<T>*, T*, int64_t, int64_t, int64_t);                         \
  template void bias_gelu_grad_rows<T>(const T*, const T*, const Acc<T>*, T*, Acc<T>*, int64_t, int64_t, int64_t); \
  template void layer_norm_rows<T>(const LnArgs<T>&, int64_t, int64_t);                                            \
  template void layer_norm_grad_rows<T>(const LnGradArgs<T>&, int64_t, int64_t);                                   \
  template void masked_scale_rows<T>(const T*, const uint8_t*, Acc<T>, T*, int64_t, int64_t, int64_t);             \
  template void softmax_dropout_rows<T>(const SoftmaxArgs<T>&, int64_t, int64_t);                                  \
  template void softmax_dropout_grad_rows<T>(const T*, const T*, const uint8_t*, Acc<T>, int64_t, T*, int64_t,     \
                                             int64_t);                                                             \
  template void cross_entropy_rows<T>(const T*, const int64_t*, int64_t, Acc<T>*, Acc<T>*, int64_t, int64_t);      \
  template void cross_entropy_grad_rows<T>(const T*, const int64_t*, const Acc<T>*, Acc<T>, int64_t, T*, int64_t,  \
                                           int64_t);
BS_INSTANTIATE(float) BS_INSTANTIATE(double) BS_INSTANTIATE(Bf16)

}  // namespace bs::kernels
