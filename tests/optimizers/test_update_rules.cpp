// Every optimizer, step by step, against an independent float64 reference written from the papers'
// formulas with scalar loops (no torch ops), and Adam/AdamW against LibTorch's torch::optim::Adam/AdamW.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "optimizers/FlatOptimizer.h"
#include "optimizers/Lamb.h"
#include "optimizers/Optimizer.h"

namespace {

using Vec = std::vector<double>;

struct RefParam {
  std::string name;
  std::vector<int64_t> shape;
  Vec p, m, v;  // v doubles as SGD's momentum buffer
  bool decay = true;
};

double norm(const Vec& x) {
  double s = 0;
  for (double e : x) s += e * e;
  return std::sqrt(s);
}

double ratio(double w, double u) { return (w > 0 && u > 0) ? w / u : 1.0; }

// One step of the reference optimizer, from the papers' formulas; t counts from 1.
void reference_step(const bs::OptimizerConfig& c, std::vector<RefParam>& ps, std::vector<Vec> grads, double lr, int t) {
  const double bc1 = c.bias_correction ? 1 - std::pow(c.beta1, t) : 1.0;
  const double bc2 = c.bias_correction ? 1 - std::pow(c.beta2, t) : 1.0;
  if (c.name == "nvlamb") {  // whole gradient divided by its global norm
    double s = 0;
    for (const auto& g : grads) s += norm(g) * norm(g);
    const double G = std::sqrt(s);
    if (G > 0)
      for (auto& g : grads)
        for (auto& e : g) e /= G;
  }
  for (size_t k = 0; k < ps.size(); ++k) {
    auto& P = ps[k];
    auto g = grads[k];
    const double wd = P.decay ? c.weight_decay : 0.0;
    const size_t n = g.size();
    if (c.name == "adam" || c.name == "adamw") {
      for (size_t i = 0; i < n; ++i) {
        const double gi = c.name == "adam" ? g[i] + wd * P.p[i] : g[i];
        P.m[i] = c.beta1 * P.m[i] + (1 - c.beta1) * gi;
        P.v[i] = c.beta2 * P.v[i] + (1 - c.beta2) * gi * gi;
        double upd = (P.m[i] / bc1) / (std::sqrt(P.v[i] / bc2) + c.eps);
        if (c.name == "adamw") upd += wd * P.p[i];
        P.p[i] -= lr * upd;
      }
    } else if (c.name == "lamb" || c.name == "nvlamb") {
      Vec u(n);
      for (size_t i = 0; i < n; ++i) {
        P.m[i] = c.beta1 * P.m[i] + (1 - c.beta1) * g[i];
        P.v[i] = c.beta2 * P.v[i] + (1 - c.beta2) * g[i] * g[i];
        u[i] = (P.m[i] / bc1) / (std::sqrt(P.v[i] / bc2) + c.eps) + wd * P.p[i];
      }
      const double r = ratio(norm(P.p), norm(u));
      for (size_t i = 0; i < n; ++i) P.p[i] -= lr * r * u[i];
    } else if (c.name == "lans") {
      const double gn = norm(g);
      if (gn > 0)
        for (auto& e : g) e /= gn;
      Vec r(n), cc(n);
      for (size_t i = 0; i < n; ++i) {
        P.m[i] = c.beta1 * P.m[i] + (1 - c.beta1) * g[i];
        P.v[i] = c.beta2 * P.v[i] + (1 - c.beta2) * g[i] * g[i];
        const double d = std::sqrt(P.v[i] / bc2) + c.eps;
        r[i] = (P.m[i] / bc1) / d + wd * P.p[i];
        cc[i] = g[i] / d + wd * P.p[i];
      }
      const double wn = norm(P.p), rr = ratio(wn, norm(r)), rc = ratio(wn, norm(cc));
      for (size_t i = 0; i < n; ++i) P.p[i] -= lr * c.beta1 * rr * r[i] + lr * (1 - c.beta1) * rc * cc[i];
    } else if (c.name == "sgd") {
      for (size_t i = 0; i < n; ++i) {
        const double gi = g[i] + wd * P.p[i];
        P.v[i] = c.momentum * P.v[i] + gi;
        P.p[i] -= lr * (c.nesterov ? gi + c.momentum * P.v[i] : P.v[i]);
      }
    } else {
      FAIL() << "no reference for " << c.name;
    }
  }
}

// A small model's parameter set: decay and no-decay names, one parameter that starts at zero and one
// whose gradient is always zero (trust-ratio edge cases inside the normal run).
std::vector<RefParam> make_reference_params(std::mt19937& rng, const std::vector<std::string>& no_decay) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"encoder.dense.weight", {7, 5}}, {"encoder.dense.bias", {7}}, {"encoder.LayerNorm.weight", {7}},
      {"encoder.LayerNorm.bias", {7}},  {"head.weight", {3, 7}},     {"zero_init.weight", {4, 3}},
      {"zero_grad.weight", {6}},        {"big.weight", {30, 250}}};  // spans several blocks
  std::normal_distribution<double> N(0, 1);
  std::vector<RefParam> ps;
  for (auto& [name, shape] : shapes) {
    RefParam P;
    P.name = name;
    P.shape = shape;
    int64_t n = 1;
    for (auto s : shape) n *= s;
    for (int64_t i = 0; i < n; ++i) P.p.push_back(name == "zero_init.weight" ? 0.0 : N(rng));
    P.m.assign(n, 0.0);
    P.v.assign(n, 0.0);
    for (const auto& s : no_decay)
      if (name.find(s) != std::string::npos) P.decay = false;
    ps.push_back(P);
  }
  return ps;
}

