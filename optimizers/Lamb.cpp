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
  if (!nv_) return;
  std::vector<torch::Tensor> sq;
  for (const auto& g : groups_) sq.push_back(g.grads().norm().to(torch::kDouble).square());
  const auto norm = torch::stack(sq).sum().sqrt();
  // 1 where the norm is 0 or not finite (as before: the step then runs unscaled).
  grad_scale_ = torch::where(norm.gt(0).logical_and(torch::isfinite(norm)), norm.reciprocal(), torch::ones_like(norm));
}

void Lamb::update(FlatParamGroup& group, State& state, double lr, int64_t step, double weight_decay) {
  const double b1 = cfg_.beta1, b2 = cfg_.beta2;
  const double bc1 = bias_correction1(step), sqrt_bc2 = std::sqrt(bias_correction2(step));
  auto u_all = scratch(state, "update", group, true);  // kept whole: the trust ratio needs its full norms
  auto grad_buf = scratch(state, "grad", group, false);
  auto &m_all = state.at("exp_avg"), &v_all = state.at("exp_avg_sq");
  // Pass 1: moments and u = (m / bc1) / (sqrt(v / bc2) + eps) + wd * p.
  for_each_block(group, [&](int64_t start, int64_t len) {
    auto p = group.params().narrow(0, start, len);
    auto g = group.grads().narrow(0, start, len);
    auto m = m_all.narrow(0, start, len), v = v_all.narrow(0, start, len), u = u_all.narrow(0, start, len);
    if (nv_) {  // NVLAMB
      auto gs = grad_buf.narrow(0, 0, len);
      torch::mul_out(gs, g, grad_scale_.to(g.scalar_type()));
      g = gs;
    }
    m.mul_(b1).add_(g, 1.0 - b1);
    v.mul_(b2).addcmul_(g, g, 1.0 - b2);
    torch::sqrt_out(u, v).div_(sqrt_bc2).add_(cfg_.eps);
    torch::div_out(u, m, u).div_(bc1);
    if (weight_decay != 0) u.add_(p, weight_decay);
  });
  // Pass 2: p -= lr * ratio * u, with the per-parameter ratio broadcast to rows.
  auto ratio = lamb_trust_ratio(group.segment_norms(group.params()), group.segment_norms(u_all));
  auto scales = group.row_scales(ratio * -lr, u_all.scalar_type());
  for_each_block(group, [&](int64_t start, int64_t len) {
    auto u = u_all.narrow(0, start, len);
    group.scale_block_(u, scales, start);
    group.params().narrow(0, start, len).add_(u);
  });
}

}  // namespace bs::optim
