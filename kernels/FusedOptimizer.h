// Fused optimizer updates on flat float32 buffers: one pass over memory per step (p, g, m, v read once; p, m, v
// written once), where the operator-by-operator update makes eight. For the CPU path of optimizers/.
#pragma once
#include <cstdint>

namespace bs::kernels {

// One Adam step: decoupled (AdamW): p *= 1 - lr*wd; else (L2) g += wd*p. Then m = b1 m + (1-b1) g,
// v = b2 v + (1-b2) g^2, p += step_size * m / (sqrt(v) / sqrt_bc2 + eps), with step_size = -lr / bc1.
struct AdamStepArgs {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  double step_size = 0;  // -lr / bias_correction1
  double sqrt_bc2 = 1;   // sqrt(bias_correction2)
  bool decoupled = true;
};
// n elements, split over the intra-op threads in fixed chunks (the result does not depend on the split).
void adam_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepArgs& a);

}  // namespace bs::kernels
