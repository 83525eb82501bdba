#include "optimizers/Lans.h"

#include <cmath>

#include "optimizers/Lamb.h"

namespace bs::optim {

Lans::Lans(const bs::OptimizerConfig& cfg, std::vector<FlatParamGroup> groups)
    : FlatOptimizer(cfg, std::move(groups), {"exp_avg", "exp_avg_sq"}) {}

void Lans::update(FlatParamGroup& group, State& state, double lr, int64_t step, double weight_decay) {
  const double b1 = cfg_.beta1, b2 = cfg_.beta2;
  const double bc1 = bias_correction1(step), sqrt_bc2 = std::sqrt(bias_correction2(step));
  const auto dtype = group.params().scalar_type();
  // Per-parameter normalised gradient g~ = g/||g||; a zero gradient stays zero.
  auto g_norms = group.segment_norms(group.grads());
  auto inv_rows = group.row_scales(torch::where(g_norms.gt(0), g_norms.reciprocal(), torch::ones_like(g_norms)), dtype);
  auto r_all = scratch(state, "r", group, true), c_all = scratch(state, "c", group, true);
  auto denom_buf = scratch(state, "denom", group, false);
  auto &m_all = state.at("exp_avg"), &v_all = state.at("exp_avg_sq");
  // Pass 1: moments of g~, r = m^/(sqrt(v^)+eps) + wd*p and c = g~/(sqrt(v^)+eps) + wd*p.
  for_each_block(group, [&](int64_t start, int64_t len) {
    auto p = group.params().narrow(0, start, len);
    auto m = m_all.narrow(0, start, len), v = v_all.narrow(0, start, len);
    auto r = r_all.narrow(0, start, len), c = c_all.narrow(0, start, len);
    auto denom = denom_buf.narrow(0, 0, len);
    c.copy_(group.grads().narrow(0, start, len));
    group.scale_block_(c, inv_rows, start);  // c holds g~ until it becomes c
    m.mul_(b1).add_(c, 1.0 - b1);
    v.mul_(b2).addcmul_(c, c, 1.0 - b2);
    torch::sqrt_out(denom, v).div_(sqrt_bc2).add_(cfg_.eps);
    torch::div_out(r, m, denom).div_(bc1);
    torch::div_out(c, c, denom);
    if (weight_decay != 0) {
      r.add_(p, weight_decay);
      c.add_(p, weight_decay);
    }
  });
  // Pass 2: p -= lr*b1 * ratio_r * r + lr*(1-b1) * ratio_c * c.
  auto w_norms = group.segment_norms(group.params());
  auto r_scales = group.row_scales(lamb_trust_ratio(w_norms, group.segment_norms(r_all)) * (-lr * b1), dtype);
  auto c_scales = group.row_scales(lamb_trust_ratio(w_norms, group.segment_norms(c_all)) * (-lr * (1.0 - b1)), dtype);
  for_each_block(group, [&](int64_t start, int64_t len) {
    auto r = r_all.narrow(0, start, len), c = c_all.narrow(0, start, len);
    group.scale_block_(r, r_scales, start);
    group.scale_block_(c, c_scales, start);
    group.params().narrow(0, start, len).add_(r).add_(c);
  });
}

}  // namespace bs::optim
