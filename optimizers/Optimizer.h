// Optimizers over flattened parameter groups (docs/ARCHITECTURE.md section 3): the interface the trainer calls and
// the factory that builds one from the `optimizer:` section of a training config.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "common/TrainConfig.h"

namespace bs::optim {

using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update with learning rate `lr` from the current .grad() of every parameter.
  virtual void step(double lr) = 0;
  // Zeroes gradients IN PLACE (never undefines them).
  virtual void zero_grad() = 0;
  virtual void save(torch::serialize::OutputArchive& ar) const = 0;
  virtual void load(torch::serialize::InputArchive& ar) = 0;
  virtual std::string name() const = 0;

  // The contiguous gradient buffers (one per group) that backward accumulates into; gradient
  // bucketing/allreduce and clipping may work on these directly.
  virtual std::vector<torch::Tensor> grad_buffers() const = 0;
  // The contiguous parameter buffers (fp32 masters under mixed precision), parallel to grad_buffers():
  // a compute copy mirrors their layout so that refreshing it is one cast per buffer.
  virtual std::vector<torch::Tensor> param_buffers() const = 0;
  // Number of step() calls so far (restored by load()).
  virtual int64_t steps_taken() const = 0;
};

// How parameters are laid out: `flattened` is what training uses; `per_parameter` gives every parameter its
// own group (the same update rules applied in a loop of small ops), kept as the baseline for bench/.
enum class Grouping { flattened, per_parameter };

// Parameters named with any substring of cfg.no_decay get weight decay 0. Parameters that do not require
// grad are skipped; a tensor listed twice (tied weights) is optimised once, under its first name.
// After construction every parameter's data AND .grad() are views into the group's contiguous flat buffers
// (param.set_data(view), param.mutable_grad() = view), so backward accumulates straight into the flat grad
// buffer and one vectorised update covers the group. Groups: decay / no-decay (and dtype/device).
// Throws bs::ConfigError naming `optimizer.name` for an unknown name.
std::unique_ptr<Optimizer> make_optimizer(const bs::OptimizerConfig& cfg, const NamedParams& params,
                                          Grouping grouping = Grouping::flattened);

// Names make_optimizer accepts.
const std::vector<std::string>& optimizer_names();

}  // namespace bs::optim
