// The CUDA facts and settings the trainer needs, behind a header without CUDA includes: callers compile
// against a CPU-only LibTorch too. Without a CUDA build (BERTSWEEP_WITH_CUDA) there are no GPUs here.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace bs {

struct GpuInfo {
  int index = 0;
  std::string name;          // e.g. "NVIDIA H200"
  int major = 0, minor = 0;  // compute capability
  int64_t memory_bytes = 0;
  bool native_bf16() const { return major >= 8; }  // Ampere and later
  std::string describe() const;                    // "NVIDIA H200 (sm_90, 139.8 GiB)"
};

// GPUs visible to this process (0 without a CUDA build, driver or device).
int cuda_device_count();
// Throws std::runtime_error without a CUDA build.
GpuInfo cuda_device_info(int index);
// Makes `index` this thread's current device (kernels, NCCL, the caching allocator).
void set_cuda_device(int index);

}  // namespace bs
