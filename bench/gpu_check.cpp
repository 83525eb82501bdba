// The GPU check (bench/gpu_check.sh runs it): bertsweep's trainer core on one device, each check against an
// independent reference, then bert-large throughput. Prints one line per check, "N passed, N failed", and
// writes JSON. Builds against the full project or the core-only build (BERTSWEEP_CORE_ONLY: LibTorch, CUDA and
// NCCL only), so a GPU machine without yaml-cpp/HDF5/MPI/SQLite headers can run it.
//   bench_gpu_check [--device cuda|cpu] [--json FILE] [--large-batch N] [--large-steps N] [--quick]
// --device cpu runs the same checks on the CPU (no NCCL): how the checks themselves are tested without a GPU.
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "common/JsonWriter.h"
#include "optimizers/Clipping.h"
#include "optimizers/Optimizer.h"
#include "trainer/BertModel.h"
#include "distributed/Communicator.h"
#include "trainer/CudaDevice.h"
#include "distributed/GradientBucketer.h"
#include "trainer/MixedPrecision.h"

namespace {

using bs::BertForPretraining;
using bs::ModelConfig;

struct Options {
  std::string device = "cuda";
  std::string json = "bench/results/gpu_check.json";
  int64_t large_batch = 32, large_steps = 10;
  bool quick = false;  // small models only (CPU runs of the checks)
};

struct Check {
  std::string name;
  std::string status;  // passed | failed | skipped
  std::string detail;
};

ModelConfig model_config(const std::string& size, int64_t vocab) {
  ModelConfig m;
  m.vocab_size = vocab;
  m.max_position = 512;
  m.dropout = 0.0;  // deterministic comparisons
  if (size == "tiny") {
    m.hidden = 128;
    m.layers = 2;
    m.heads = 2;
    m.intermediate = 512;
  }
  if (size == "mini") {
    m.hidden = 256;
    m.layers = 4;
    m.heads = 4;
    m.intermediate = 1024;
  }
  if (size == "large") {
    m.hidden = 1024;
    m.layers = 24;
    m.heads = 16;
    m.intermediate = 4096;
  }
  return m;
}

struct Synthetic {
  bs::BertInputs in;
  torch::Tensor mlm_labels, nsp_labels;
};

// Full-length rows with the second half as segment B, 20 masked positions per row (as MLPerf's seq 128).
Synthetic synthetic_batch(int64_t B, int64_t L, int64_t V, torch::Device dev, uint64_t seed) {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t P = 20;
  auto ilong = torch::TensorOptions().dtype(torch::kLong);
  Synthetic s;
  s.in.input_ids = torch::randint(5, V, {B, L}, g, ilong);
  s.in.segment_ids = (torch::arange(L, ilong) >= L / 2).to(torch::kLong).expand({B, L}).contiguous();
  s.in.position_ids = torch::arange(L, ilong).expand({B, L}).contiguous();
  s.in.attention_ids = torch::ones({B, L}, ilong);
  auto rows = torch::arange(B, ilong).unsqueeze(1) * L;
  s.in.mlm_positions = (rows + torch::randint(1, L, {B, P}, g, ilong)).reshape({-1});
  s.in.nsp_positions = torch::arange(B, ilong) * L;
  s.mlm_labels = torch::randint(5, V, {B * P}, g, ilong);
  s.nsp_labels = torch::randint(0, 2, {B}, g, ilong);
  for (auto* t : {&s.in.input_ids, &s.in.segment_ids, &s.in.position_ids, &s.in.attention_ids, &s.in.mlm_positions,
                  &s.in.nsp_positions, &s.mlm_labels, &s.nsp_labels})
    *t = t->to(dev);
  return s;
}

double max_rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  auto x = a.to(torch::kCPU, torch::kDouble), y = b.to(torch::kCPU, torch::kDouble);
  return ((x - y).abs().max() / (y.abs().max() + 1e-30)).item<double>();
}

