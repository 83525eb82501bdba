// oneDNN's matmul with a bias + GELU post-op (the "epilogue" issue 35 asks to measure) against what the trainer
// runs for the FFN's first projection, forward only, bert-mini and bert-base shapes (batch 64 x seq 128 and
// 16 x 128 tokens), bf16 and fp32, side by side in one process on the same inputs:
//   torch linear+gelu      torch::gelu(torch::linear(x, W, b)): the bf16 fused path and the reference path
//   torch linear+kernel    kernels::bias_gelu(torch::linear(x, W), b): the fp32 fused path
//   onednn bias            oneDNN matmul + bias post-op: the pre-activation training must keep for GELU's backward
//   onednn bias, then gelu that plus LibTorch's GELU: an epilogue training could use (oneDNN 2.6 has no aux output)
//   onednn bias+gelu       oneDNN matmul with bias and gelu_erf post-ops, output only: inference's epilogue
// Each line of output is one JSON object: ms per call of each, and the speedups (torch linear+gelu's time over
// the oneDNN variant's).
//   bench_onednn_epilogue [--threads 2] [--reps 20]
#include <oneapi/dnnl/dnnl.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bench/MicroBench.h"
#include "kernels/FusedOps.h"
#include "trainer/Runtime.h"

namespace {

double ms_per_call(const std::function<void()>& f, int reps) { return 1e3 * bs::bench::seconds_per_call(f, reps); }

// y = x W^T + b, then GELU when `gelu`, as one oneDNN matmul primitive on the tensors' memory.
class OnednnLinear {
 public:
  OnednnLinear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, torch::Tensor& y, bool gelu)
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    using tag = dnnl::memory::format_tag;
    const auto dt = x.scalar_type() == torch::kFloat ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
    const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
    dnnl::memory::desc src({M, K}, dt, tag::ab), wei({K, N}, dt, tag::ba), bias({1, N}, dt, tag::ab),
        dst({M, N}, dt, tag::ab);
    dnnl::primitive_attr attr;
    if (gelu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.f, dnnl::algorithm::eltwise_gelu_erf, 0.f, 0.f);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, bias, dst), attr, engine_);
    matmul_ = dnnl::matmul(pd);
    args_ = {{DNNL_ARG_SRC, dnnl::memory(src, engine_, x.data_ptr())},
             {DNNL_ARG_WEIGHTS, dnnl::memory(wei, engine_, w.data_ptr())},
             {DNNL_ARG_BIAS, dnnl::memory(bias, engine_, b.data_ptr())},
             {DNNL_ARG_DST, dnnl::memory(dst, engine_, y.data_ptr())}};
  }
  void operator()() {
    matmul_.execute(stream_, args_);
    stream_.wait();
  }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  dnnl::matmul matmul_;
  std::unordered_map<int, dnnl::memory> args_;
};

}  // namespace

int main(int argc, char** argv) {
  const auto args = bs::bench::parse_micro_bench_args(argc, argv);
  const int threads = args.threads, reps = args.reps;
  // The trainer's runtime (threads, OpenMP wait policy, glibc's heap for large tensors): without it every
  // LibTorch output above glibc's mmap threshold comes as fresh zero-filled pages and LibTorch loses to
  // oneDNN's preallocated outputs by the page faults alone.
  std::printf("{\"runtime\": \"%s\"}\n", bs::describe(bs::configure_runtime(threads)).c_str());
  torch::NoGradGuard no_grad;
  const auto v = dnnl::version();
  std::printf("{\"onednn\": \"%d.%d.%d\", \"kernel_isa\": \"%s\", \"threads\": %d, \"reps\": %d}\n", v->major, v->minor,
              v->patch, bs::kernels::kernel_isa(), threads, reps);
  const std::vector<std::pair<const char*, std::pair<int64_t, int64_t>>> models = {{"mini", {64 * 128, 256}},
                                                                                   {"base", {16 * 128, 768}}};
  for (auto dtype : {torch::kBFloat16, torch::kFloat}) {
    const char* dt = dtype == torch::kFloat ? "fp32" : "bf16";
    for (const auto& [model, shape] : models) {
      const int64_t T = shape.first, H = shape.second, I = 4 * H;
      auto o = torch::TensorOptions().dtype(dtype);
      auto x = torch::randn({T, H}, o), w = torch::randn({I, H}, o).mul_(0.05), b = torch::randn({I}, o);
      auto y_pre = torch::empty({T, I}, o), y_gelu = torch::empty({T, I}, o);
      OnednnLinear biased(x, w, b, y_pre, false), fused(x, w, b, y_gelu, true);
      // The same numbers, within bf16 rounding: the primitives compute what LibTorch does.
      const auto want = torch::gelu(torch::linear(x, w, b)).to(torch::kFloat);
      biased();
      fused();
      const double err_fused = (y_gelu.to(torch::kFloat) - want).abs().max().item<double>();
      const double err_biased = (torch::gelu(y_pre).to(torch::kFloat) - want).abs().max().item<double>();
      const double t_torch = ms_per_call([&] { (void)torch::gelu(torch::linear(x, w, b)); }, reps);
      const double t_kernel = ms_per_call([&] { (void)bs::kernels::bias_gelu(torch::linear(x, w), b); }, reps);
      const double t_bias = ms_per_call(biased, reps);
      const double t_bias_then_gelu = ms_per_call(
          [&] {
            biased();
            (void)torch::gelu(y_pre);
          },
          reps);
      const double t_fused = ms_per_call(fused, reps);
      std::printf(
          "{\"model\": \"%s\", \"dtype\": \"%s\", \"shape\": [%lld, %lld, %lld], \"torch_linear_gelu_ms\": %.3f, "
          "\"torch_linear_kernel_gelu_ms\": %.3f, \"onednn_bias_ms\": %.3f, \"onednn_bias_then_gelu_ms\": %.3f, "
          "\"onednn_bias_gelu_ms\": %.3f, \"onednn_bias_gelu_speedup\": %.3f, "
          "\"onednn_bias_then_gelu_speedup\": %.3f, \"max_abs_err_fused\": %.3g, \"max_abs_err_biased\": %.3g}\n",
          model, dt, static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(I), t_torch, t_kernel,
          t_bias, t_bias_then_gelu, t_fused, t_torch / t_fused, t_torch / t_bias_then_gelu, err_fused, err_biased);
      std::fflush(stdout);
    }
  }
  return 0;
}
