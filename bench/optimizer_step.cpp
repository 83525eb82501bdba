// One optimizer step on bert-base's parameter set (~110M float32 parameters in the real bert-base shapes):
// the flattened implementation vs the same update rules in a per-parameter loop vs torch::optim where it exists.
// Prints a table and writes the results to --out (.json or .csv).
//   bench_optimizer_step [--out FILE] [--steps N] [--layers L] [--optimizers adam,lamb,...] [--threads T]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "optimizers/Optimizer.h"

namespace {

struct Options {
  std::string out;
  int steps = 3;
  int warmup = 1;
  int layers = 12;
  int threads = 0;
  std::vector<std::string> optimizers = {"adam", "adamw", "lamb", "nvlamb", "lans", "sgd"};
};

struct Result {
  std::string optimizer, impl;
  double ms_per_step = 0;
};

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// bert-base (uncased): hidden 768, 12 layers, intermediate 3072, vocab 30522; the MLM decoder is tied to the
// word embeddings, so it adds only its bias.
Shapes bert_base_shapes(int layers) {
  const int64_t H = 768, I = 3072, V = 30522, P = 512;
  Shapes s = {{"embeddings.word_embeddings.weight", {V, H}},
              {"embeddings.position_embeddings.weight", {P, H}},
              {"embeddings.token_type_embeddings.weight", {2, H}},
              {"embeddings.LayerNorm.weight", {H}},
              {"embeddings.LayerNorm.bias", {H}}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "encoder.layer." + std::to_string(l) + ".";
    for (const char* m :
         {"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"}) {
      s.push_back({p + m + ".weight", {H, H}});
      s.push_back({p + m + ".bias", {H}});
    }
    s.push_back({p + "attention.output.LayerNorm.weight", {H}});
    s.push_back({p + "attention.output.LayerNorm.bias", {H}});
    s.push_back({p + "intermediate.dense.weight", {I, H}});
    s.push_back({p + "intermediate.dense.bias", {I}});
    s.push_back({p + "output.dense.weight", {H, I}});
    s.push_back({p + "output.dense.bias", {H}});
    s.push_back({p + "output.LayerNorm.weight", {H}});
    s.push_back({p + "output.LayerNorm.bias", {H}});
  }
  s.push_back({"pooler.dense.weight", {H, H}});
  s.push_back({"pooler.dense.bias", {H}});
  s.push_back({"cls.predictions.transform.dense.weight", {H, H}});
  s.push_back({"cls.predictions.transform.dense.bias", {H}});
  s.push_back({"cls.predictions.transform.LayerNorm.weight", {H}});
  s.push_back({"cls.predictions.transform.LayerNorm.bias", {H}});
  s.push_back({"cls.predictions.bias", {V}});
  s.push_back({"cls.seq_relationship.weight", {2, H}});
  s.push_back({"cls.seq_relationship.bias", {2}});
  return s;
}

bs::optim::NamedParams make_params(const Shapes& shapes) {
  bs::optim::NamedParams ps;
  for (const auto& [name, shape] : shapes) {
    auto p = (torch::randn(shape) * 0.02).requires_grad_(true);
    p.mutable_grad() = torch::randn(shape) * 1e-3;
    ps.emplace_back(name, p);
  }
  return ps;
}

template <class StepFn>
double time_steps(const Options& o, StepFn&& step) {
  for (int i = 0; i < o.warmup; ++i) step();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.steps; ++i) step();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count() / o.steps;
}

