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
// Returns false when `dir` has no checkpoint; DataError when it is unreadable or from a different model.
bool load_checkpoint(const std::string& dir, int64_t rank, BertForPretraining& model, optim::Optimizer& optimizer,
                     TrainState& state);

}  // namespace bs
