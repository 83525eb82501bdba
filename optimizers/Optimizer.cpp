#include "optimizers/Optimizer.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

#include "common/Choices.h"
#include "optimizers/Adam.h"
#include "optimizers/Lamb.h"
#include "optimizers/Lans.h"
#include "optimizers/SgdMomentum.h"

namespace bs::optim {

const std::vector<std::string>& optimizer_names() { return bs::choice_values("optimizer.name"); }

namespace {

bool excluded_from_decay(const std::string& name, const std::vector<std::string>& no_decay) {
  for (const auto& s : no_decay)
    if (!s.empty() && name.find(s) != std::string::npos) return true;
  return false;
}

std::vector<FlatParamGroup> build_groups(const bs::OptimizerConfig& cfg, const NamedParams& params, Grouping grouping) {
  // Group key: decay first (decay groups come first), then dtype and device; order of first appearance kept.
  using Key = std::tuple<bool, int, std::string>;
  std::vector<Key> order;
  std::map<Key, std::pair<std::vector<std::string>, std::vector<torch::Tensor>>> members;
  std::set<const void*> seen;
  for (const auto& [name, p] : params) {
    if (!p.defined() || !p.requires_grad()) continue;
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;  // tied weights: optimise once
    Key key{!excluded_from_decay(name, cfg.no_decay), static_cast<int>(p.scalar_type()), p.device().str()};
    if (!members.count(key)) order.push_back(key);
    members[key].first.push_back(name);
    members[key].second.push_back(p);
  }
  if (order.empty()) throw std::invalid_argument("make_optimizer: no parameter requires grad; nothing to optimise");
  std::stable_sort(order.begin(), order.end(),
                   [](const Key& a, const Key& b) { return std::get<0>(a) > std::get<0>(b); });
  std::vector<FlatParamGroup> groups;
  for (const auto& key : order) {
    auto& [names, tensors] = members[key];
    const bool decay = std::get<0>(key);
    if (grouping == Grouping::flattened) {
      groups.emplace_back(names, tensors, decay);
    } else {
      for (size_t i = 0; i < names.size(); ++i)
        groups.emplace_back(std::vector{names[i]}, std::vector{tensors[i]}, decay);
    }
  }
  return groups;
}

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const bs::OptimizerConfig& cfg, const NamedParams& params,
                                          Grouping grouping) {
  const bs::OptimizerKind kind = bs::parse_choice<bs::OptimizerKind>(cfg.name);
  auto groups = build_groups(cfg, params, grouping);
  std::unique_ptr<FlatOptimizer> opt;
  switch (kind) {
    case bs::OptimizerKind::kAdam: opt = std::make_unique<Adam>(cfg, std::move(groups), false); break;
    case bs::OptimizerKind::kAdamW: opt = std::make_unique<Adam>(cfg, std::move(groups), true); break;
    case bs::OptimizerKind::kLamb: opt = std::make_unique<Lamb>(cfg, std::move(groups), false); break;
    case bs::OptimizerKind::kNvLamb: opt = std::make_unique<Lamb>(cfg, std::move(groups), true); break;
    case bs::OptimizerKind::kLans: opt = std::make_unique<Lans>(cfg, std::move(groups)); break;
    case bs::OptimizerKind::kSgd: opt = std::make_unique<SgdMomentum>(cfg, std::move(groups)); break;
  }
  // The baseline is a plain loop of whole-tensor ops per parameter.
  if (grouping == Grouping::per_parameter) opt->set_block_size(0);
  return opt;
}

}  // namespace bs::optim
