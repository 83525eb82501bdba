// SGD with momentum (optionally Nesterov) and L2 weight decay, as torch::optim::SGD with dampening 0:
//   g += wd*p;  b = momentum*b + g;  p -= lr * (nesterov ? g + momentum*b : b)
#pragma once
#include "optimizers/FlatOptimizer.h"

namespace bs::optim {

class SgdMomentum : public FlatOptimizer {
 public:
  SgdMomentum(const bs::OptimizerConfig& cfg, std::vector<FlatParamGroup> groups);
  std::string name() const override { return "sgd"; }

 protected:
  void update(FlatParamGroup& group, State& state, double lr, int64_t step, double weight_decay) override;
};

}  // namespace bs::optim
