#include "trainer/Runtime.h"

#include <dlfcn.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
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

// glibc serves allocations above M_MMAP_THRESHOLD (at most 32 MiB by its dynamic rule) by mmap and returns
// them by munmap, so each step's activation tensors (a [B*L, 4H] fp32 tensor is 32 MiB at bert-mini batch 64)
// come back as fresh pages and are zero-filled by the kernel on first touch: measured on bert-mini batch 64,
// half the step time. Keeping them in the heap (what jemalloc or tcmalloc do, as PyTorch's CPU tuning guides
// advise) makes the step's memory a reused pool, as on a GPU's caching allocator; the price is that the
// process keeps its peak heap instead of returning it between steps. A user's own MALLOC_MMAP_THRESHOLD_ /
// MALLOC_TRIM_THRESHOLD_ (glibc's variables) wins.
static std::string configure_allocator() {
#if defined(__GLIBC__)
  const bool user =
      std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("MALLOC_TRIM_THRESHOLD_") || std::getenv("GLIBC_TUNABLES");
  if (user) return "glibc malloc (the environment's settings)";
  const int kKeep = 1 << 30;  // 1 GiB: every activation of the models here
  if (mallopt(M_MMAP_THRESHOLD, kKeep) == 1 && mallopt(M_TRIM_THRESHOLD, kKeep) == 1)
    return "glibc malloc, tensors up to 1 GiB kept in the heap";
  return "glibc malloc (mallopt refused: defaults)";
#else
  return "the C library's malloc";
#endif
}

RuntimeInfo configure_runtime(int64_t threads) {
  RuntimeInfo info;
  info.allocator = configure_allocator();
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
         "), BLAS: " + info.blas + ", allocator: " + info.allocator;
}

}  // namespace bs
