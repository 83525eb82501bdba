// `bertsweep train`: BERT pretraining to a target masked-LM accuracy, one process or one rank of many.
// The loop is: sampler -> collate -> forward/backward (gradient buckets all-reduced during backward) ->
// clip -> optimizer step -> periodic eval; events for the controller, MLLOG lines, checkpoints.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "common/Errors.h"
#include "common/TrainConfig.h"

namespace bs {

struct TrainOptions {
  std::string events;       // "", "stdout", "fd:N" or a file: trial-protocol JSON lines
  bool quiet = false;       // no progress lines on stderr
  bool resume = false;      // continue from the checkpoint set in checkpoint.dir
  std::string dump_params;  // write final parameters (float32, registration order) here; for tests
};

struct TrainResult {
  bool reached = false;
  int64_t samples = 0;  // samples trained on
  int64_t steps = 0;
  int64_t samples_to_target = -1;  // -1 when not reached
  double seconds_to_target = -1;
  double seconds = 0;  // training wall time (run_start to stop, summed over resumes)
  double final_mlm_accuracy = 0;
};

// Runs the whole training; throws ConfigError, DataError, NonFiniteLoss, Terminated, DistributedError.
TrainResult train(const TrainConfig& cfg, const TrainOptions& opt);

// Installs SIGTERM/SIGINT handlers that ask the loop to stop at the next step boundary.
void install_stop_handlers();

}  // namespace bs