torch::Tensor to_tensor(const Vec& x, const std::vector<int64_t>& shape, torch::Dtype dtype) {
  return torch::tensor(x, torch::kDouble).reshape(shape).to(dtype);
}

Vec to_vec(const torch::Tensor& t) {
  auto d = t.detach().to(torch::kDouble).contiguous().reshape({-1});
  return Vec(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

// ||a - b|| / ||b|| on the parameter changes (the parameters themselves barely move relative to their size).
double relative_delta_error(const Vec& start, const Vec& ours, const Vec& ref) {
  Vec d_ours(start.size()), d_ref(start.size()), diff(start.size());
  for (size_t i = 0; i < start.size(); ++i) {
    d_ours[i] = ours[i] - start[i];
    d_ref[i] = ref[i] - start[i];
    diff[i] = d_ours[i] - d_ref[i];
  }
  const double scale = norm(d_ref);
  return scale > 0 ? norm(diff) / scale : norm(diff);
}

struct Case {
  std::string name;
  bool bias_correction = true;
  bool nesterov = false;
};

void check_against_reference(const Case& cs, torch::Dtype dtype, double tol, bs::optim::Grouping grouping) {
  SCOPED_TRACE(cs.name + (cs.bias_correction ? "" : " no-bias-correction") + (cs.nesterov ? " nesterov" : "") +
               (dtype == torch::kDouble ? " float64" : " float32") +
               (grouping == bs::optim::Grouping::flattened ? " flat" : " per-parameter"));
  bs::OptimizerConfig cfg;
  cfg.name = cs.name;
  cfg.bias_correction = cs.bias_correction;
  cfg.nesterov = cs.nesterov;
  cfg.weight_decay = 0.05;
  cfg.beta1 = 0.85;
  cfg.beta2 = 0.99;
  cfg.momentum = 0.8;
  std::mt19937 rng(1234);
  auto ref = make_reference_params(rng, cfg.no_decay);
  // Round the reference's start to the tested dtype so both start from the same values.
  for (auto& P : ref) P.p = to_vec(to_tensor(P.p, P.shape, dtype));
  std::vector<Vec> start;
  bs::optim::NamedParams params;
  for (auto& P : ref) {
    start.push_back(P.p);
    params.emplace_back(P.name, to_tensor(P.p, P.shape, dtype).requires_grad_(true));
  }
  auto opt = bs::optim::make_optimizer(cfg, params, grouping);
  // Small blocks: many block boundaries, some inside a parameter (the default is 64K elements).
  if (grouping == bs::optim::Grouping::flattened) dynamic_cast<bs::optim::FlatOptimizer&>(*opt).set_block_size(1024);
  std::normal_distribution<double> N(0, 1);
  const int steps = 5;
  for (int t = 1; t <= steps; ++t) {
    std::vector<Vec> grads;
    for (auto& P : ref) {
      Vec g(P.p.size());
      for (auto& e : g) e = P.name == "zero_grad.weight" ? 0.0 : N(rng) * (0.5 + t);
      g = to_vec(to_tensor(g, P.shape, dtype));
      grads.push_back(g);
    }
    {
      torch::NoGradGuard no_grad;
      for (size_t k = 0; k < ref.size(); ++k) params[k].second.grad().copy_(to_tensor(grads[k], ref[k].shape, dtype));
    }
    const double lr = (cs.name == "sgd" ? 0.01 : 0.05) * (1.0 + 0.3 * t);
    opt->step(lr);
    reference_step(cfg, ref, grads, lr, t);
    for (size_t k = 0; k < ref.size(); ++k) {
      const double err = relative_delta_error(start[k], to_vec(params[k].second), ref[k].p);
      EXPECT_LT(err, tol) << ref[k].name << " after step " << t;
    }
  }
  // The comparison is on real movement: the reference's first parameter did change.
  EXPECT_GT(relative_delta_error(start[0], ref[0].p, start[0]), 0.0);
}

const std::vector<Case> kCases = {{"adam", true}, {"adam", false}, {"adamw", true},      {"adamw", false},
                                  {"lamb", true}, {"lamb", false}, {"nvlamb", true},     {"nvlamb", false},
                                  {"lans", true}, {"lans", false}, {"sgd", true, false}, {"sgd", true, true}};

TEST(UpdateRules, MatchFloat64ReferenceInFloat64) {
  for (const auto& c : kCases) check_against_reference(c, torch::kDouble, 1e-6, bs::optim::Grouping::flattened);
}

TEST(UpdateRules, MatchFloat64ReferenceInFloat32) {
  for (const auto& c : kCases) check_against_reference(c, torch::kFloat, 1e-4, bs::optim::Grouping::flattened);
}

TEST(UpdateRules, PerParameterGroupingMatchesReferenceToo) {
  for (const auto& c : kCases) check_against_reference(c, torch::kDouble, 1e-6, bs::optim::Grouping::per_parameter);
}

// Adam/AdamW against LibTorch's own implementation (weight decay on every parameter, as torch applies it).
template <class TorchOpt, class TorchOptions>
void check_against_libtorch(const std::string& name, torch::Dtype dtype, double tol) {
  SCOPED_TRACE(name + (dtype == torch::kDouble ? " float64" : " float32"));
  bs::OptimizerConfig cfg;
  cfg.name = name;
  cfg.weight_decay = 0.02;
  cfg.no_decay = {};
  cfg.eps = 1e-6;
  torch::manual_seed(7);
  std::vector<std::vector<int64_t>> shapes = {{8, 4}, {4}, {3, 8}, {700}};
  bs::optim::NamedParams ours;
  std::vector<torch::Tensor> theirs, start;
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto init = torch::randn(shapes[i], torch::dtype(dtype));
    start.push_back(init.clone());
    ours.emplace_back("p" + std::to_string(i) + ".weight", init.clone().requires_grad_(true));
    theirs.push_back(init.clone().requires_grad_(true));
  }
  auto opt = bs::optim::make_optimizer(cfg, ours);
  TorchOpt torch_opt(theirs,
                     TorchOptions(0.1).betas({cfg.beta1, cfg.beta2}).eps(cfg.eps).weight_decay(cfg.weight_decay));
  for (int t = 1; t <= 6; ++t) {
    const double lr = 0.02 * t;
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto g = torch::randn(shapes[i], torch::dtype(dtype)) * t;
      torch::NoGradGuard no_grad;
      ours[i].second.grad().copy_(g);
      theirs[i].mutable_grad() = g.clone();
    }
    static_cast<TorchOptions&>(torch_opt.param_groups()[0].options()).lr(lr);
    torch_opt.step();
    opt->step(lr);
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto d_ours = (ours[i].second.detach() - start[i]).to(torch::kDouble);
      auto d_theirs = (theirs[i].detach() - start[i]).to(torch::kDouble);
      const double err = ((d_ours - d_theirs).norm() / d_theirs.norm()).item<double>();
      EXPECT_LT(err, tol) << "param " << i << " step " << t;
    }
  }
}

