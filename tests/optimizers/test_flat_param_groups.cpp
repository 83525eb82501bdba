// Flattened parameter groups: parameters and gradients become views into contiguous buffers, backward
// accumulates there, weight-decay exclusion by name, per-parameter norms, checkpoint state, factory errors.
#include <gtest/gtest.h>

#include <sstream>

#include "optimizers/FlatOptimizer.h"
#include "optimizers/Optimizer.h"

namespace {

using bs::optim::FlatOptimizer;
using bs::optim::FlatParamGroup;

struct TinyNet : torch::nn::Module {
  TinyNet() {
    dense = register_module("dense", torch::nn::Linear(6, 5));
    LayerNorm = register_module("LayerNorm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({5})));
    head = register_module("head", torch::nn::Linear(5, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(LayerNorm(torch::tanh(dense(x)))); }
  torch::nn::Linear dense{nullptr};
  torch::nn::LayerNorm LayerNorm{nullptr};
  torch::nn::Linear head{nullptr};
};

bs::optim::NamedParams named(torch::nn::Module& m) {
  bs::optim::NamedParams out;
  for (auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

bool inside(const torch::Tensor& t, const torch::Tensor& flat) {
  auto* begin = static_cast<const char*>(flat.data_ptr());
  auto* end = begin + flat.numel() * flat.element_size();
  auto* p = static_cast<const char*>(t.data_ptr());
  return p >= begin && p + t.numel() * t.element_size() <= end;
}

const FlatOptimizer& flat(const bs::optim::Optimizer& o) { return dynamic_cast<const FlatOptimizer&>(o); }

TEST(FlatParamGroups, ParamsAndGradsAreViewsIntoGroupBuffers) {
  torch::manual_seed(1);
  TinyNet net;
  std::vector<torch::Tensor> before;
  for (auto& p : net.parameters()) before.push_back(p.detach().clone());
  bs::OptimizerConfig cfg;
  auto opt = bs::optim::make_optimizer(cfg, named(net));
  const auto& groups = flat(*opt).groups();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_TRUE(groups[0].decay());
  EXPECT_FALSE(groups[1].decay());
  EXPECT_EQ(groups[0].names(), (std::vector<std::string>{"dense.weight", "head.weight"}));
  EXPECT_EQ(groups[1].names(),
            (std::vector<std::string>{"dense.bias", "LayerNorm.weight", "LayerNorm.bias", "head.bias"}));
  auto params = net.parameters();  // what the module itself holds
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(torch::equal(p.detach(), before[i]));
    ASSERT_TRUE(p.grad().defined());
    bool in_some_group = false;
    for (const auto& g : groups)
      if (inside(p, g.params()) && inside(p.grad(), g.grads())) in_some_group = true;
    EXPECT_TRUE(in_some_group) << "parameter " << i;
  }
  // The flat buffers hold the parameters' values: writing through the buffer changes the module.
  torch::NoGradGuard no_grad;
  groups[0].params().add_(1.0);
  EXPECT_TRUE(torch::equal(net.dense->weight.detach(), before[0] + 1.0));
}

TEST(FlatParamGroups, BackwardAccumulatesIntoFlatGradBuffer) {
  torch::manual_seed(2);
  TinyNet net, twin;
  {
    torch::NoGradGuard no_grad;
    auto a = net.parameters(), b = twin.parameters();
    for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
  }
  bs::OptimizerConfig cfg;
  auto opt = bs::optim::make_optimizer(cfg, named(net));
  auto x = torch::randn({4, 6});
  net.forward(x).pow(2).sum().backward();
  twin.forward(x).pow(2).sum().backward();
  auto a = net.parameters(), b = twin.parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i].grad(), b[i].grad())) << i;
  double buffer_sq = 0, twin_sq = 0;
  for (auto& g : opt->grad_buffers()) buffer_sq += g.pow(2).sum().item<double>();
  for (auto& p : b) twin_sq += p.grad().pow(2).sum().item<double>();
  EXPECT_NEAR(buffer_sq, twin_sq, 1e-4 * twin_sq);
  // A second backward accumulates; zero_grad zeroes in place and keeps the views.
  net.forward(x).pow(2).sum().backward();
  EXPECT_TRUE(torch::allclose(a[0].grad(), 2 * b[0].grad()));
  const void* ptr = a[0].grad().data_ptr();
  opt->zero_grad();
  EXPECT_TRUE(a[0].grad().defined());
  EXPECT_EQ(a[0].grad().data_ptr(), ptr);
  for (auto& g : opt->grad_buffers()) EXPECT_EQ(g.abs().sum().item<double>(), 0.0);
}

// If someone drops the grads (Module::zero_grad(set_to_none)) backward makes fresh ones; step() must still
// see them and re-point them into the flat buffer.
TEST(FlatParamGroups, StepReattachesReplacedGradients) {
  torch::manual_seed(3);
  TinyNet net;
  bs::OptimizerConfig cfg;
  cfg.name = "sgd";
  cfg.momentum = 0.0;
  cfg.weight_decay = 0.0;
  auto opt = bs::optim::make_optimizer(cfg, named(net));
  net.zero_grad(/*set_to_none=*/true);
  EXPECT_FALSE(net.dense->weight.grad().defined());
  net.forward(torch::randn({3, 6})).sum().backward();
  std::vector<torch::Tensor> before, grads;
  for (auto& p : net.parameters()) {
    before.push_back(p.detach().clone());
    grads.push_back(p.grad().clone());
  }
  opt->step(1.0);
  auto ps = net.parameters();
  const auto& groups = flat(*opt).groups();
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(torch::allclose(ps[i].detach(), before[i] - grads[i], 1e-6, 1e-6)) << i;
    EXPECT_TRUE(inside(ps[i].grad(), groups[0].grads()) || inside(ps[i].grad(), groups[1].grads()));
  }
}

TEST(FlatParamGroups, NoDecaySubstringsAreConfigurable) {
  bs::OptimizerConfig cfg;
  cfg.no_decay = {"emb"};
  bs::optim::NamedParams params = {{"word_emb.weight", torch::ones({3}).requires_grad_(true)},
                                   {"dense.bias", torch::ones({3}).requires_grad_(true)},
                                   {"frozen.weight", torch::ones({3})}};  // no grad: skipped
  auto opt = bs::optim::make_optimizer(cfg, params);
  const auto& groups = flat(*opt).groups();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].names(), std::vector<std::string>{"dense.bias"});
  EXPECT_TRUE(groups[0].decay());
  EXPECT_EQ(groups[1].names(), std::vector<std::string>{"word_emb.weight"});
  EXPECT_FALSE(groups[1].decay());
  // Zero gradient: AdamW moves only the decayed parameter (decoupled decay), the excluded one stays.
  opt->step(0.5);
  EXPECT_FLOAT_EQ(params[1].second[0].item<float>(), 1.0f - 0.5f * 0.01f);
  EXPECT_FLOAT_EQ(params[0].second[0].item<float>(), 1.0f);
}

