// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a counter-based
// generator. The same (key, counter) gives the same four words on every run, thread and ISA, so a dropout mask
// is a pure function of the key drawn for the call and the element index: backward, a resumed run and a
// re-run all see the same mask without storing a generator per thread.
#pragma once
#include <array>
#include <cstdint>

namespace bs::kernels {

using PhiloxWords = std::array<uint32_t, 4>;

inline PhiloxWords philox4x32_10(PhiloxWords ctr, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key0, static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key1, static_cast<uint32_t>(p0)};
    key0 += kW0;
    key1 += kW1;
  }
  return ctr;
}

// Keep bits of a dropout mask, 8 elements per byte, each row of `cols` elements starting on a byte: element
// (row, col) has the global index row*cols + col; its word is lane index%4 of the block index/4 under `key`,
// and it is kept when that word is >= `threshold` (= drop probability * 2^32).
void dropout_keep_bits(uint64_t key, uint32_t threshold, int64_t row_begin, int64_t row_end, int64_t cols,
                       uint8_t* bits);

// Bytes per row of that layout.
constexpr int64_t keep_bytes_per_row(int64_t cols) { return (cols + 7) / 8; }

// The threshold for drop probability p in [0, 1).
uint32_t dropout_threshold(double p);

}  // namespace bs::kernels
