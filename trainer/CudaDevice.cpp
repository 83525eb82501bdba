#include "trainer/CudaDevice.h"

#include <cstdio>
#include <stdexcept>

#ifdef BERTSWEEP_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime.h>
#endif

namespace bs {

std::string GpuInfo::describe() const {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.1f GiB)", name.c_str(), major, minor,
                double(memory_bytes) / 1073741824.0);
  return buf;
}

#ifdef BERTSWEEP_WITH_CUDA

int cuda_device_count() { return torch::cuda::is_available() ? int(torch::cuda::device_count()) : 0; }

GpuInfo cuda_device_info(int index) {
  cudaDeviceProp p{};
  const cudaError_t e = cudaGetDeviceProperties(&p, index);
  if (e != cudaSuccess)
    throw std::runtime_error("cuda:" + std::to_string(index) +
                             ": cudaGetDeviceProperties failed: " + cudaGetErrorString(e));
  GpuInfo g;
  g.index = index;
  g.name = p.name;
  g.major = p.major;
  g.minor = p.minor;
  g.memory_bytes = int64_t(p.totalGlobalMem);
  return g;
}

void set_cuda_device(int index) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(index)); }

#else

int cuda_device_count() { return 0; }

GpuInfo cuda_device_info(int index) {
  throw std::runtime_error("cuda:" + std::to_string(index) + ": this build of bertsweep has no CUDA");
}

void set_cuda_device(int index) {
  throw std::runtime_error("cuda:" + std::to_string(index) + ": this build of bertsweep has no CUDA");
}

#endif

}  // namespace bs
