// Builds one flat JSON object per line (trial events, MLLOG lines). Numbers keep full precision; NaN/inf
// become null because JSON has no spelling for them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace bs {

class JsonWriter {
 public:
  JsonWriter& add(const std::string& key, double v);
  JsonWriter& add(const std::string& key, int64_t v);
  JsonWriter& add(const std::string& key, int v) { return add(key, static_cast<int64_t>(v)); }
  JsonWriter& add(const std::string& key, bool v);
  JsonWriter& add(const std::string& key, const std::string& v);
  JsonWriter& add(const std::string& key, const char* v) { return add(key, std::string(v)); }
  JsonWriter& add(const std::string& key, const std::vector<double>& values);  // a JSON array
  JsonWriter& add_null(const std::string& key);
  // `json` is already valid JSON (a nested object or array).
  JsonWriter& add_raw(const std::string& key, const std::string& json);
  std::string str() const { return "{" + body_ + "}"; }

  static std::string quote(const std::string& s);

 private:
  void key(const std::string& k);
  void number(double v);
  std::string body_;
};

}  // namespace bs
