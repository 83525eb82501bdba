#include "optimizers/Lamb.h"

#include <cmath>

namespace bs::optim {

torch::Tensor lamb_trust_ratio(const torch::Tensor& weight_norms, const torch::Tensor& update_norms) {
  auto both_positive = weight_norms.gt(0).logical_and(update_norms.gt(0));
  return torch::where(both_positive, weight_norms / update_norms, torch::ones_like(weight_norms));
}

Lamb::Lamb(const bs::OptimizerConfig& cfg, std::vector<FlatParamGroup> groups, bool normalize_by_global_norm)
    : FlatOptimizer(cfg, std::move(groups), {"exp_avg", "exp_avg_sq"}), nv_(normalize_by_global_norm) {}

void Lamb::prepare_step() {
  grad_scale_ = 1.0;
  if (!nv_) return;
  std::vector<torch::Tensor> sq;
  for (const auto& g : groups_) sq.push_back(g.grads().norm().to(torch::kDouble).square());
  const double norm = std::sqrt(torch::stack(sq).sum().item<double>());
  if (norm > 0 && std::isfinite(norm)) grad_scale_ = 1.0 / norm;
}

void Lamb::update(FlatParamGroup& group, State& state, double lr, int64_t step, double weight_decay) {
  auto p = group.params();
  torch::Tensor g = group.grads();
  if (grad_scale_ != 1.0) g = g.mul(grad_scale_);
  auto& m = state.at("exp_avg");
  auto& v = state.at("exp_avg_sq");
  m.mul_(cfg_.beta1).add_(g, 1.0 - cfg_.beta1);
  v.mul_(cfg_.beta2).addcmul_(g, g, 1.0 - cfg_.beta2);
  // u = (m / bc1) / (sqrt(v / bc2) + eps) + wd * p, built in one temporary buffer.
  auto u = v.sqrt().div_(std::sqrt(bias_correction2(step))).add_(cfg_.eps);
  torch::div_out(u, m, u).div_(bias_correction1(step));
  if (weight_decay != 0) u.add_(p, weight_decay);
  auto ratio = lamb_trust_ratio(group.segment_norms(p), group.segment_norms(u));
  group.scale_segments_(u, ratio);
  p.add_(u, -lr);
}

}  // namespace bs::optim