TEST(UpdateRules, AdamMatchesLibTorch) {
  check_against_libtorch<torch::optim::Adam, torch::optim::AdamOptions>("adam", torch::kDouble, 1e-10);
  check_against_libtorch<torch::optim::Adam, torch::optim::AdamOptions>("adam", torch::kFloat, 1e-4);
}

TEST(UpdateRules, AdamWMatchesLibTorch) {
  check_against_libtorch<torch::optim::AdamW, torch::optim::AdamWOptions>("adamw", torch::kDouble, 1e-10);
  check_against_libtorch<torch::optim::AdamW, torch::optim::AdamWOptions>("adamw", torch::kFloat, 1e-4);
}

TEST(TrustRatio, OneWhereEitherNormIsZero) {
  auto w = torch::tensor({0.0, 2.0, 3.0, 0.0}, torch::kDouble);
  auto u = torch::tensor({1.0, 0.0, 2.0, 0.0}, torch::kDouble);
  auto r = bs::optim::lamb_trust_ratio(w, u);
  EXPECT_DOUBLE_EQ(r[0].item<double>(), 1.0);
  EXPECT_DOUBLE_EQ(r[1].item<double>(), 1.0);
  EXPECT_DOUBLE_EQ(r[2].item<double>(), 1.5);
  EXPECT_DOUBLE_EQ(r[3].item<double>(), 1.0);
}

