#!/bin/bash
# GPU benchmark (prepared; NOT run on the 2-core CPU machine, which has no GPU): bert-large (L24/H1024/A16/I4096,
# vocab 30522, seq 128) training steps in bfloat16 on one GPU, bertsweep's C++ model (bs::BertForPretraining) with
# its gradients allreduced through bertsweep's NCCL communicator (world 1), vs the same model in Python PyTorch
# eager (bench/python_baseline.py --device cuda --dtype bfloat16). Synthetic full-length batches, so both sides
# see identical shapes. Needs PyTorch 2.x with CUDA (its LibTorch is used via torch.utils.cmake_prefix_path),
# NCCL headers/library and nvcc-compatible CUDA toolkit.
#   bench/gpu.sh [BATCH=32] [STEPS=10]
# Writes bench/results/gpu.json. Build folder: build-gpu (override with BUILD_GPU=...).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-python3}"   # the Python that has CUDA PyTorch 2.x (not necessarily Debian's CPU 1.13)
BATCH="${1:-32}"
STEPS="${2:-10}"
BUILD_GPU="${BUILD_GPU:-$ROOT/build-gpu}"
command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "bench/gpu.sh: no GPU (nvidia-smi missing)" >&2; exit 3; }
PREFIX="$($PY -c 'import torch;print(torch.utils.cmake_prefix_path)')"
$PY -c 'import torch,sys; assert torch.cuda.is_available(), "torch without CUDA"; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# A tiny CMake project next to the main one: the harness links bertsweep's libraries (add_subdirectory of the repo).
HARNESS="$BUILD_GPU/harness"
mkdir -p "$HARNESS"
cat >"$HARNESS/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.18)
project(bs_gpu_step CXX)
add_subdirectory("$ROOT" bertsweep)
add_executable(gpu_step gpu_step.cpp)
target_link_libraries(gpu_step PRIVATE bs_trainer bs_common)
EOF
cat >"$HARNESS/gpu_step.cpp" <<'EOF'
// bert-large bf16 training steps on cuda:0 with bertsweep's model and NCCL communicator; prints one JSON line.
#include <torch/torch.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include "trainer/BertModel.h"
#include "trainer/Communicator.h"
int main(int argc, char** argv) {
  const int64_t B = argc > 1 ? std::atoll(argv[1]) : 32, steps = argc > 2 ? std::atoll(argv[2]) : 10, L = 128,
                P = 20, V = 30522;
  bs::ModelConfig cfg;
  cfg.vocab_size = V; cfg.hidden = 1024; cfg.layers = 24; cfg.heads = 16; cfg.intermediate = 4096;
  const auto dev = torch::Device(torch::kCUDA, 0);
  torch::manual_seed(1);
  bs::BertForPretraining model(cfg);
  model->to(dev, torch::kBFloat16);
  model->train();
  bs::DistributedConfig dc;
  dc.backend = "nccl";
  auto comm = bs::make_communicator(dc);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4).weight_decay(0.01));
  auto ilong = torch::TensorOptions().dtype(torch::kLong).device(dev);
  bs::BertInputs in;
  in.input_ids = torch::randint(5, V, {B, L}, ilong);
  in.segment_ids = (torch::arange(L, ilong) >= L / 2).to(torch::kLong).expand({B, L}).contiguous();
  in.position_ids = torch::arange(L, ilong).expand({B, L}).contiguous();
  in.attention_ids = torch::ones({B, L}, ilong);
  auto rows = torch::arange(B, ilong).unsqueeze(1) * L;
  in.mlm_positions = (rows + torch::randint(1, L, {B, P}, ilong)).reshape({-1});
  in.nsp_positions = torch::arange(B, ilong) * L;
  auto mlm_labels = torch::randint(5, V, {B * P}, ilong), nsp_labels = torch::randint(0, 2, {B}, ilong);
  auto step = [&] {
    auto out = model->forward(in);
    auto loss = bs::pretraining_loss(out, mlm_labels, nsp_labels);
    opt.zero_grad();
    loss.total.backward();
    std::vector<torch::Tensor> grads;
    for (auto& p : model->parameters()) grads.push_back(p.grad().reshape({-1}));
    auto flat = torch::cat(grads);
    comm->allreduce(flat, bs::ReduceOp::kSum);  // world 1: exercises the NCCL path at bert-large size
    opt.step();
  };
  for (int i = 0; i < 3; ++i) step();
  torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) step();
  torch::cuda::synchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
  const double flops = bs::training_flops(cfg, B, L, B * P);
  std::printf("{\"tool\": \"bertsweep_gpu_step\", \"model\": \"large\", \"batch\": %lld, \"dtype\": \"bfloat16\", "
              "\"step_seconds\": %.6f, \"tokens_per_s\": %.1f, \"tflops\": %.2f}\n",
              static_cast<long long>(B), s, B * L / s, flops / s / 1e12);
  return 0;
}
EOF
cmake -S "$HARNESS" -B "$BUILD_GPU" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null
cmake --build "$BUILD_GPU" --target gpu_step -j"$(nproc)"
mkdir -p "$ROOT/bench/results"
CPP="$("$BUILD_GPU/gpu_step" "$BATCH" "$STEPS" | tail -1)"
PYR="$($PY "$ROOT/bench/python_baseline.py" --model large --device cuda --dtype bfloat16 --synthetic-vocab 30522 \
        --batch "$BATCH" --steps "$STEPS" --warmup 3 --threads "$(nproc)" | tail -1)"
$PY - "$CPP" "$PYR" "$ROOT/bench/results/gpu.json" <<'EOF'
import json, sys
cpp, py = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {"bertsweep_cpp": cpp, "python_eager": py, "speedup_tokens_per_s": cpp["tokens_per_s"] / py["tokens_per_s"]}
json.dump(out, open(sys.argv[3], "w"), indent=1)
print(f"bert-large bf16 batch {cpp['batch']}: bertsweep {cpp['tokens_per_s']:.0f} tok/s ({cpp['tflops']} TFLOP/s), "
      f"python eager {py['tokens_per_s']:.0f} tok/s -> {out['speedup_tokens_per_s']:.2f}x")
EOF
