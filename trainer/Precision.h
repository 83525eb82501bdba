// Which device and compute dtype a run uses, decided once at start-up from the `device:` and `precision:`
// keys, this build of LibTorch and this machine. `auto` picks bf16 where the hardware runs it fast (a CPU
// with AMX or AVX512-BF16, a GPU with bf16), else fp32. Master weights and optimizer state are always fp32.
#pragma once
#include <torch/torch.h>

#include <string>

#include "common/TrainConfig.h"

namespace bs {

struct CpuInfo {
  std::string model;         // /proc/cpuinfo "model name"
  bool amx_bf16 = false;     // AMX tiles with bf16 (Sapphire Rapids and later)
  bool avx512_bf16 = false;  // AVX512-BF16 dot products (Cooper Lake, Zen 4 and later)
  bool avx512 = false;       // avx512f
  // The bf16 instruction set the CPU offers ("amx_bf16", "avx512_bf16" or "none").
  std::string bf16_isa() const;
};
CpuInfo read_cpu_info(const std::string& cpuinfo_path = "/proc/cpuinfo");

struct PrecisionChoice {
  torch::Device device = torch::kCPU;
  torch::ScalarType compute = torch::kFloat;  // the dtype forward/backward run in
  std::string device_name = "cpu";            // as the config spells it
  std::string precision = "fp32";             // fp32 | bf16 | fp16
  std::string reason;                         // why, naming the CPU/GPU and ISA: for the banner and the log
  bool mixed() const { return compute != torch::kFloat; }
};

// Throws ConfigError (exit 2) naming `device` or `precision` and what is available, for a request this
// build or machine cannot serve (device: cuda without CUDA, fp16 on the CPU, ...).
PrecisionChoice resolve_precision(const TrainConfig& cfg, const CpuInfo& cpu = read_cpu_info());

}  // namespace bs
