#include "trainer/EventLog.h"

#include <chrono>
#include <cmath>
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
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

void MlLog::log(const std::string& key, const std::string& value_json, const std::string& event_type,
                JsonWriter metadata) {
  if (!out_) return;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::system_clock::now().time_since_epoch())
                .count();
  JsonWriter j;
  j.add("namespace", "").add("time_ms", static_cast<int64_t>(ms)).add("event_type", event_type).add("key", key);
  j.add_raw("value", value_json).add_raw("metadata", metadata.str());
  std::fprintf(out_, ":::MLLOG %s\n", j.str().c_str());
  std::fflush(out_);
}

}  // namespace bs
