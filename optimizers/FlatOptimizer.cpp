#include "optimizers/FlatOptimizer.h"

#include <cmath>
#include <stdexcept>

namespace bs::optim {

FlatOptimizer::FlatOptimizer(const bs::OptimizerConfig& cfg, std::vector<FlatParamGroup> groups,
                             std::vector<std::string> state_names)
    : cfg_(cfg), groups_(std::move(groups)) {
  torch::NoGradGuard no_grad;
  for (const auto& g : groups_) {
    State s;
    for (const auto& n : state_names) s[n] = torch::zeros_like(g.params());
    states_.push_back(std::move(s));
  }
}

void FlatOptimizer::step(double lr) {
  torch::NoGradGuard no_grad;
  for (auto& g : groups_) g.reattach();
  ++step_;
  prepare_step();
  for (size_t i = 0; i < groups_.size(); ++i)
    update(groups_[i], states_[i], lr, step_, groups_[i].decay() ? cfg_.weight_decay : 0.0);
}

void FlatOptimizer::zero_grad() {
  torch::NoGradGuard no_grad;
  for (auto& g : groups_) g.zero_grad();
}

std::vector<torch::Tensor> FlatOptimizer::grad_buffers() const {
  std::vector<torch::Tensor> out;
  for (const auto& g : groups_) out.push_back(g.grads());
  return out;
}

std::vector<torch::Tensor> FlatOptimizer::param_buffers() const {
  std::vector<torch::Tensor> out;
  for (const auto& g : groups_) out.push_back(g.params());
  return out;
}

namespace {
constexpr const char* kScratchPrefix = "scratch_";
bool is_scratch(const std::string& name) { return name.rfind(kScratchPrefix, 0) == 0; }
}  // namespace

int64_t FlatOptimizer::block_size(const FlatParamGroup& group) const {
  const bool blocked = group.params().device().is_cpu() && block_elements_ > 0;
  return blocked ? block_elements_ : std::max<int64_t>(group.numel(), 1);
}

torch::Tensor FlatOptimizer::scratch(State& state, const std::string& name, const FlatParamGroup& group,
                                     bool full_size) const {
  auto& t = state[kScratchPrefix + name];
  const int64_t n = full_size ? group.numel() : std::min(block_size(group), group.numel());
  if (!t.defined() || t.numel() != n) t = torch::empty({n}, group.params().options());
  return t;
}

double FlatOptimizer::bias_correction1(int64_t step) const {
  return cfg_.bias_correction ? 1.0 - std::pow(cfg_.beta1, static_cast<double>(step)) : 1.0;
}
double FlatOptimizer::bias_correction2(int64_t step) const {
  return cfg_.bias_correction ? 1.0 - std::pow(cfg_.beta2, static_cast<double>(step)) : 1.0;
}

// Archive keys avoid '.', which the archive uses for nesting.
void FlatOptimizer::save(torch::serialize::OutputArchive& ar) const {
  ar.write("optimizer_name", c10::IValue(name()));
  ar.write("step", torch::tensor(step_, torch::kLong));
  ar.write("num_groups", torch::tensor(static_cast<int64_t>(groups_.size()), torch::kLong));
  for (size_t i = 0; i < groups_.size(); ++i) {
    const std::string prefix = "group" + std::to_string(i) + "_";
    ar.write(prefix + "numel", torch::tensor(groups_[i].numel(), torch::kLong));
    for (const auto& [n, t] : states_[i])
      if (!is_scratch(n)) ar.write(prefix + n, t);
  }
}

void FlatOptimizer::load(torch::serialize::InputArchive& ar) {
  const std::string where = "optimizer state (checkpoint)";
  c10::IValue saved_name;
  ar.read("optimizer_name", saved_name);
  if (!saved_name.isString() || saved_name.toStringRef() != name())
    throw std::runtime_error(where + ": saved by optimizer '" +
                             (saved_name.isString() ? saved_name.toStringRef() : std::string("?")) +
                             "', but this run uses '" + name() + "'; set optimizer.name to match or start fresh");
  auto read_tensor = [&](const std::string& key) {
    torch::Tensor t;  // undefined: the archive hands over its own tensor, ours stay untouched until checked
    ar.read(key, t);
    return t;
  };
  const int64_t n_groups = read_tensor("num_groups").item<int64_t>();
  if (n_groups != static_cast<int64_t>(groups_.size()))
    throw std::runtime_error(where + ": has " + std::to_string(n_groups) + " parameter groups, this model has " +
                             std::to_string(groups_.size()) + "; the model or optimizer.no_decay differs");
  std::vector<State> loaded(groups_.size());
  for (size_t i = 0; i < groups_.size(); ++i) {
    const std::string prefix = "group" + std::to_string(i) + "_";
    const int64_t numel = read_tensor(prefix + "numel").item<int64_t>();
    if (numel != groups_[i].numel())
      throw std::runtime_error(where + ": group " + std::to_string(i) + " has " + std::to_string(numel) +
                               " elements, this model's has " + std::to_string(groups_[i].numel()) +
                               "; the model config differs from the checkpoint's");
    for (const auto& [n, t] : states_[i])
      if (!is_scratch(n)) loaded[i][n] = read_tensor(prefix + n);
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < groups_.size(); ++i)
    for (auto& [n, t] : loaded[i]) states_[i].at(n).copy_(t.reshape(states_[i].at(n).sizes()));
  step_ = read_tensor("step").item<int64_t>();
}

}  // namespace bs::optim
