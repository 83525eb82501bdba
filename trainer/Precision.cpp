#include "trainer/Precision.h"

#include <fstream>
#include <sstream>

namespace bs {

std::string CpuInfo::bf16_isa() const { return amx_bf16 ? "amx_bf16" : avx512_bf16 ? "avx512_bf16" : "none"; }

CpuInfo read_cpu_info(const std::string& cpuinfo_path) {
  CpuInfo info;
  std::ifstream in(cpuinfo_path);
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && info.model.empty()) info.model = value;
    if (key == "flags") {
      std::istringstream flags(value);
      for (std::string f; flags >> f;) {
        if (f == "amx_bf16") info.amx_bf16 = true;
        if (f == "avx512_bf16") info.avx512_bf16 = true;
        if (f == "avx512f") info.avx512 = true;
      }
      break;  // every core lists the same flags
    }
  }
  if (info.model.empty()) info.model = "unknown CPU";
  return info;
}

PrecisionChoice resolve_precision(const TrainConfig& cfg, const CpuInfo& cpu) {
  PrecisionChoice c;
  const bool cuda_built = torch::cuda::is_available();
  if (cfg.device == "cuda") {
    if (!cuda_built)
      throw ConfigError("device: cuda, but this LibTorch build has no CUDA or no GPU is visible (available: cpu; "
                        "set device: cpu or auto)");
    throw ConfigError("device: cuda: this version of the trainer runs on the CPU only (the GPU trainer is the next "
                      "step); set device: cpu or auto");
  }
  // device auto: the CPU (training on a GPU is not built yet, so auto never picks one).
  c.device = torch::kCPU;
  c.device_name = "cpu";
  const std::string isa = cpu.bf16_isa();
  const std::string where = cpu.model + ", bf16 ISA " + isa;
  if (cfg.precision == "fp16")
    throw ConfigError("precision: fp16 needs device: cuda (fp16 with loss scaling is a GPU mode; on the CPU use "
                      "bf16 or fp32)");
  if (cfg.precision == "auto") {
    if (isa != "none") {
      c.precision = "bf16";
      c.reason = "auto: " + where + " runs bf16 matmul natively";
    } else {
      c.precision = "fp32";
      c.reason = "auto: " + where + " (no AMX or AVX512-BF16, so bf16 would be emulated and slower)";
    }
  } else {
    c.precision = cfg.precision;
    c.reason = "requested: " + where + (cfg.precision == "bf16" && isa == "none" ? " (bf16 is emulated here: slow)" : "");
  }
  c.compute = c.precision == "bf16" ? torch::kBFloat16 : torch::kFloat;
  return c;
}

}  // namespace bs
