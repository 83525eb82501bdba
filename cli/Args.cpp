#include "cli/Args.h"

#include <algorithm>

namespace bs::cli {

Args::Args(const std::vector<std::string>& argv, const std::vector<std::string>& flags) {
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) == 0 && a.size() > 2) {
      std::string name = a.substr(2), value;
      auto eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (std::find(flags.begin(), flags.end(), name) != flags.end()) {
        value = "true";
      } else {
        if (i + 1 >= argv.size()) throw UsageError("option --" + name + " needs a value");
        value = argv[++i];
      }
      values_[name].push_back(value);
    } else {
      positional_.push_back(a);
    }
  }
}

bool Args::has(const std::string& name) const { return values_.count(name) > 0; }

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.back();
}

std::string Args::require(const std::string& name) const {
  if (!has(name)) throw UsageError("missing required option --" + name);
  return get(name);
}

long long Args::get_int(const std::string& name, long long fallback) const {
  if (!has(name)) return fallback;
  try {
    std::size_t n = 0;
    long long v = std::stoll(get(name), &n);
    if (n != get(name).size()) throw std::invalid_argument("trailing");
    return v;
  } catch (...) {
    throw UsageError("option --" + name + " must be an integer, got '" + get(name) + "'");
  }
}

std::vector<std::string> Args::all(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

void Args::allow_only(const std::vector<std::string>& known) const {
  for (const auto& kv : values_)
    if (std::find(known.begin(), known.end(), kv.first) == known.end())
      throw UsageError("unknown option --" + kv.first + " (see --help)");
}

}  // namespace bs::cli
