#include "common/Errors.h"

namespace bs {

std::string exit_codes_summary() {
  std::string s;
  for (const ExitCodeInfo& c : kExitCodes) {
    if (!s.empty()) s += ", ";
    s += std::to_string(c.code) + " " + c.meaning;
  }
  return s;
}

std::string describe(const Error& e, const std::string& who) {
  if (e.see_help()) return who + ": " + e.what() + " (see " + who + " --help)";
  const std::string kind = e.kind();
  return who + ": " + (kind.empty() ? "" : kind + ": ") + e.what();
}

}  // namespace bs
