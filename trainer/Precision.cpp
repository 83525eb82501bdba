#include "trainer/Precision.h"

#include <fstream>
#include <sstream>

#include "common/Choices.h"
#include "distributed/Communicator.h"
#include "trainer/CudaDevice.h"

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

namespace {

// device: cuda (or auto with a GPU): this rank's GPU is local_rank % GPUs, as NCCL's communicator takes it.
PrecisionChoice resolve_on_gpu(PrecisionKind asked, int gpus) {
  PrecisionChoice c;
  const int index = detect_launch().local_rank % gpus;
  const GpuInfo gpu = cuda_device_info(index);
  c.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  c.device_name = "cuda";
  const std::string where = "cuda:" + std::to_string(index) + " of " + std::to_string(gpus) + ", " + gpu.describe();
  if (asked == PrecisionKind::kFp16)
    throw ConfigError(
        "precision: fp16 (with dynamic loss scaling) is not built yet; use bf16 (compute capability "
        ">= 8.0) or fp32");
  const PrecisionKind ran = asked != PrecisionKind::kAuto ? asked
                            : gpu.native_bf16()           ? PrecisionKind::kBf16
                                                          : PrecisionKind::kFp32;
  c.precision = choice_name(ran);
  c.reason = asked == PrecisionKind::kAuto
                 ? "auto: " + where + (gpu.native_bf16() ? " runs bf16 natively" : " (before sm_80: no native bf16)")
                 : "requested: " + where;
  c.compute = ran == PrecisionKind::kBf16 ? torch::kBFloat16 : torch::kFloat;
  return c;
}

}  // namespace

PrecisionChoice resolve_precision(const TrainConfig& cfg, const CpuInfo& cpu) {
  PrecisionChoice c;
  const int gpus = cuda_device_count();
  const DeviceKind device = parse_choice<DeviceKind>(cfg.device);
  const PrecisionKind asked = parse_choice<PrecisionKind>(cfg.precision);
  if (device == DeviceKind::kCuda && gpus == 0)
    throw ConfigError(std::string("device: cuda, but ") +
#ifdef BERTSWEEP_WITH_CUDA
                      "no GPU is visible (check CUDA_VISIBLE_DEVICES and the driver)" +
#else
                      "this build of bertsweep has no CUDA (LibTorch " TORCH_VERSION " without CUDA)" +
#endif
                      "; available: cpu. Set device: cpu or auto");
  if (device == DeviceKind::kCuda || (device == DeviceKind::kAuto && gpus > 0)) return resolve_on_gpu(asked, gpus);
  c.device = torch::kCPU;
  c.device_name = "cpu";
  const std::string isa = cpu.bf16_isa();
  const std::string where = cpu.model + ", bf16 ISA " + isa;
  if (asked == PrecisionKind::kFp16)
    throw ConfigError(
        "precision: fp16 needs device: cuda (fp16 with loss scaling is a GPU mode; on the CPU use "
        "bf16 or fp32)");
  const bool native_bf16 = isa != "none";
  const PrecisionKind ran = asked != PrecisionKind::kAuto ? asked
                            : native_bf16                 ? PrecisionKind::kBf16
                                                          : PrecisionKind::kFp32;
  c.precision = choice_name(ran);
  if (asked == PrecisionKind::kAuto)
    c.reason = native_bf16 ? "auto: " + where + " runs bf16 matmul natively"
                           : "auto: " + where + " (no AMX or AVX512-BF16, so bf16 would be emulated and slower)";
  else
    c.reason =
        "requested: " + where + (ran == PrecisionKind::kBf16 && !native_bf16 ? " (bf16 is emulated here: slow)" : "");
  c.compute = ran == PrecisionKind::kBf16 ? torch::kBFloat16 : torch::kFloat;
  return c;
}

}  // namespace bs
