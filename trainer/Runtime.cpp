#include "trainer/Runtime.h"

#include <dlfcn.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "common/Env.h"

namespace bs {

namespace {

std::string blas_library(bool& reference) {
  reference = false;
  void* sym = dlsym(RTLD_DEFAULT, "sgemm_");
  std::string path = "unknown";
  Dl_info info{};
  if (sym && dladdr(sym, &info) && info.dli_fname) {
    std::error_code ec;
    auto real = std::filesystem::canonical(info.dli_fname, ec);
    path = ec ? info.dli_fname : real.string();
  }
  using ConfigFn = char* (*)();
  if (auto cfg = reinterpret_cast<ConfigFn>(dlsym(RTLD_DEFAULT, "openblas_get_config"))) {
    return std::string("OpenBLAS ") + cfg() + " [" + path + "]";
  }
  if (dlsym(RTLD_DEFAULT, "mkl_get_max_threads")) return "MKL [" + path + "]";
  if (path.find("blis") != std::string::npos) return "BLIS [" + path + "]";
  if (path.find("atlas") != std::string::npos) return "ATLAS [" + path + "]";
  reference = true;
  return "reference BLAS (slow! install libopenblas0-pthread) [" + path + "]";
}
}  // namespace

RuntimeInfo configure_runtime(int64_t threads) {
  RuntimeInfo info;
  info.local_ranks = std::max<int64_t>(1, env_int("OMPI_COMM_WORLD_LOCAL_SIZE", env_int("SLURM_NTASKS_PER_NODE", 1)));
  int64_t cores = std::max<unsigned>(1, std::thread::hardware_concurrency());
  info.threads = threads > 0 ? threads : std::max<int64_t>(1, cores / info.local_ranks);
  torch::set_num_threads(static_cast<int>(info.threads));
  // One inter-op thread: set before any parallel work, and only once per process.
  static bool interop_set = false;
  if (!interop_set) {
    try {
      torch::set_num_interop_threads(1);
    } catch (...) {
    }
    interop_set = true;
  }
  using SetFn = void (*)(int);
  if (auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    set(static_cast<int>(info.threads));
  info.blas = blas_library(info.blas_is_reference);
  return info;
}

std::string describe(const RuntimeInfo& info) {
  return "threads=" + std::to_string(info.threads) + " (ranks on node: " + std::to_string(info.local_ranks) +
         "), BLAS: " + info.blas;
}

}  // namespace bs
