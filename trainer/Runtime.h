// Process-wide compute settings: thread counts for torch (OpenMP) and the BLAS, and which BLAS is loaded.
// Debian's LibTorch links the generic libblas.so.3: the reference BLAS is ~30x slower than OpenBLAS, so the
// trainer always reports which one it got.
#pragma once
#include <cstdint>
#include <string>

namespace bs {

struct RuntimeInfo {
  int64_t threads = 1;  // torch intra-op threads (and BLAS threads)
  std::string blas;     // e.g. "OpenBLAS 0.3.21 (pthread) /usr/lib/.../libblas.so.3"
  bool blas_is_reference = false;
  int64_t local_ranks = 1;  // ranks of this job on this node (share the cores)
  std::string allocator;    // how host memory is served (configure_runtime keeps large tensors in the heap)
};

// threads = 0: the cores of this machine divided by the ranks on this node. Sets torch::set_num_threads,
// a single inter-op thread, and OpenBLAS's own thread count (openblas_set_num_threads when present); keeps
// tensors up to 1 GiB in glibc's heap instead of mmap/munmap per allocation (see Runtime.cpp).
RuntimeInfo configure_runtime(int64_t threads);

// Short human line, for the trainer's start banner.
std::string describe(const RuntimeInfo& info);

}  // namespace bs