TEST(FlatParamGroups, TiedWeightsAreOptimisedOnce) {
  auto shared = torch::randn({4, 3}).requires_grad_(true);
  bs::OptimizerConfig cfg;
  auto opt = bs::optim::make_optimizer(cfg, {{"embeddings.word.weight", shared}, {"decoder.weight", shared}});
  const auto& groups = flat(*opt).groups();
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].num_params(), 1);
}

TEST(FlatParamGroups, SegmentNormsAndScalingPerParameter) {
  torch::manual_seed(4);
  std::vector<torch::Tensor> ps = {torch::randn({3, 300}, torch::kDouble), torch::randn({7}, torch::kDouble),
                                   torch::zeros({5}, torch::kDouble), torch::randn({1025}, torch::kDouble)};
  std::vector<torch::Tensor> copies;
  for (auto& p : ps) {
    copies.push_back(p.clone());
    p.requires_grad_(true);
  }
  FlatParamGroup group({"a", "b", "c", "d"}, ps, true, 512);
  EXPECT_EQ(group.numel() % 512, 0);
  auto norms = group.segment_norms(group.params());
  ASSERT_EQ(norms.numel(), 4);
  for (size_t i = 0; i < ps.size(); ++i)
    EXPECT_NEAR(norms[i].item<double>(), copies[i].norm().item<double>(), 1e-12) << i;
  auto buf = group.params().clone();
  group.scale_segments_(buf, torch::tensor({2.0, 3.0, 4.0, 0.5}, torch::kDouble));
  const std::vector<double> scales = {2.0, 3.0, 4.0, 0.5};
  for (size_t i = 0; i < ps.size(); ++i) {
    auto slice = buf.narrow(0, group.offsets()[i], ps[i].numel()).view(ps[i].sizes());
    EXPECT_TRUE(torch::allclose(slice, copies[i] * scales[i])) << i;
  }
}

