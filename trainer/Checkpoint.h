// Checkpoints: model + optimizer state + step/sample counters + RNG, written atomically (temp name, then
// rename) so that a kill during the write leaves the previous checkpoint intact.
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
  double seconds = 0;         // training wall time so far
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
