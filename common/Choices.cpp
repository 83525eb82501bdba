#include "common/Choices.h"

#include "common/Errors.h"

namespace bs {

namespace {
struct ClipModeName {
  ClipMode mode;
  const char* name;
};
constexpr ClipModeName kClipModes[] = {
    {ClipMode::kNone, "none"},
    {ClipMode::kGlobalAfterAllreduce, "global_after_allreduce"},
    {ClipMode::kBucketBeforeAllreduce, "bucket_before_allreduce"},
    {ClipMode::kLocalBeforeAllreduce, "local_before_allreduce"},
};
}  // namespace

ClipMode parse_clip_mode(const std::string& s) {
  for (const auto& m : kClipModes)
    if (s == m.name) return m.mode;
  throw ConfigError("clip.mode: unknown mode '" + s +
                    "'; use none, global_after_allreduce, bucket_before_allreduce or local_before_allreduce");
}

const char* to_string(ClipMode m) {
  for (const auto& c : kClipModes)
    if (c.mode == m) return c.name;
  return "?";
}

}  // namespace bs