TEST(OptimizerState, SaveLoadResumesExactly) {
  for (const std::string name : {"adam", "adamw", "lamb", "nvlamb", "lans", "sgd"}) {
    SCOPED_TRACE(name);
    torch::manual_seed(5);
    auto init = torch::randn({10});
    auto make_params = [&] {
      return bs::optim::NamedParams{{"w.weight", init.clone().requires_grad_(true)},
                                    {"w.bias", init.narrow(0, 0, 3).clone().requires_grad_(true)}};
    };
    bs::OptimizerConfig cfg;
    cfg.name = name;
    auto pa = make_params();
    auto a = bs::optim::make_optimizer(cfg, pa);
    auto set_grads = [](bs::optim::NamedParams& ps, int t) {
      torch::NoGradGuard no_grad;
      for (auto& [n, p] : ps) p.grad().copy_(torch::sin(torch::arange(p.numel()).to(p.dtype()) * (t + 1)));
    };
    for (int t = 0; t < 3; ++t) {
      set_grads(pa, t);
      a->step(0.01);
    }
    std::stringstream stream;
    {
      torch::serialize::OutputArchive ar;
      a->save(ar);
      ar.save_to(stream);
    }
    // The resumed optimizer starts from the same parameters (as a checkpointed model would).
    auto pb = make_params();
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < pb.size(); ++i) pb[i].second.copy_(pa[i].second);
    }
    auto b = bs::optim::make_optimizer(cfg, pb);
    {
      torch::serialize::InputArchive ar;
      ar.load_from(stream);
      b->load(ar);
    }
    EXPECT_EQ(b->steps_taken(), 3);
    for (int t = 3; t < 5; ++t) {
      set_grads(pa, t);
      set_grads(pb, t);
      a->step(0.01);
      b->step(0.01);
    }
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << i;
    // A fresh optimizer that did not load diverges (so the check above is meaningful for stateful rules).
    if (name != "sgd" || cfg.momentum > 0) {
      auto pc = make_params();
      {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < pc.size(); ++i) pc[i].second.copy_(pb[i].second);
      }
      auto c = bs::optim::make_optimizer(cfg, pc);
      set_grads(pb, 5);
      set_grads(pc, 5);
      b->step(0.01);
      c->step(0.01);
      EXPECT_FALSE(torch::equal(pb[0].second, pc[0].second));
    }
  }
}

TEST(OptimizerState, LoadRejectsOtherOptimizerOrModel) {
  bs::OptimizerConfig cfg;
  cfg.name = "adam";
  bs::optim::NamedParams p1 = {{"w.weight", torch::randn({6}).requires_grad_(true)}};
  auto a = bs::optim::make_optimizer(cfg, p1);
  std::stringstream stream;
  torch::serialize::OutputArchive out;
  a->save(out);
  out.save_to(stream);
  auto load_into = [&](const bs::OptimizerConfig& c, bs::optim::NamedParams ps) {
    stream.seekg(0);
    torch::serialize::InputArchive in;
    in.load_from(stream);
    bs::optim::make_optimizer(c, ps)->load(in);
  };
  bs::OptimizerConfig lamb = cfg;
  lamb.name = "lamb";
  EXPECT_THROW(load_into(lamb, {{"w.weight", torch::randn({6}).requires_grad_(true)}}), std::runtime_error);
  EXPECT_THROW(load_into(cfg, {{"w.weight", torch::randn({7}).requires_grad_(true)}}), std::runtime_error);
  EXPECT_NO_THROW(load_into(cfg, {{"w.weight", torch::randn({6}).requires_grad_(true)}}));
}

TEST(MakeOptimizer, UnknownNameIsAConfigErrorNamingTheKey) {
  bs::OptimizerConfig cfg;
  cfg.name = "adagrad";
  bs::optim::NamedParams params = {{"w.weight", torch::randn({3}).requires_grad_(true)}};
  try {
    bs::optim::make_optimizer(cfg, params);
    FAIL() << "no exception";
  } catch (const bs::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.name"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("adagrad"), std::string::npos) << e.what();
  }
}

TEST(MakeOptimizer, EveryNameBuildsAndReportsItself) {
  for (const auto& name : bs::optim::optimizer_names()) {
    bs::OptimizerConfig cfg;
    cfg.name = name;
    bs::optim::NamedParams params = {{"w.weight", torch::randn({3}).requires_grad_(true)}};
    EXPECT_EQ(bs::optim::make_optimizer(cfg, params)->name(), name);
  }
}

}  // namespace
