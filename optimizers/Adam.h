// Adam (Kingma & Ba 2015) with L2 weight decay added to the gradient, and AdamW (Loshchilov & Hutter 2019)
// with decoupled weight decay p *= 1 - lr*wd; both as in torch::optim::Adam/AdamW:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr/bc1 * m / (sqrt(v/bc2) + eps)
#pragma once
#include "optimizers/FlatOptimizer.h"

namespace bs::optim {

class Adam : public FlatOptimizer {
 public:
  Adam(const bs::OptimizerConfig& cfg, std::vector<FlatParamGroup> groups, bool decoupled_weight_decay);
  std::string name() const override { return decoupled_ ? "adamw" : "adam"; }

 protected:
  void update(FlatParamGroup& group, State& state, double lr, int64_t step, double weight_decay) override;

 private:
  bool decoupled_;
};

}  // namespace bs::optim
