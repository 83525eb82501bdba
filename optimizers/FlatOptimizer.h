// The common part of every optimizer here: flat parameter groups, their state buffers (one flat buffer per
// state and group), the step counter, zero_grad and checkpoint save/load. Subclasses supply the update rule.
#pragma once
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "optimizers/FlatParamGroup.h"
#include "optimizers/Optimizer.h"

namespace bs::optim {

class FlatOptimizer : public Optimizer {
 public:
  using State = std::map<std::string, torch::Tensor>;  // state name -> flat buffer like the group's params

  FlatOptimizer(const bs::OptimizerConfig& cfg, std::vector<FlatParamGroup> groups,
                std::vector<std::string> state_names);

  void step(double lr) override;
  void zero_grad() override;
  void save(torch::serialize::OutputArchive& ar) const override;
  void load(torch::serialize::InputArchive& ar) override;
  std::vector<torch::Tensor> grad_buffers() const override;
  std::vector<torch::Tensor> param_buffers() const override;
  int64_t steps_taken() const override { return step_; }

  const std::vector<FlatParamGroup>& groups() const { return groups_; }
  const State& state(size_t group) const { return states_.at(group); }
  const bs::OptimizerConfig& config() const { return cfg_; }
  // Elements per block of the CPU update (a multiple of 512); 0 = whole buffers (the per-parameter baseline).
  void set_block_size(int64_t elements) { block_elements_ = elements; }

 protected:
  // Called once per step() before the groups are updated (e.g. NVLAMB's global gradient norm).
  virtual void prepare_step() {}
  // Updates one group in place; `step` counts from 1, `weight_decay` is 0 for no-decay groups.
  virtual void update(FlatParamGroup& group, State& state, double lr, int64_t step, double weight_decay) = 0;

  // Elementwise work runs block by block over the flat buffers: on CPU a block is cache-sized, so it passes
  // through all of a rule's ops while in cache and temporaries stay small; on a GPU a block is the whole buffer.
  template <class Fn>
  void for_each_block(const FlatParamGroup& group, Fn&& fn) const {
    const int64_t n = group.numel(), b = block_size(group);
    for (int64_t start = 0; start < n; start += b) fn(start, std::min(b, n - start));
  }
  int64_t block_size(const FlatParamGroup& group) const;
  // Working memory of a group kept across steps (never saved): `block` sized or the group's full size.
  torch::Tensor scratch(State& state, const std::string& name, const FlatParamGroup& group, bool full_size) const;

  // Adam-style bias corrections 1 - beta^step (1 when bias_correction is off).
  double bias_correction1(int64_t step) const;
  double bias_correction2(int64_t step) const;

  bs::OptimizerConfig cfg_;
  std::vector<FlatParamGroup> groups_;
  std::vector<State> states_;
  int64_t step_ = 0;
  int64_t block_elements_ = 1 << 16;  // 256 KiB of float32 per buffer: a block's working set stays in L2
};

}  // namespace bs::optim
