#include "common/JsonWriter.h"

#include <cmath>
#include <cstdio>

namespace bs {

std::string JsonWriter::quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

void JsonWriter::key(const std::string& k) {
  if (!body_.empty()) body_ += ", ";
  body_ += quote(k) + ": ";
}

void JsonWriter::number(double v) {
  if (!std::isfinite(v)) {
    body_ += "null";
  } else {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    body_ += buf;
  }
}

JsonWriter& JsonWriter::add(const std::string& k, double v) {
  key(k);
  number(v);
  return *this;
}
JsonWriter& JsonWriter::add(const std::string& k, const std::vector<double>& values) {
  key(k);
  body_ += "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) body_ += ", ";
    number(values[i]);
  }
  body_ += "]";
  return *this;
}
JsonWriter& JsonWriter::add(const std::string& k, int64_t v) {
  key(k);
  body_ += std::to_string(v);
  return *this;
}
JsonWriter& JsonWriter::add(const std::string& k, bool v) {
  key(k);
  body_ += v ? "true" : "false";
  return *this;
}
JsonWriter& JsonWriter::add(const std::string& k, const std::string& v) {
  key(k);
  body_ += quote(v);
  return *this;
}
JsonWriter& JsonWriter::add_null(const std::string& k) {
  key(k);
  body_ += "null";
  return *this;
}
JsonWriter& JsonWriter::add_raw(const std::string& k, const std::string& json) {
  key(k);
  body_ += json;
  return *this;
}

}  // namespace bs
