#include "kernels/Philox.h"

#include <cmath>

namespace bs::kernels {

uint32_t dropout_threshold(double p) {
  const double t = std::floor(p * 4294967296.0);
  return t <= 0 ? 0u : t >= 4294967295.0 ? 4294967295u : static_cast<uint32_t>(t);
}

void dropout_keep_bits(uint64_t key, uint32_t threshold, int64_t row_begin, int64_t row_end, int64_t cols,
                       uint8_t* bits) {
  const int64_t row_bytes = keep_bytes_per_row(cols);
  const auto k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int64_t r = row_begin; r < row_end; ++r) {
    uint8_t* out = bits + r * row_bytes;
    for (int64_t b = 0; b < row_bytes; ++b) out[b] = 0;
    int64_t e = r * cols;
    const int64_t end = e + cols;
    while (e < end) {
      const auto block = static_cast<uint64_t>(e) >> 2;
      const PhiloxWords w =
          philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0, 0}, k0, k1);
      for (int lane = static_cast<int>(e & 3); lane < 4 && e < end; ++lane, ++e) {
        const int64_t c = e - r * cols;
        if (w[lane] >= threshold) out[c >> 3] |= static_cast<uint8_t>(1u << (c & 7));
      }
    }
  }
}

}  // namespace bs::kernels
