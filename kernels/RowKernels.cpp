// Row kernels: one body per operation (the *_body templates), instantiated per ISA by attribute (not by
// per-file -m flags, so no inline function of a shared header is ever compiled for a wider ISA than the
// caller runs). Loops are written for GCC's vectoriser: fixed 16-lane accumulators make every reduction's
// order the same on every ISA and thread count.
#include "kernels/RowKernels.h"

#include "kernels/Philox.h"

#include <atomic>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

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
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
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
BS_INLINE float erf_f(float x) {
  const float z = x < 0 ? -x : x;
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
  return x < 0 ? erfc - 1.0f : 1.0f - erfc;
}
BS_INLINE double erf_f(double x) { return std::erf(x); }

BS_INLINE bool kept(const uint8_t* bits, int64_t c) { return (bits[c >> 3] >> (c & 7)) & 1u; }

template <class T>
BS_INLINE void bias_gelu_body(const T* x, const Acc<T>* bias, T* y, int64_t cols, int64_t begin, int64_t end) {
  using A = Acc<T>;
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const A v = load(xr[c]) + (bias ? bias[c] : A(0));
      store(yr + c, A(0.5) * v * (A(1) + erf_f(v * A(0.70710678118654752440))));
    }
  }
}

template <class T>
BS_INLINE void bias_gelu_grad_body(const T* dy, const T* x, const Acc<T>* bias, T* dx, Acc<T>* dbias, int64_t cols,
                                   int64_t begin, int64_t end) {
  using A = Acc<T>;
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const A v = load(xr[c]) + (bias ? bias[c] : A(0));
      const A cdf = A(0.5) * (A(1) + erf_f(v * A(0.70710678118654752440)));
      const A pdf = exp_f(A(-0.5) * v * v) * A(0.39894228040143267794);  // 1/sqrt(2 pi)
      const A g = load(dyr[c]) * (cdf + v * pdf);
      store(dxr + c, g);
      if (dbias) dbias[c] += g;
    }
  }
}

// Sum of a row with 16 fixed lanes (the same order on every ISA).
template <class T, class F>
BS_INLINE Acc<T> row_sum(int64_t cols, F&& term) {
  using A = Acc<T>;
  A lanes[16] = {};
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16)
    for (int k = 0; k < 16; ++k) lanes[k] += term(c + k);
  for (int k = 0; c < cols; ++c, ++k) lanes[k] += term(c);
  A s = 0;
  for (int k = 0; k < 16; ++k) s += lanes[k];
  return s;
}

template <class T>
BS_INLINE void layer_norm_body(const LnArgs<T>& a, int64_t begin, int64_t end) {
  using A = Acc<T>;
  const int64_t C = a.cols;
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = a.x + r * C;
    const T* res = a.residual ? a.residual + r * C : nullptr;
    const uint8_t* bits = a.keep_bits ? a.keep_bits + r * keep_bytes_per_row(C) : nullptr;
    T* sr = a.sum + r * C;
    for (int64_t c = 0; c < C; ++c) {
      A h = load(xr[c]) + (a.bias ? a.bias[c] : A(0));
      if (bits) h = kept(bits, c) ? h * a.keep_scale : A(0);
      store(sr + c, h + (res ? load(res[c]) : A(0)));
    }
    // Statistics of the stored (rounded) sum: backward sees exactly what forward normalised.
    const A mean = row_sum<T>(C, [&](int64_t c) { return load(sr[c]); }) / A(C);
    const A var = row_sum<T>(C,
                             [&](int64_t c) {
                               const A d = load(sr[c]) - mean;
                               return d * d;
                             }) /
                  A(C);
    const A rstd = A(1) / std::sqrt(var + a.eps);
    a.mean[r] = mean;
    a.rstd[r] = rstd;
    T* yr = a.y + r * C;
    for (int64_t c = 0; c < C; ++c) store(yr + c, (load(sr[c]) - mean) * rstd * a.gamma[c] + a.beta[c]);
  }
}

template <class T>
BS_INLINE void layer_norm_grad_body(const LnGradArgs<T>& a, int64_t begin, int64_t end) {
  using A = Acc<T>;
  const int64_t C = a.cols;
  for (int64_t r = begin; r < end; ++r) {
    const T* dyr = a.dy + r * C;
    const T* sr = a.sum + r * C;
    const A mean = a.mean[r], rstd = a.rstd[r];
    const A g1 = row_sum<T>(C, [&](int64_t c) { return load(dyr[c]) * a.gamma[c]; }) / A(C);
    const A g2 =
        row_sum<T>(C, [&](int64_t c) { return load(dyr[c]) * a.gamma[c] * (load(sr[c]) - mean) * rstd; }) / A(C);
    const uint8_t* bits = a.keep_bits ? a.keep_bits + r * keep_bytes_per_row(C) : nullptr;
    T* dres = a.d_residual ? a.d_residual + r * C : nullptr;
    T* dxr = a.dx + r * C;
    for (int64_t c = 0; c < C; ++c) {
      const A dy = load(dyr[c]);
      const A xhat = (load(sr[c]) - mean) * rstd;
      const A ds = rstd * (dy * a.gamma[c] - g1 - xhat * g2);
      if (dres) store(dres + c, ds);
      const A dh = bits ? (kept(bits, c) ? ds * a.keep_scale : A(0)) : ds;
      store(dxr + c, dh);
      a.dgamma[c] += dy * xhat;
      a.dbeta[c] += dy;
      if (a.dbias) a.dbias[c] += dh;
    }
  }
}

template <class T>
BS_INLINE void masked_scale_body(const T* x, const uint8_t* keep_bits, Acc<T> scale, T* y, int64_t cols, int64_t begin,
                                 int64_t end) {
  using A = Acc<T>;
  const int64_t row_bytes = keep_bytes_per_row(cols);
  for (int64_t r = begin; r < end; ++r) {
    const uint8_t* bits = keep_bits + r * row_bytes;
    for (int64_t c = 0; c < cols; ++c) store(y + r * cols + c, kept(bits, c) ? load(x[r * cols + c]) * scale : A(0));
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
BS_VARIANTS(mscale, masked_scale_body,
            (const T* x, const uint8_t* bits, Acc<T> s, T* y, int64_t cols, int64_t b, int64_t e),
            (x, bits, s, y, cols, b, e))

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
                       int64_t end){BS_DISPATCH(mscale, (x, keep_bits, scale, y, cols, begin, end))}

#define BS_INSTANTIATE(T)                                                                                          \
  template void bias_gelu_rows<T>(const T*, const Acc<T>*, T*, int64_t, int64_t, int64_t);                         \
  template void bias_gelu_grad_rows<T>(const T*, const T*, const Acc<T>*, T*, Acc<T>*, int64_t, int64_t, int64_t); \
  template void layer_norm_rows<T>(const LnArgs<T>&, int64_t, int64_t);                                            \
  template void layer_norm_grad_rows<T>(const LnGradArgs<T>&, int64_t, int64_t);                                   \
  template void masked_scale_rows<T>(const T*, const uint8_t*, Acc<T>, T*, int64_t, int64_t, int64_t);
BS_INSTANTIATE(float) BS_INSTANTIATE(double) BS_INSTANTIATE(Bf16)

}  // namespace bs::kernels
