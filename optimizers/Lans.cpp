#include "optimizers/Lans.h"

#include <cmath>

#include "optimizers/Lamb.h"

namespace bs::optim {

Lans::Lans(const bs::OptimizerConfig& cfg, std::vector<FlatParamGroup> groups)
    : FlatOptimizer(cfg, std::move(groups), {"exp_avg", "exp_avg_sq"}) {}

void Lans::update(FlatParamGroup& group, State& state, double lr, int64_t step, double weight_decay) {
  auto p = group.params();
  // Per-parameter normalised gradient; a zero gradient stays zero.
  auto g_norms = group.segment_norms(group.grads());
  auto inv = torch::where(g_norms.gt(0), g_norms.reciprocal(), torch::ones_like(g_norms));
  auto g = group.grads().clone();
  group.scale_segments_(g, inv);

  auto& m = state.at("exp_avg");
  auto& v = state.at("exp_avg_sq");
  m.mul_(cfg_.beta1).add_(g, 1.0 - cfg_.beta1);
  v.mul_(cfg_.beta2).addcmul_(g, g, 1.0 - cfg_.beta2);
  auto denom = v.sqrt().div_(std::sqrt(bias_correction2(step))).add_(cfg_.eps);
  auto r = m.div(denom).div_(bias_correction1(step));
  auto& c = g;  // g~ is not needed after this: c reuses its buffer
  torch::div_out(c, g, denom);
  if (weight_decay != 0) {
    r.add_(p, weight_decay);
    c.add_(p, weight_decay);
  }
  auto w_norms = group.segment_norms(p);
  group.scale_segments_(r, lamb_trust_ratio(w_norms, group.segment_norms(r)) * (lr * cfg_.beta1));
  group.scale_segments_(c, lamb_trust_ratio(w_norms, group.segment_norms(c)) * (lr * (1.0 - cfg_.beta1)));
  p.sub_(r).sub_(c);
}

}  // namespace bs::optim
