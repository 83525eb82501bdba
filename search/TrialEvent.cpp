#include "search/TrialEvent.h"

#include <cctype>
#include <cstdlib>

namespace bs::search {

double TrialEvent::number(const std::string& key, double fallback) const {
  auto it = numbers.find(key);
  return it == numbers.end() ? fallback : it->second;
}

std::optional<double> TrialEvent::maybe(const std::string& key) const {
  auto it = numbers.find(key);
  if (it == numbers.end()) return std::nullopt;
  return it->second;
}

namespace {

// A small reader for one flat JSON object; nested values are kept as raw text.
struct Reader {
  const std::string& s;
  std::size_t i = 0;

  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  bool string(std::string& out) {
    ws();
    if (i >= s.size() || s[i] != '"') return false;
    ++i;
    out.clear();
    while (i < s.size() && s[i] != '"') {
      char c = s[i++];
      if (c == '\\' && i < s.size()) {
        char e = s[i++];
        switch (e) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'u':  // keep \uXXXX as is: event strings are ASCII names
            out += "\\u";
            break;
          default: out += e;
        }
      } else {
        out += c;
      }
    }
    if (i >= s.size()) return false;
    ++i;
    return true;
  }
  // Skips a nested array/object, returning its text.
  bool nested(std::string& out) {
    std::size_t start = i;
    int depth = 0;
    bool in_str = false;
    for (; i < s.size(); ++i) {
      char c = s[i];
      if (in_str) {
        if (c == '\\') ++i;
        else if (c == '"')
          in_str = false;
        continue;
      }
      if (c == '"') in_str = true;
      else if (c == '[' || c == '{')
        ++depth;
      else if (c == ']' || c == '}') {
        if (--depth == 0) {
          ++i;
          out = s.substr(start, i - start);
          return true;
        }
      }
    }
    return false;
  }
};

}  // namespace

std::optional<TrialEvent> parse_trial_event(const std::string& line) {
  Reader r{line};
  TrialEvent ev;
  ev.line = line;
  if (!r.eat('{')) return std::nullopt;
  if (!r.eat('}')) {
    do {
      std::string key;
      if (!r.string(key) || !r.eat(':')) return std::nullopt;
      r.ws();
      if (r.i >= line.size()) return std::nullopt;
      char c = line[r.i];
      if (c == '"') {
        std::string v;
        if (!r.string(v)) return std::nullopt;
        ev.strings[key] = v;
      } else if (c == '[' || c == '{') {
        std::string v;
        if (!r.nested(v)) return std::nullopt;
        ev.strings[key] = v;
      } else if (line.compare(r.i, 4, "true") == 0) {
        ev.numbers[key] = 1;
        r.i += 4;
      } else if (line.compare(r.i, 5, "false") == 0) {
        ev.numbers[key] = 0;
        r.i += 5;
      } else if (line.compare(r.i, 4, "null") == 0) {
        r.i += 4;
      } else {
        const char* begin = line.c_str() + r.i;
        char* end = nullptr;
        double v = std::strtod(begin, &end);
        if (end == begin) return std::nullopt;
        r.i += static_cast<std::size_t>(end - begin);
        ev.numbers[key] = v;
      }
    } while (r.eat(','));
    if (!r.eat('}')) return std::nullopt;
  }
  r.ws();
  if (r.i != line.size()) return std::nullopt;
  auto k = ev.strings.find("event");
  if (k == ev.strings.end()) return std::nullopt;
  ev.kind = k->second;
  return ev;
}

}  // namespace bs::search
