// Reading the environment that launchers set (OMPI_COMM_WORLD_*, PMI_*, SLURM_*).
#pragma once
#include <cstdint>
#include <cstdlib>

namespace bs {

// The variable as a whole decimal integer; `fallback` when it is unset, empty or not one number.
inline int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  return end && *end == '\0' ? static_cast<int64_t>(x) : fallback;
}

}  // namespace bs
