// Where the trainer reports: trial-protocol events (one JSON object per line on stdout, an fd or a file; read
// by the controller) and MLPerf-style `:::MLLOG {json}` lines in a log file.
#pragma once
#include <cstdint>
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

// MLPerf training log lines as MLCommons' compliance checker reads them (`:::MLLOG {json}`): namespace,
// time_ms (milliseconds since the Unix epoch, never decreasing within a log), event_type, key, value and
// metadata, which always carries the calling source file and line (as mlperf_logging's mllog does).
class MlLog {
 public:
  explicit MlLog(const std::string& path);  // "" disables
  ~MlLog();
  MlLog(const MlLog&) = delete;
  MlLog& operator=(const MlLog&) = delete;
  // event_type: POINT_IN_TIME | INTERVAL_START | INTERVAL_END; value_json is raw JSON ("null", "0.72", "\"x\"").
  // `file`/`line` default to the caller's position.
  void log(const std::string& key, const std::string& value_json, const std::string& event_type = "POINT_IN_TIME",
           JsonWriter metadata = {}, const char* file = __builtin_FILE(), int line = __builtin_LINE());
  void point(const std::string& key, double v, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    log(key, number(v), "POINT_IN_TIME", {}, file, line);
  }
  void point(const std::string& key, const std::string& v, const char* file = __builtin_FILE(),
             int line = __builtin_LINE()) {
    log(key, JsonWriter::quote(v), "POINT_IN_TIME", {}, file, line);
  }
  void start(const std::string& key, JsonWriter metadata = {}, const char* file = __builtin_FILE(),
             int line = __builtin_LINE()) {
    log(key, "null", "INTERVAL_START", std::move(metadata), file, line);
  }
  void end(const std::string& key, JsonWriter metadata = {}, const char* file = __builtin_FILE(),
           int line = __builtin_LINE()) {
    log(key, "null", "INTERVAL_END", std::move(metadata), file, line);
  }
  // Integers as integers, other numbers with the fewest digits that read back exactly; null for NaN/inf.
  static std::string number(double v);
  // "trainer/Trainer.cpp" from a compiler's path of that file (the part below the source tree).
  static std::string source_file(const char* path);

 private:
  FILE* out_ = nullptr;
  int64_t last_ms_ = 0;
};

}  // namespace bs
