#include "optimizers/SgdMomentum.h"

namespace bs::optim {

SgdMomentum::SgdMomentum(const bs::OptimizerConfig& cfg, std::vector<FlatParamGroup> groups)
    : FlatOptimizer(cfg, std::move(groups), {"momentum_buffer"}) {}

void SgdMomentum::update(FlatParamGroup& group, State& state, double lr, int64_t /*step*/, double weight_decay) {
  auto grad_buf = scratch(state, "grad", group, false);
  auto& b_all = state.at("momentum_buffer");
  for_each_block(group, [&](int64_t start, int64_t len) {
    auto p = group.params().narrow(0, start, len);
    auto g = group.grads().narrow(0, start, len);
    auto b = b_all.narrow(0, start, len);
    if (weight_decay != 0) {
      auto gd = grad_buf.narrow(0, 0, len);
      torch::add_out(gd, g, p, weight_decay);
      g = gd;
    }
    b.mul_(cfg_.momentum).add_(g);
    if (cfg_.nesterov) p.add_(g, -lr).add_(b, -lr * cfg_.momentum);
    else
      p.add_(b, -lr);
  });
}

}  // namespace bs::optim
