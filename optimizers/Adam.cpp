#include "optimizers/Adam.h"

#include <cmath>

namespace bs::optim {

Adam::Adam(const bs::OptimizerConfig& cfg, std::vector<FlatParamGroup> groups, bool decoupled_weight_decay)
    : FlatOptimizer(cfg, std::move(groups), {"exp_avg", "exp_avg_sq"}), decoupled_(decoupled_weight_decay) {}

void Adam::update(FlatParamGroup& group, State& state, double lr, int64_t step, double weight_decay) {
  auto p = group.params();
  torch::Tensor g = group.grads();
  if (weight_decay != 0) {
    if (decoupled_)
      p.mul_(1.0 - lr * weight_decay);
    else
      g = g.add(p, weight_decay);
  }
  auto& m = state.at("exp_avg");
  auto& v = state.at("exp_avg_sq");
  m.mul_(cfg_.beta1).add_(g, 1.0 - cfg_.beta1);
  v.mul_(cfg_.beta2).addcmul_(g, g, 1.0 - cfg_.beta2);
  auto denom = v.sqrt().div_(std::sqrt(bias_correction2(step))).add_(cfg_.eps);
  p.addcdiv_(m, denom, -lr / bias_correction1(step));
}

}  // namespace bs::optim
