// Each fused CPU kernel against its operator-by-operator reference at bert-mini / bert-base shapes (batch 64 x
// seq 128 tokens), forward + backward, bf16 and fp32, side by side in one process. Prints one JSON line per
// case with the time of each and the ratio; writes nothing else.
//   bench_fused_ops [--threads 2] [--reps 20]
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <string>

#include "bench/MicroBench.h"
#include "kernels/FusedOps.h"

namespace {

// forward + backward of f on fresh leaves.
std::function<void()> fwd_bwd(std::vector<torch::Tensor> in,
                              std::function<torch::Tensor(std::vector<torch::Tensor>&)> f) {
  for (auto& t : in) t.requires_grad_(true);
  return [in, f]() mutable {
    for (auto& t : in) t.mutable_grad() = torch::Tensor();
    auto y = f(in);
    y.backward(torch::ones_like(y));
  };
}

}  // namespace

int main(int argc, char** argv) {
  const auto args = bs::bench::parse_micro_bench_args(argc, argv);
  const int threads = args.threads, reps = args.reps;
  torch::set_num_threads(threads);
  const int64_t T = 64 * 128;
  std::printf("{\"kernel_isa\": \"%s\", \"threads\": %d}\n", bs::kernels::kernel_isa(), threads);
  for (auto dtype : {torch::kBFloat16, torch::kFloat}) {
    const char* dt = dtype == torch::kFloat ? "fp32" : "bf16";
    for (int64_t H : {256, 768}) {
      const int64_t I = 4 * H, heads = H / 64;
      auto o = torch::TensorOptions().dtype(dtype);
      auto x = torch::randn({T, H}, o), r = torch::randn({T, H}, o), b = torch::randn({H}, o);
      auto g = torch::ones({H}, o), be = torch::zeros({H}, o), xi = torch::randn({T, I}, o), bi = torch::randn({I}, o);
      auto probs = torch::rand({64, heads, 128, 128}, o);
      struct Case {
        std::string name;
        std::function<void()> reference, fused;
      };
      std::vector<Case> cases = {
          {"bias+dropout+residual+layernorm",
           fwd_bwd({x, b, r, g, be},
                   [](std::vector<torch::Tensor>& t) {
                     auto h = torch::dropout(t[0] + t[1], 0.1, true).add_(t[2]);
                     return torch::layer_norm(h.to(torch::kFloat), {h.size(1)}, t[3].to(torch::kFloat),
                                              t[4].to(torch::kFloat), 1e-12)
                         .to(h.scalar_type());
                   }),
           fwd_bwd({x, b, r, g, be},
                   [](std::vector<torch::Tensor>& t) {
                     return bs::kernels::bias_dropout_add_layer_norm(t[0], t[1], t[2], t[3], t[4], 0.1, true, 1e-12);
                   })},
          {"bias+gelu", fwd_bwd({xi, bi}, [](std::vector<torch::Tensor>& t) { return torch::gelu(t[0] + t[1]); }),
           fwd_bwd({xi, bi}, [](std::vector<torch::Tensor>& t) { return bs::kernels::bias_gelu(t[0], t[1]); })},
          {"attention-probs dropout",
           fwd_bwd({probs}, [](std::vector<torch::Tensor>& t) { return torch::dropout(t[0], 0.1, true); }),
           fwd_bwd({probs}, [](std::vector<torch::Tensor>& t) { return bs::kernels::dropout(t[0], 0.1, true); })},
      };
      for (auto& c : cases) {
        const double ref = bs::bench::seconds_per_call(c.reference, reps),
                     fused = bs::bench::seconds_per_call(c.fused, reps);
        std::printf(
            "{\"op\": \"%s\", \"dtype\": \"%s\", \"hidden\": %lld, \"reference_ms\": %.3f, \"fused_ms\": %.3f, "
            "\"speedup\": %.2f}\n",
            c.name.c_str(), dt, static_cast<long long>(H), ref * 1e3, fused * 1e3, ref / fused);
        std::fflush(stdout);
      }
    }
  }
}
