// Synthetic studies written through the real StudyStore (the same SQLite tables the controller writes).
#pragma once
#include <cstdint>
#include <random>
#include <string>

#include "common/TrainConfig.h"
#include "studies/StudyStore.h"

namespace bs::test {

inline std::string config_for(const std::string& optimizer, int64_t batch, int64_t seed = 1, double lr = 1e-3) {
  TrainConfig c;
  c.optimizer.name = optimizer;
  c.batch.global = batch;
  c.batch.micro = batch;
  c.optimizer.lr = lr;
  c.seed = seed;
  return c.to_yaml_string();
}

inline TrialRecord make_trial(int64_t number, const std::string& state, const std::string& optimizer, int64_t batch,
                              bool reached, std::optional<double> samples) {
  TrialRecord t;
  t.number = number;
  t.state = state;
  t.config_yaml = config_for(optimizer, batch, 1, 1e-3 * (1 + number));
  t.reached = reached;
  t.samples_to_target = samples;
  if (state == trial_state::kComplete && samples) t.values = {*samples};
  return t;
}

// `n` trials with random optimizer, batch, state and samples (seeded, so a failure reproduces).
inline void fill_random_study(StudyStore& store, int n, unsigned seed) {
  std::mt19937 rng(seed);
  const char* opts[] = {"adamw", "lamb", "lans"};
  const int64_t batches[] = {32, 64, 128};
  const char* states[] = {trial_state::kComplete, trial_state::kComplete, trial_state::kComplete, trial_state::kPruned,
                          trial_state::kFail};
  for (int i = 0; i < n; ++i) {
    std::string state = states[rng() % 5];
    bool reached = state == trial_state::kComplete && rng() % 4 != 0;
    std::optional<double> samples;
    if (reached) samples = 1000.0 * (1 + rng() % 50) + (rng() % 7) * 0.25;
    else if (state == trial_state::kComplete)
      samples = 99999.0;  // what a budget-capped objective might hold
    auto t = make_trial(i, state, opts[rng() % 3], batches[rng() % 3], reached, reached ? samples : std::nullopt);
    if (state == trial_state::kComplete) t.values = {*samples};
    store.insert_trial(t);
  }
}

}  // namespace bs::test
