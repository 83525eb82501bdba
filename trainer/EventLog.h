// Where the trainer reports: trial-protocol events (one JSON object per line on stdout, an fd or a file; read
// by the controller) and MLPerf-style `:::MLLOG {json}` lines in a log file.
#pragma once
#include <cstdio>
#include <string>

#include "common/JsonWriter.h"

namespace bs {

class EventSink {
 public:
  // spec: "" (none), "stdout", "fd:N", or a file path (appended).
  explicit EventSink(const std::string& spec);
  ~EventSink();
  EventSink(const EventSink&) = delete;
  EventSink& operator=(const EventSink&) = delete;
  // Writes {"event": name, ...fields} and flushes, so the controller sees it at once.
  void emit(const std::string& name, JsonWriter fields);
  bool enabled() const { return out_ != nullptr; }

 private:
  FILE* out_ = nullptr;
  bool owned_ = false;
};

class MlLog {
 public:
  explicit MlLog(const std::string& path);  // "" disables
  ~MlLog();
  MlLog(const MlLog&) = delete;
  MlLog& operator=(const MlLog&) = delete;
  // event_type: POINT | INTERVAL_START | INTERVAL_END; value_json is raw JSON ("null", "0.72", "\"x\"").
  void log(const std::string& key, const std::string& value_json, const std::string& event_type = "POINT",
           JsonWriter metadata = {});
  void point(const std::string& key, double v) { log(key, number(v)); }
  void point(const std::string& key, const std::string& v) { log(key, JsonWriter::quote(v)); }
  static std::string number(double v);

 private:
  FILE* out_ = nullptr;
};

}  // namespace bs
