// What the micro-benchmarks of bench/ (bench_fused_ops, bench_onednn_epilogue) share: their two flags and the
// timing of one call.
#pragma once
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>

namespace bs::bench {

struct MicroBenchArgs {
  int threads = 2, reps = 20;
};

// --threads N and --reps N; anything else is ignored.
inline MicroBenchArgs parse_micro_bench_args(int argc, char** argv) {
  MicroBenchArgs a;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads")) a.threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) a.reps = std::atoi(argv[i + 1]);
  }
  return a;
}

// Mean seconds per call of f over `reps` calls, after one warm-up call (allocations, oneDNN's JIT).
inline double seconds_per_call(const std::function<void()>& f, int reps) {
  f();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

}  // namespace bs::bench
