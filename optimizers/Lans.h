// LANS (Zheng et al. 2020, "Accelerated Large Batch Optimization of BERT Pretraining in 54 minutes"):
// each parameter's gradient is normalised by its own norm, g~ = g/||g||; with Adam moments of g~ and
//   r = m^/(sqrt(v^)+eps) + wd*p,   c = g~/(sqrt(v^)+eps) + wd*p,
//   p -= lr*b1 * ||p||/||r|| * r  +  lr*(1-b1) * ||p||/||c|| * c      (each trust ratio 1 where a norm is 0).
#pragma once
#include "optimizers/FlatOptimizer.h"

namespace bs::optim {

class Lans : public FlatOptimizer {
 public:
  Lans(const bs::OptimizerConfig& cfg, std::vector<FlatParamGroup> groups);
  std::string name() const override { return "lans"; }

 protected:
  void update(FlatParamGroup& group, State& state, double lr, int64_t step, double weight_decay) override;
};

}  // namespace bs::optim
