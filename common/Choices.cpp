#include "common/Choices.h"

#include <map>

#include "common/Errors.h"

namespace bs {

namespace {

// Each enum's config key and spellings, indexed by the enum's value.
template <class E>
struct Spelling;
#define BS_CHOICE(E, KEY, ...)                                 \
  template <>                                                  \
  struct Spelling<E> {                                         \
    static constexpr const char* key = KEY;                    \
    static const std::vector<std::string>& names() {           \
      static const std::vector<std::string> n = {__VA_ARGS__}; \
      return n;                                                \
    }                                                          \
  };
BS_CHOICE(OptimizerKind, "optimizer.name", "adam", "adamw", "lamb", "nvlamb", "lans", "sgd")
BS_CHOICE(ScheduleKind, "schedule.name", "constant", "poly", "linear", "cosine", "inv_sqrt")
BS_CHOICE(SamplerKind, "data.sampler", "random", "global_sort", "local_presort", "packing")
BS_CHOICE(ClipMode, "clip.mode", "none", "global_after_allreduce", "bucket_before_allreduce", "local_before_allreduce")
BS_CHOICE(BackendKind, "distributed.backend", "none", "mpi", "nccl", "auto")
BS_CHOICE(GradDtype, "distributed.grad_dtype", "fp32", "compute")
BS_CHOICE(DeviceKind, "device", "auto", "cpu", "cuda")
BS_CHOICE(PrecisionKind, "precision", "auto", "fp32", "bf16", "fp16")
BS_CHOICE(KernelsKind, "model.kernels", "auto", "fused", "reference")
BS_CHOICE(UnpadKind, "model.unpad", "auto", "on", "off")
#undef BS_CHOICE

template <class E>
void add_to(std::map<std::string, std::vector<std::string>>& m) {
  m[Spelling<E>::key] = Spelling<E>::names();
}

}  // namespace

template <class E>
E parse_choice(const std::string& value) {
  const auto& names = Spelling<E>::names();
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == value) return static_cast<E>(i);
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  throw ConfigError(std::string(Spelling<E>::key) + ": unknown value '" + value + "'; use one of " + list);
}

template <class E>
const char* choice_name(E value) {
  const auto& names = Spelling<E>::names();
  const auto i = static_cast<std::size_t>(value);
  return i < names.size() ? names[i].c_str() : "?";
}

#define BS_INSTANTIATE(E)                         \
  template E parse_choice<E>(const std::string&); \
  template const char* choice_name<E>(E);
BS_INSTANTIATE(OptimizerKind)
BS_INSTANTIATE(ScheduleKind)
BS_INSTANTIATE(SamplerKind)
BS_INSTANTIATE(ClipMode)
BS_INSTANTIATE(BackendKind)
BS_INSTANTIATE(GradDtype)
BS_INSTANTIATE(DeviceKind)
BS_INSTANTIATE(PrecisionKind)
BS_INSTANTIATE(KernelsKind)
BS_INSTANTIATE(UnpadKind)
#undef BS_INSTANTIATE

const std::vector<std::string>& choice_values(const std::string& key) {
  static const std::map<std::string, std::vector<std::string>> all = [] {
    std::map<std::string, std::vector<std::string>> m;
    add_to<OptimizerKind>(m);
    add_to<ScheduleKind>(m);
    add_to<SamplerKind>(m);
    add_to<ClipMode>(m);
    add_to<BackendKind>(m);
    add_to<GradDtype>(m);
    add_to<DeviceKind>(m);
    add_to<PrecisionKind>(m);
    add_to<KernelsKind>(m);
    add_to<UnpadKind>(m);
    return m;
  }();
  static const std::vector<std::string> none;
  auto it = all.find(key);
  return it == all.end() ? none : it->second;
}

bool is_lamb_family(OptimizerKind kind) {
  return kind == OptimizerKind::kLamb || kind == OptimizerKind::kNvLamb || kind == OptimizerKind::kLans;
}

}  // namespace bs
