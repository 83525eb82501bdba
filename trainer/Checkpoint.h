// Checkpoints: model + optimizer state + step/sample counters + RNG. A set is checkpoint-<step>.pt (rank 0),
// rng-<step>-rank<r>.pt (every rank) and checksums.txt (size + FNV-1a of each, renamed into place last):
// a kill during a save leaves the previous set intact and described, and the previous set is removed only
// once the new one is published.
#pragma once
#include <cstdint>
#include <string>

#include "optimizers/Optimizer.h"
#include "trainer/BertModel.h"

namespace bs {

class Communicator;

struct TrainState {
  int64_t step = 0;
  int64_t samples = 0;
  double seconds = 0;  // training wall time so far
  double last_accuracy = 0;
};

// Rank 0 writes model and optimizer (identical on every rank); every rank writes its own RNG state.
void save_checkpoint(const std::string& dir, int64_t rank, int64_t world, BertForPretraining& model,
                     optim::Optimizer& optimizer, const TrainState& state, Communicator& comm);
// Returns false when `dir` has no checkpoint; DataError naming the file when the set is incomplete or does
// not match checksums.txt (written last by save_checkpoint), is unreadable, or is from a different model.
bool load_checkpoint(const std::string& dir, int64_t rank, BertForPretraining& model, optim::Optimizer& optimizer,
                     TrainState& state);

// FNV-1a 64 of a file's bytes (the checkpoint manifest's checksum).
uint64_t file_checksum(const std::string& path);

}  // namespace bs
