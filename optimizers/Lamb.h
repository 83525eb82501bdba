// LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning"): an Adam direction plus decoupled
// weight decay, u = m^/(sqrt(v^)+eps) + wd*p, scaled per parameter tensor by the trust ratio ||p||/||u||
// (1 where either norm is 0): p -= lr * ratio * u.
// NVLAMB (NVIDIA's BERT recipe): the same after dividing the whole gradient by its global L2 norm.
#pragma once
#include "optimizers/FlatOptimizer.h"

namespace bs::optim {

// Per-parameter trust ratios w/u, with 1 where either norm is 0 (float64 in, float64 out).
torch::Tensor lamb_trust_ratio(const torch::Tensor& weight_norms, const torch::Tensor& update_norms);

class Lamb : public FlatOptimizer {
 public:
  Lamb(const bs::OptimizerConfig& cfg, std::vector<FlatParamGroup> groups, bool normalize_by_global_norm);
  std::string name() const override { return nv_ ? "nvlamb" : "lamb"; }

 protected:
  void prepare_step() override;
  void update(FlatParamGroup& group, State& state, double lr, int64_t step, double weight_decay) override;

 private:
  bool nv_;
  torch::Tensor grad_scale_;  // NVLAMB: 1 / global gradient norm of this step (0-dim, on the device: no host read)
};

}  // namespace bs::optim
