#include "kernels/Philox.h"

#include <cmath>

namespace bs::kernels {

uint32_t dropout_threshold(double p) {
  const double t = std::floor(p * 4294967296.0);
  return t <= 0 ? 0u : t >= 4294967295.0 ? 4294967295u : static_cast<uint32_t>(t);
}

// dropout_keep_bits is in RowKernels.cpp, with the ISA variants.

}  // namespace bs::kernels
