// A small argument parser for the subcommands: --flag value, --flag=value, repeated flags, positionals.
#pragma once
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/Errors.h"

namespace bs::cli {

using bs::UsageError;

class Args {
 public:
  // `flags` are options without a value (e.g. --quiet); every other --option takes one value.
  Args(const std::vector<std::string>& argv, const std::vector<std::string>& flags = {});
  bool has(const std::string& name) const;
  std::string get(const std::string& name, const std::string& fallback = "") const;
  std::string require(const std::string& name) const;  // UsageError naming the option when absent
  long long get_int(const std::string& name, long long fallback) const;
  std::vector<std::string> all(const std::string& name) const;  // every value of a repeated option
  const std::vector<std::string>& positional() const { return positional_; }
  // UsageError for any option not in `known` (typos should not be ignored silently).
  void allow_only(const std::vector<std::string>& known) const;

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

}  // namespace bs::cli
