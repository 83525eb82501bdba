#include "optimizers/LrSchedule.h"

#include <algorithm>
#include <cmath>

namespace bs::optim {

LrSchedule::LrSchedule(const bs::ScheduleConfig& cfg, double base_lr, int64_t total_steps)
    : cfg_(cfg), kind_(bs::parse_choice<bs::ScheduleKind>(cfg.name)), base_(base_lr), total_(total_steps) {
  using K = bs::ScheduleKind;
  const bool needs_total = kind_ == K::kPoly || kind_ == K::kLinear || kind_ == K::kCosine ||
                           (cfg.warmup_steps < 0 && cfg.warmup_fraction > 0);
  if (needs_total && total_ <= 0)
    throw bs::ConfigError("schedule.total_steps: schedule '" + cfg.name +
                          "' needs the total number of steps; set schedule.total_steps or target.max_samples");
  warmup_ = cfg.warmup_steps >= 0
                ? cfg.warmup_steps
                : static_cast<int64_t>(std::llround(cfg.warmup_fraction * static_cast<double>(total_)));
}

double LrSchedule::lr_at(int64_t step) const {
  const double s = static_cast<double>(step);
  const double warm_s = static_cast<double>(step - cfg_.start_warmup_step);
  if (warmup_ > 0 && warm_s < static_cast<double>(warmup_))
    return base_ * std::max(0.0, warm_s) / static_cast<double>(warmup_);
  const double end = cfg_.end_lr, T = static_cast<double>(total_);
  const double decay_start = static_cast<double>(std::max<int64_t>(0, warmup_ + cfg_.start_warmup_step));
  using K = bs::ScheduleKind;
  if (kind_ == K::kConstant) return base_;
  if (kind_ == K::kPoly) return (base_ - end) * std::pow(1.0 - std::min(s, T) / T, cfg_.power) + end;
  if (kind_ == K::kInvSqrt) {
    const double w = std::max<double>(1.0, static_cast<double>(warmup_));
    return base_ * std::sqrt(w / std::max(s, w));
  }
  const double span = T - decay_start;
  const double progress = span > 0 ? std::clamp((s - decay_start) / span, 0.0, 1.0) : 1.0;
  if (kind_ == K::kLinear) return base_ + (end - base_) * progress;
  return end + (base_ - end) * 0.5 * (1.0 + std::cos(M_PI * progress));  // cosine
}

}  // namespace bs::optim
