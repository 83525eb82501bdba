#include "trainer/EventLog.h"

#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "common/TrainConfig.h"

namespace bs {

EventSink::EventSink(const std::string& spec) {
  if (spec.empty() || spec == "none") return;
  if (spec == "stdout") {
    out_ = stdout;
  } else if (spec.rfind("fd:", 0) == 0) {
    int fd = -1;
    try {
      fd = std::stoi(spec.substr(3));
    } catch (...) {
    }
    out_ = fd >= 0 ? fdopen(fd, "w") : nullptr;
    if (!out_) throw ConfigError("--events " + spec + ": not an open file descriptor");
    owned_ = true;
  } else {
    out_ = std::fopen(spec.c_str(), "a");
    if (!out_) throw ConfigError("--events " + spec + ": cannot open the file for appending");
    owned_ = true;
  }
}

EventSink::~EventSink() {
  if (owned_ && out_) std::fclose(out_);
}

void EventSink::emit(const std::string& name, JsonWriter fields) {
  if (!out_) return;
  JsonWriter line;
  line.add("event", name);
  std::string body = fields.str();
  std::string out = line.str();
  if (body.size() > 2) out = out.substr(0, out.size() - 1) + ", " + body.substr(1);
  std::fputs(out.c_str(), out_);
  std::fputc('\n', out_);
  std::fflush(out_);
}

MlLog::MlLog(const std::string& path) {
  if (path.empty()) return;
  out_ = std::fopen(path.c_str(), "a");
  if (!out_) throw ConfigError("log.mllog: cannot open '" + path + "' for writing (does its folder exist?)");
}

MlLog::~MlLog() {
  if (out_) std::fclose(out_);
}

std::string MlLog::number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  if (std::floor(v) == v && std::fabs(v) < 9007199254740992.0) {  // integers exactly, without an exponent
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string MlLog::source_file(const char* path) {
  std::string p = path ? path : "";
  // The project's top-level source folders; anything else keeps its last component.
  for (const char* dir : {"trainer/", "cli/", "common/", "optimizers/", "search/", "studies/", "analysis/"}) {
    auto at = p.rfind(std::string("/") + dir);
    if (at != std::string::npos) return p.substr(at + 1);
    if (p.rfind(dir, 0) == 0) return p;
  }
  auto slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

void MlLog::log(const std::string& key, const std::string& value_json, const std::string& event_type,
                JsonWriter metadata, const char* file, int line) {
  if (!out_) return;
  int64_t ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  ms = std::max(ms, last_ms_);  // a clock step back must not reorder the log
  last_ms_ = ms;
  // file and lineno first, then the key's own metadata.
  JsonWriter md;
  md.add("file", source_file(file)).add("lineno", static_cast<int64_t>(line));
  std::string own = metadata.str(), where = md.str();
  if (own.size() > 2) where = where.substr(0, where.size() - 1) + ", " + own.substr(1);
  JsonWriter j;
  j.add("namespace", "").add("time_ms", ms).add("event_type", event_type).add("key", key);
  j.add_raw("value", value_json).add_raw("metadata", where);
  std::fprintf(out_, ":::MLLOG %s\n", j.str().c_str());
  std::fflush(out_);
}

}  // namespace bs
