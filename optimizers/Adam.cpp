#include "optimizers/Adam.h"

#include <cmath>

#include "kernels/FusedOptimizer.h"

namespace bs::optim {

Adam::Adam(const bs::OptimizerConfig& cfg, std::vector<FlatParamGroup> groups, bool decoupled_weight_decay)
    : FlatOptimizer(cfg, std::move(groups), {"exp_avg", "exp_avg_sq"}), decoupled_(decoupled_weight_decay) {}

void Adam::update(FlatParamGroup& group, State& state, double lr, int64_t step, double weight_decay) {
  const double b1 = cfg_.beta1, b2 = cfg_.beta2;
  const double step_size = -lr / bias_correction1(step), sqrt_bc2 = std::sqrt(bias_correction2(step));
  auto &m_all = state.at("exp_avg"), &v_all = state.at("exp_avg_sq");
  const auto& params = group.params();
  if (params.is_cpu() && params.scalar_type() == torch::kFloat && group.grads().scalar_type() == torch::kFloat) {
    // One pass over p, g, m, v instead of eight block-wise LibTorch ops (BENCHMARKS.md section 11: the update
    // took 16% of a bert-base step that way).
    kernels::AdamStepArgs a;
    a.lr = lr;
    a.beta1 = b1;
    a.beta2 = b2;
    a.eps = cfg_.eps;
    a.weight_decay = weight_decay;
    a.step_size = step_size;
    a.sqrt_bc2 = sqrt_bc2;
    a.decoupled = decoupled_;
    kernels::adam_step(params.data_ptr<float>(), group.grads().data_ptr<float>(), m_all.data_ptr<float>(),
                       v_all.data_ptr<float>(), group.numel(), a);
    return;
  }
  auto denom_buf = scratch(state, "denom", group, false);
  auto grad_buf = scratch(state, "grad", group, false);
  for_each_block(group, [&](int64_t start, int64_t len) {
    auto p = group.params().narrow(0, start, len);
    auto g = group.grads().narrow(0, start, len);
    auto m = m_all.narrow(0, start, len), v = v_all.narrow(0, start, len);
    auto denom = denom_buf.narrow(0, 0, len);
    if (weight_decay != 0) {
      if (decoupled_) {
        p.mul_(1.0 - lr * weight_decay);
      } else {  // L2: the decay term joins the gradient
        auto gd = grad_buf.narrow(0, 0, len);
        torch::add_out(gd, g, p, weight_decay);
        g = gd;
      }
    }
    m.mul_(b1).add_(g, 1.0 - b1);
    v.mul_(b2).addcmul_(g, g, 1.0 - b2);
    torch::sqrt_out(denom, v).div_(sqrt_bc2).add_(cfg_.eps);
    p.addcdiv_(m, denom, step_size);
  });
}

}  // namespace bs::optim