char buf[512];
const char* fmt(const char* f, double a, double b = 0, double c = 0) {
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

// 1. The model on the device computes what it computes on the CPU (fp32, same weights and batch).
Check forward_backward_matches_cpu(torch::Device dev) {
  const auto cfg = model_config("tiny", 1000);
  torch::manual_seed(3);
  BertForPretraining cpu_model(cfg);
  torch::manual_seed(3);
  BertForPretraining dev_model(cfg);
  dev_model->to(dev);
  auto cpu_batch = synthetic_batch(8, 128, 1000, torch::kCPU, 5);
  auto dev_batch = synthetic_batch(8, 128, 1000, dev, 5);
  auto lc = bs::pretraining_loss(cpu_model->forward(cpu_batch.in), cpu_batch.mlm_labels, cpu_batch.nsp_labels);
  auto ld = bs::pretraining_loss(dev_model->forward(dev_batch.in), dev_batch.mlm_labels, dev_batch.nsp_labels);
  lc.total.backward();
  ld.total.backward();
  double worst = max_rel_diff(ld.total.detach(), lc.total.detach());
  auto pc = cpu_model->parameters(), pd = dev_model->parameters();
  for (size_t i = 0; i < pc.size(); ++i) worst = std::max(worst, max_rel_diff(pd[i].grad(), pc[i].grad()));
  const bool ok = worst < 1e-3;  // TF32 is off by default in LibTorch's matmul; reductions differ in order
  return {"forward_backward_matches_cpu", ok ? "passed" : "failed",
          fmt("loss and every gradient within %.2e relative (limit 1e-3)", worst)};
}

// 2. Every flat optimizer on the device, fp32, against the same optimizer run in float64 on the CPU.
Check flat_optimizers_vs_float64(torch::Device dev) {
  std::string detail;
  bool ok = true;
  for (const auto& name : bs::optim::optimizer_names()) {
    bs::OptimizerConfig oc;
    oc.name = name;
    oc.lr = name == "sgd" ? 0.05 : 1e-2;
    torch::manual_seed(11);
    std::vector<torch::Tensor> init = {torch::randn({64, 33}), torch::randn({33}), torch::randn({7, 5, 3})};
    auto make = [&](torch::Device d, torch::ScalarType t, std::vector<torch::Tensor>& keep) {
      bs::optim::NamedParams named;
      const char* names[] = {"w", "bias", "x"};
      for (size_t i = 0; i < init.size(); ++i) {
        keep.push_back(init[i].to(d, t).clone().set_requires_grad(true));
        named.emplace_back(names[i], keep.back());
      }
      return bs::optim::make_optimizer(oc, named);
    };
    std::vector<torch::Tensor> pd, pr;
    auto od = make(dev, torch::kFloat, pd);
    auto orf = make(torch::kCPU, torch::kDouble, pr);
    for (int step = 0; step < 5; ++step) {
      for (size_t i = 0; i < pd.size(); ++i) {
        auto g = torch::sin(init[i] * (step + 1)).to(torch::kDouble);
        torch::NoGradGuard ng;
        pr[i].mutable_grad().copy_(g);
        pd[i].mutable_grad().copy_(g.to(torch::kFloat));
      }
      od->step(oc.lr);
      orf->step(oc.lr);
    }
    double worst = 0;
    for (size_t i = 0; i < pd.size(); ++i) worst = std::max(worst, max_rel_diff(pd[i].detach(), pr[i].detach()));
    ok = ok && worst < 1e-5;
    detail += name + " " + fmt("%.1e", worst) + "; ";
  }
  return {"flat_optimizers_vs_float64", ok ? "passed" : "failed", detail + "limit 1e-5 relative"};
}

// 3. The NCCL allreduce (world 1: the average is the tensor itself) in fp32 and bf16, its times from events.
Check nccl_allreduce(torch::Device dev) {
  if (!dev.is_cuda()) return {"nccl_allreduce", "skipped", "no CUDA device"};
  bs::DistributedConfig dc;
  dc.backend = "nccl";
  dc.timeout_s = 60;
  auto comm = bs::make_communicator(dc, /*cuda=*/true);
  bool ok = comm->backend() == "nccl";
  std::string detail;
  for (auto t : {torch::kFloat, torch::kBFloat16}) {
    auto x = torch::randn({1 << 20}, torch::TensorOptions().device(dev)).to(t);
    auto want = x.clone();
    auto work = comm->allreduce_async(x, bs::ReduceOp::kAvg);
    work->wait();
    const bool equal = torch::equal(x, want);
    const bool timed = work->finished_at() >= work->started_at();
    ok = ok && equal && timed;
    detail += std::string(c10::toString(t)) + (equal ? " equal" : " DIFFERS") + (timed ? "" : " (bad times)") + "; ";
  }
  return {"nccl_allreduce", ok ? "passed" : "failed", detail};
}

// 4. Buckets through the communicator (views of the optimizer's flat gradient buffer, bucket-wise clipping)
//    equal the local gradients clipped bucket by bucket on the host.
Check bucketer_equals_local(torch::Device dev) {
  const auto cfg = model_config("tiny", 1000);
  torch::manual_seed(4);
  BertForPretraining model(cfg);
  model->to(dev);
  bs::optim::NamedParams named;
  for (const auto& kv : model->named_parameters()) named.emplace_back(kv.key(), kv.value());
  bs::OptimizerConfig oc;
  oc.name = "lamb";
  auto opt = bs::optim::make_optimizer(oc, named);
  auto batch = synthetic_batch(8, 128, 1000, dev, 6);
  // Reference: plain backward, then each bucket clipped on the host.
  bs::pretraining_loss(model->forward(batch.in), batch.mlm_labels, batch.nsp_labels).total.backward();
  std::vector<torch::Tensor> local;
  for (const auto& p : model->parameters()) local.push_back(p.grad().detach().to(torch::kCPU).clone());
  opt->zero_grad();
  bs::DistributedConfig dc;
  dc.backend = dev.is_cuda() ? "nccl" : "none";
  auto comm = bs::make_communicator(dc, dev.is_cuda());
  bs::ClipConfig clip;
  clip.mode = "bucket_before_allreduce";
  clip.max_norm = 0.5;
  clip.bucket_mb = 0.25;
  bs::GradientBucketer bucketer(model->parameters(), *comm, clip, std::nullopt, opt->grad_buffers());
  bucketer.begin_micro(true);
  bs::pretraining_loss(model->forward(batch.in), batch.mlm_labels, batch.nsp_labels).total.backward();
  bucketer.finish();
  const auto stats = bucketer.step_stats();
  const double cap = clip.max_norm / std::sqrt(double(bucketer.num_buckets()));
  auto params = model->parameters();
  double worst = 0;
  for (const auto& b : bucketer.bucket_params()) {
    double sq = 0;
    for (int64_t i : b) sq += local[i].to(torch::kDouble).pow(2).sum().item<double>();
    const double n = std::sqrt(sq), f = n > cap ? cap / (n * (1 + 1e-6) + 1e-6) : 1.0;
    for (int64_t i : b) worst = std::max(worst, max_rel_diff(params[i].grad(), local[i] * f));
  }
  const bool ok = bucketer.buckets_are_views() && worst < 1e-4 && std::isfinite(stats.grad_norm);
  return {"bucketer_equals_local", ok ? "passed" : "failed",
          std::to_string(bucketer.num_buckets()) + " buckets" +
              (bucketer.buckets_are_views() ? " (views)" : " (COPIES)") + ", " + comm->backend() +
              fmt(", worst %.2e relative, norm %.4g", worst, stats.grad_norm)};
}

// 5. Mixed precision: bf16 compute copy, fp32 masters, LAMB; the loss on a fixed batch falls without NaN.
Check bf16_loss_falls(torch::Device dev, bool quick) {
  const auto cfg = model_config(quick ? "tiny" : "mini", 2000);
  torch::manual_seed(5);
  BertForPretraining model(cfg);
  model->to(dev);
  bs::optim::NamedParams named;
  for (const auto& kv : model->named_parameters()) named.emplace_back(kv.key(), kv.value());
  bs::OptimizerConfig oc;
  oc.name = "lamb";
  oc.lr = 2e-2;  // memorising one batch: a high LAMB rate (1e-2 reaches 61% of the first loss on bert-tiny)
  auto opt = bs::optim::make_optimizer(oc, named);
  bs::ComputeCopy compute(model, *opt, torch::kBFloat16);
  auto batch = synthetic_batch(quick ? 8 : 32, 128, 2000, dev, 7);
  double first = NAN, last = NAN;
  const int steps = quick ? 30 : 40;
  bool finite = true;
  for (int s = 0; s < steps; ++s) {
    auto loss = bs::pretraining_loss(compute.model()->forward(batch.in), batch.mlm_labels, batch.nsp_labels).total;
    loss.backward();
    last = loss.item<double>();
    if (s == 0) first = last;
    finite = finite && std::isfinite(last);
    opt->step(oc.lr);
    opt->zero_grad();
    compute.refresh();
  }
  bool masters_fp32 = true;
  for (const auto& p : model->parameters()) masters_fp32 = masters_fp32 && p.scalar_type() == torch::kFloat;
  const bool ok = finite && last < 0.7 * first && masters_fp32;
  return {"bf16_loss_falls", ok ? "passed" : "failed",
          std::string(quick ? "bert-tiny" : "bert-mini") + fmt(": loss %.3f -> %.3f over ", first, last) +
              std::to_string(steps) + " steps (must fall below 70%)" + (masters_fp32 ? "" : "; masters NOT fp32")};
}

// Dense bf16 peak of the GPU (TFLOP/s, no sparsity), from its name; 0 when unknown.
double bf16_peak_tflops(const std::string& name) {
  struct Peak {
    const char* key;
    double tflops;
  };
  static const Peak peaks[] = {{"H200", 989.4}, {"H100 PCIe", 756.0}, {"H100", 989.4}, {"A100", 312.0},
                               {"L40S", 362.1}, {"A10", 125.0},       {"L4", 121.0}};
  for (const auto& p : peaks)
    if (name.find(p.key) != std::string::npos) return p.tflops;
  return 0;
}

// 6. bert-large, seq 128, bf16: the trainer's step (compute copy, LAMB on flat fp32 buffers, buckets through the
//    communicator) timed after warm-up. The comparison with PyTorch eager autocast is gpu_check.sh's.
Check large_throughput(torch::Device dev, const Options& o, bs::JsonWriter& result) {
  if (!dev.is_cuda() && !o.quick) return {"large_throughput", "skipped", "CPU: bert-large is for the GPU"};
  const auto cfg = model_config(o.quick ? "tiny" : "large", 30522);
  torch::manual_seed(6);
  BertForPretraining model(cfg);
  model->to(dev);
  bs::optim::NamedParams named;
  for (const auto& kv : model->named_parameters()) named.emplace_back(kv.key(), kv.value());
  bs::OptimizerConfig oc;
  oc.name = "lamb";
  oc.lr = 1e-4;
  auto opt = bs::optim::make_optimizer(oc, named);
  bs::ComputeCopy compute(model, *opt, torch::kBFloat16);
  bs::DistributedConfig dc;
  dc.backend = dev.is_cuda() ? "nccl" : "none";
  auto comm = bs::make_communicator(dc, dev.is_cuda());
  bs::ClipConfig clip;
  clip.mode = "bucket_before_allreduce";
  clip.max_norm = 1.0;
  clip.bucket_mb = 25;
  bs::GradientBucketer bucketer(compute.model()->parameters(), *comm, clip, std::nullopt, opt->grad_buffers());
  const int64_t B = o.quick ? 4 : o.large_batch, L = 128;
  auto batch = synthetic_batch(B, L, cfg.vocab_size, dev, 8);
  double loss_v = 0;
  auto step = [&] {
    bucketer.begin_micro(true);
    auto loss = bs::pretraining_loss(compute.model()->forward(batch.in), batch.mlm_labels, batch.nsp_labels).total;
    loss.backward();
    bucketer.finish();
    auto st = bucketer.step_stats();  // the trainer's one read per step
    loss_v = loss.item<double>();
    (void)st;
    opt->step(oc.lr);
    opt->zero_grad();
    compute.refresh();
  };
  auto sync = [&] {
    if (dev.is_cuda()) torch::cuda::synchronize();
  };
  for (int i = 0; i < 3; ++i) step();
  sync();
  const int64_t steps = o.quick ? 2 : o.large_steps;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) step();
  sync();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(steps);
  const double tflops = bs::training_flops(cfg, B, L, B * 20) / s / 1e12;
  const std::string gpu = dev.is_cuda() ? bs::cuda_device_info(dev.index()).name : "cpu";
  const double peak = bf16_peak_tflops(gpu);
  result.add("model", o.quick ? "tiny" : "large")
      .add("batch", B)
      .add("seq_len", L)
      .add("step_seconds", s)
      .add("tokens_per_s", double(B * L) / s)
      .add("model_tflops", tflops)
      .add("gpu", gpu)
      .add("bf16_peak_tflops", peak)
      .add("mfu", peak > 0 ? tflops / peak : 0.0)
      .add("final_loss", loss_v);
  const bool mfu_ok = peak > 0 && tflops / peak >= 0.40;
  const bool ok = std::isfinite(loss_v) && (o.quick || mfu_ok);
  return {"large_throughput", ok ? "passed" : "failed",
          fmt("%.0f tokens/s, %.1f model TFLOP/s", double(B * L) / s, tflops) +
              std::string(peak > 0 ? fmt(", %.1f%% of the bf16 peak (target 40%%)", 100 * tflops / peak) : "")};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_gpu_check: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--device") o.device = next();
    else if (a == "--json")
      o.json = next();
    else if (a == "--large-batch")
      o.large_batch = std::atoll(next().c_str());
    else if (a == "--large-steps")
      o.large_steps = std::atoll(next().c_str());
    else if (a == "--quick")
      o.quick = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_gpu_check [--device cuda|cpu] [--json FILE] [--large-batch N] "
                   "[--large-steps N] [--quick]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (o.device == "cuda" && bs::cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_gpu_check: no CUDA device (this build has %s); use --device cpu\n",
                 torch::cuda::is_available() ? "CUDA" : "no CUDA");
    return 3;
  }
  const torch::Device dev = o.device == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (dev.is_cuda()) bs::set_cuda_device(0);
  bs::JsonWriter large;
  std::vector<std::function<Check()>> checks = {[&] { return forward_backward_matches_cpu(dev); },
                                                [&] { return flat_optimizers_vs_float64(dev); },
                                                [&] { return nccl_allreduce(dev); },
                                                [&] { return bucketer_equals_local(dev); },
                                                [&] { return bf16_loss_falls(dev, o.quick); },
                                                [&] { return large_throughput(dev, o, large); }};
  int passed = 0, failed = 0;
  std::string rows;
  for (auto& run : checks) {
    Check c;
    try {
      c = run();
    } catch (const std::exception& e) {
      c = {"(check)", "failed", std::string("threw: ") + e.what()};
    }
    passed += c.status == "passed";
    failed += c.status == "failed";
    std::printf("%-30s %-8s %s\n", c.name.c_str(), c.status.c_str(), c.detail.c_str());
    std::fflush(stdout);
    rows += (rows.empty() ? "" : ",") +
            bs::JsonWriter().add("name", c.name).add("status", c.status).add("detail", c.detail).str();
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  const std::string device = dev.is_cuda() ? bs::cuda_device_info(0).describe() : "cpu";
  std::ofstream out(o.json);
  out << "{\"device\": " << bs::JsonWriter::quote(device) << ", \"torch\": \"" << TORCH_VERSION
      << "\", \"passed\": " << passed << ", \"failed\": " << failed << ", \"checks\": [" << rows
      << "], \"large\": " << large.str() << "}\n";
  return failed == 0 ? 0 : 1;
}
