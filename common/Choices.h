// The choice keys of the training config as enums: each key's spellings are listed once here (TrainConfig's
// validation reads them from here too), and the code that branches converts the validated string once, so
// that a misspelt comparison cannot compile. TrainConfig keeps the strings: they are what YAML, --set, the
// study file and the search space carry.
#pragma once
#include <string>
#include <vector>

namespace bs {

enum class OptimizerKind { kAdam, kAdamW, kLamb, kNvLamb, kLans, kSgd };   // optimizer.name
enum class ScheduleKind { kConstant, kPoly, kLinear, kCosine, kInvSqrt };  // schedule.name
enum class SamplerKind { kRandom, kGlobalSort, kLocalPresort, kPacking };  // data.sampler
// clip.mode: where the gradient is clipped relative to the allreduce (distributed/GradientBucketer.h).
enum class ClipMode { kNone, kGlobalAfterAllreduce, kBucketBeforeAllreduce, kLocalBeforeAllreduce };
enum class BackendKind { kNone, kMpi, kNccl, kAuto };     // distributed.backend
enum class GradDtype { kFp32, kCompute };                 // distributed.grad_dtype
enum class DeviceKind { kAuto, kCpu, kCuda };             // device
enum class PrecisionKind { kAuto, kFp32, kBf16, kFp16 };  // precision
enum class KernelsKind { kAuto, kFused, kReference };     // model.kernels
enum class UnpadKind { kAuto, kOn, kOff };                // model.unpad

// The enum of a choice key's value; ConfigError naming the key and its values for anything else.
template <class E>
E parse_choice(const std::string& value);
// The value as the config spells it ("bucket_before_allreduce").
template <class E>
const char* choice_name(E value);

// The spellings of a choice key above ("optimizer.name" -> adam, adamw, ...), in enum order; empty for
// any other key.
const std::vector<std::string>& choice_values(const std::string& key);

// The LAMB family: a layer-wise trust ratio scales each tensor's update (lamb, nvlamb, lans).
bool is_lamb_family(OptimizerKind kind);

}  // namespace bs
