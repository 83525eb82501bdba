// Learning-rate schedules from the `schedule:` config section. Every schedule starts with a linear warmup
// (MLPerf BERT style: lr = base * (step - start_warmup_step) / warmup, 0 before the offset), then:
//   constant  base
//   poly      (base - end_lr) * (1 - min(step, total)/total)^power + end_lr   (MLPerf: decay over the global step)
//   linear    base -> end_lr linearly from the end of warmup to total_steps
//   cosine    end_lr + (base - end_lr) * (1 + cos(pi * progress)) / 2, progress from end of warmup to total
//   inv_sqrt  base * sqrt(max(warmup,1) / max(step, warmup, 1))
#pragma once
#include <cstdint>

#include "common/Choices.h"
#include "common/TrainConfig.h"

namespace bs::optim {

class LrSchedule {
 public:
  // Throws bs::ConfigError naming the key when the schedule needs total_steps (> 0) and gets none.
  LrSchedule(const bs::ScheduleConfig& cfg, double base_lr, int64_t total_steps);
  double lr_at(int64_t step) const;  // step = number of optimizer steps already taken (0 for the first)
  int64_t warmup_steps() const { return warmup_; }
  int64_t total_steps() const { return total_; }

 private:
  bs::ScheduleConfig cfg_;
  bs::ScheduleKind kind_;
  double base_;
  int64_t total_;
  int64_t warmup_;
};

}  // namespace bs::optim
