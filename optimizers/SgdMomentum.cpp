#include "optimizers/SgdMomentum.h"

namespace bs::optim {

SgdMomentum::SgdMomentum(const bs::OptimizerConfig& cfg, std::vector<FlatParamGroup> groups)
    : FlatOptimizer(cfg, std::move(groups), {"momentum_buffer"}) {}

void SgdMomentum::update(FlatParamGroup& group, State& state, double lr, int64_t /*step*/, double weight_decay) {
  auto p = group.params();
  torch::Tensor g = group.grads();
  if (weight_decay != 0) g = g.add(p, weight_decay);
  auto& b = state.at("momentum_buffer");
  b.mul_(cfg_.momentum).add_(g);
  if (cfg_.nesterov)
    p.add_(g, -lr).add_(b, -lr * cfg_.momentum);
  else
    p.add_(b, -lr);
}

}  // namespace bs::optim
