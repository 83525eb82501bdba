// Global-batch samplers: which samples each rank trains on at every optimizer step, split into micro-batches.
// Every sampler sees the same samples per epoch: a seeded permutation of the dataset (identical on every rank,
// no communication), cut into steps of `global_batch` samples (the incomplete tail batch is dropped). They
// differ only in how a step's samples are spread over ranks and micro-batches:
//   random        rank r takes its contiguous share in permutation order; micro-batches are consecutive chunks.
//   global_sort   the step's samples sorted longest first and dealt in snake order over all ranks.
//   local_presort the paper's method: stratified steps (every rank's local batch holds the same count from
//                 every length stratum), then a snake deal inside each group of `presort_group` ranks.
//   packing       rank r's share (as random) packed first-fit-decreasing into rows of `row_len` tokens.
// Within a rank (all but random), samples are sorted longest first before chunking into micro-batches.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dataset/Batch.h"

namespace bs {

struct SamplerOptions {
  std::string kind = "random";  // random | global_sort | local_presort | packing
  int64_t global_batch = 32;    // samples per optimizer step, all ranks together
  int64_t micro_batch = 32;     // samples (rows, for packing) per micro-batch
  int64_t rank = 0;
  int64_t world = 1;
  int64_t presort_group = 8;                        // local_presort: ranks that presort together; 1 = purely local
  std::vector<int64_t> strata = {32, 64, 96, 128};  // local_presort: upper bounds of the length bins
  int64_t row_len = 128;                            // packing: tokens per row (the dataset's seq_len)
  uint64_t seed = 1;
};

class BatchSampler {
 public:
  virtual ~BatchSampler() = default;
  // This rank's micro-batches for the next optimizer step (global_batch/world samples in total on this rank).
  virtual std::vector<MicroBatch> next_step() = 0;
  virtual int64_t epoch() const = 0;     // completed passes over the data
  virtual int64_t position() const = 0;  // steps taken, for checkpoints
  virtual void seek(int64_t steps) = 0;  // restore after a checkpoint: same future batches as uninterrupted
  virtual int64_t steps_per_epoch() const = 0;
};

// Throws std::invalid_argument naming the option (kind, global_batch % world, too few samples, ...).
std::unique_ptr<BatchSampler> make_sampler(const SamplerOptions& opt, const std::vector<int32_t>& lengths);

// The seeded permutation of [0, n) for (seed, epoch): the same on every rank and every platform.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

// Load statistics of one rank's micro-batches, each trimmed to its longest row (what the model computes).
struct BatchLoad {
  int64_t real_tokens = 0;      // sum of sample lengths
  int64_t computed_tokens = 0;  // sum over micro-batches of rows * longest row
  double padding_waste() const {
    return computed_tokens ? double(computed_tokens - real_tokens) / double(computed_tokens) : 0.0;
  }
};
BatchLoad batch_load(const std::vector<MicroBatch>& micro_batches, const std::vector<int32_t>& lengths);

}  // namespace bs
