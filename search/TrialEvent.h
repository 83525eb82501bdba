// One line of the trial protocol (docs/ARCHITECTURE.md section 2): a flat JSON object such as
// {"event":"eval","step":10,"samples":320,"mlm_accuracy":0.12,"loss":6.1,"seconds":3.2}.
#pragma once
#include <map>
#include <optional>
#include <string>

namespace bs::search {

struct TrialEvent {
  std::string kind;                            // the "event" field: start, eval, throughput, rank_load
                                               // (trainers of more than one rank), done
  std::map<std::string, double> numbers;       // numbers and booleans (true = 1); JSON null is left out
  std::map<std::string, std::string> strings;  // strings, and nested arrays/objects as their raw JSON text
  std::string line;                            // the line as received

  double number(const std::string& key, double fallback = 0) const;
  std::optional<double> maybe(const std::string& key) const;
  bool flag(const std::string& key) const { return number(key, 0) != 0; }
};

// Parses one line; nullopt when it is not a JSON object with an "event" string (e.g. a stray print).
std::optional<TrialEvent> parse_trial_event(const std::string& line);

}  // namespace bs::search
