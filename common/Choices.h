// The choice keys that code branches on, as enums: parsed once from the validated config string, so a
// misspelt comparison cannot compile. TrainConfig keeps the strings (they are what YAML, --set, the study
// file and the search space carry); the parts that branch convert here.
#pragma once
#include <string>

namespace bs {

// clip.mode: where the gradient is clipped relative to the allreduce (distributed/GradientBucketer.h).
enum class ClipMode { kNone, kGlobalAfterAllreduce, kBucketBeforeAllreduce, kLocalBeforeAllreduce };

// ConfigError naming clip.mode and the valid values for anything else.
ClipMode parse_clip_mode(const std::string& s);
const char* to_string(ClipMode m);

}  // namespace bs