// Zero weights: ratio 1, so the first LAMB/LANS step is the plain normalised direction; zero weights with
// zero grads stay exactly zero (no 0/0).
TEST(TrustRatio, ZeroWeightsAndZeroGradsGiveFiniteUpdates) {
  for (const std::string name : {"lamb", "nvlamb", "lans"}) {
    SCOPED_TRACE(name);
    bs::OptimizerConfig cfg;
    cfg.name = name;
    cfg.weight_decay = 0.0;
    bs::optim::NamedParams params = {{"a.weight", torch::zeros({5}, torch::kDouble).requires_grad_(true)},
                                     {"b.weight", torch::zeros({4}, torch::kDouble).requires_grad_(true)}};
    auto opt = bs::optim::make_optimizer(cfg, params);
    auto g = torch::tensor({1.0, -2.0, 0.5, 3.0, -1.0}, torch::kDouble);
    params[0].second.grad().copy_(g);
    opt->step(0.1);
    // Step 1 with bias correction: m^ = g~, v^ = g~^2, so u = g~/(|g~| + eps) ~ sign(g) (LANS: both terms).
    auto expected = -0.1 * g.sign();
    EXPECT_LT((params[0].second.detach() - expected).abs().max().item<double>(), 1e-5);
    EXPECT_TRUE(torch::equal(params[1].second.detach(), torch::zeros({4}, torch::kDouble)));
    EXPECT_TRUE(torch::isfinite(params[0].second.detach()).all().item<bool>());
  }
}

}  // namespace