// torch::optim's counterpart of an optimizer name, where LibTorch has one.
std::unique_ptr<torch::optim::Optimizer> make_torch_optimizer(const bs::OptimizerConfig& c,
                                                              const std::vector<torch::Tensor>& ps) {
  if (c.name == "adam")
    return std::make_unique<torch::optim::Adam>(
        ps, torch::optim::AdamOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
  if (c.name == "adamw")
    return std::make_unique<torch::optim::AdamW>(
        ps, torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
  if (c.name == "sgd")
    return std::make_unique<torch::optim::SGD>(
        ps, torch::optim::SGDOptions(c.lr).momentum(c.momentum).nesterov(c.nesterov).weight_decay(c.weight_decay));
  return nullptr;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--out") o.out = next();
    else if (a == "--steps")
      o.steps = std::stoi(next());
    else if (a == "--warmup")
      o.warmup = std::stoi(next());
    else if (a == "--layers")
      o.layers = std::stoi(next());
    else if (a == "--threads")
      o.threads = std::stoi(next());
    else if (a == "--optimizers")
      o.optimizers = split(next());
    else if (a == "--help" || a == "-h") {
      std::cout << "bench_optimizer_step [--out FILE.json|FILE.csv] [--steps N=3] [--warmup N=1] [--layers L=12]\n"
                   "                     [--optimizers adam,adamw,lamb,nvlamb,lans,sgd] [--threads T]\n";
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown argument " + a + " (see --help)");
    }
  }
  if (o.steps < 1) throw std::invalid_argument("--steps must be >= 1");
  return o;
}

void write_results(const Options& o, int64_t n_params, const std::vector<Result>& rs) {
  if (o.out.empty()) return;
  std::ofstream f(o.out);
  if (!f) throw std::runtime_error("cannot write --out " + o.out);
  const bool csv = o.out.size() >= 4 && o.out.substr(o.out.size() - 4) == ".csv";
  if (csv) {
    f << "optimizer,impl,ms_per_step,params,threads,steps\n";
    for (const auto& r : rs)
      f << r.optimizer << ',' << r.impl << ',' << r.ms_per_step << ',' << n_params << ',' << torch::get_num_threads()
        << ',' << o.steps << '\n';
  } else {
    f << "{\n  \"benchmark\": \"optimizer_step\",\n  \"model\": \"bert-base (" << o.layers << " layers)\",\n"
      << "  \"params\": " << n_params << ",\n  \"dtype\": \"float32\",\n  \"threads\": " << torch::get_num_threads()
      << ",\n  \"steps\": " << o.steps << ",\n  \"results\": [\n";
    for (size_t i = 0; i < rs.size(); ++i)
      f << "    {\"optimizer\": \"" << rs[i].optimizer << "\", \"impl\": \"" << rs[i].impl
        << "\", \"ms_per_step\": " << rs[i].ms_per_step << "}" << (i + 1 < rs.size() ? "," : "") << "\n";
    f << "  ]\n}\n";
  }
  std::cout << "wrote " << o.out << "\n";
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  if (o.threads > 0) torch::set_num_threads(o.threads);
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  const auto shapes = bert_base_shapes(o.layers);
  int64_t n_params = 0;
  for (const auto& [n, s] : shapes) {
    int64_t k = 1;
    for (auto d : s) k *= d;
    n_params += k;
  }
  std::printf("optimizer step on bert-base shapes: %zu tensors, %.1fM float32 params, %d threads, %d timed steps\n",
              shapes.size(), n_params / 1e6, torch::get_num_threads(), o.steps);
  std::vector<Result> results;
  for (const auto& name : o.optimizers) {
    bs::OptimizerConfig cfg;
    cfg.name = name;
    cfg.lr = 1e-4;
    for (auto grouping : {bs::optim::Grouping::flattened, bs::optim::Grouping::per_parameter}) {
      auto params = make_params(shapes);
      auto opt = bs::optim::make_optimizer(cfg, params, grouping);
      const double ms = time_steps(o, [&] { opt->step(cfg.lr); });
      results.push_back({name, grouping == bs::optim::Grouping::flattened ? "flattened" : "per_parameter", ms});
    }
    {
      auto params = make_params(shapes);
      std::vector<torch::Tensor> ts;
      for (auto& [n, p] : params) ts.push_back(p);
      if (auto topt = make_torch_optimizer(cfg, ts)) {
        const double ms = time_steps(o, [&] { topt->step(); });
        results.push_back({name, "torch::optim", ms});
      }
    }
  }
  std::printf("\n%-8s %-14s %12s %18s\n", "optim", "impl", "ms/step", "vs per_parameter");
  for (const auto& r : results) {
    double per_param = 0;
    for (const auto& q : results)
      if (q.optimizer == r.optimizer && q.impl == "per_parameter") per_param = q.ms_per_step;
    std::printf("%-8s %-14s %12.1f %17.2fx\n", r.optimizer.c_str(), r.impl.c_str(), r.ms_per_step,
                per_param / r.ms_per_step);
  }
  write_results(o, n_params, results);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "bench_optimizer_step: " << e.what() << "\n";
  return 2;
}
