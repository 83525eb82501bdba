#include "dataset/Tokenizer.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/Errors.h"

namespace bs {
namespace {

// ---- UTF-8 ----
constexpr char32_t kReplacement = 0xFFFD;

// Decodes the code point at s[i], advancing i; malformed input yields U+FFFD and skips one byte.
char32_t decode_utf8(const std::string& s, std::size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  int len = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xE ? 3 : (b0 >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    ++i;
    return kReplacement;
  }
  char32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b >> 6) != 0x2) {
      ++i;
      return kReplacement;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  i += len;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ---- character classes (BERT's _is_whitespace, _is_control, _is_punctuation, _is_chinese_char) ----
bool is_whitespace(char32_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Cc and Cf characters, NUL and U+FFFD: dropped by the text cleanup.
bool is_control(char32_t c) {
  if (c == 0 || c == kReplacement) return true;
  if (c == '\t' || c == '\n' || c == '\r') return false;
  return c < 0x20 || (c >= 0x7F && c <= 0x9F) || c == 0xAD || (c >= 0x600 && c <= 0x605) ||
         (c >= 0x200B && c <= 0x200F) || (c >= 0x202A && c <= 0x202E) || (c >= 0x2060 && c <= 0x2064) || c == 0xFEFF;
}

bool is_punctuation(char32_t c) {
  // BERT treats every non-alphanumeric ASCII character as punctuation ($, ^, ` too).
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  // Unicode category P* for the blocks that occur in practice.
  return c == 0xA1 || c == 0xA7 || c == 0xAB || c == 0xB6 || c == 0xB7 || c == 0xBB || c == 0xBF || c == 0x37E ||
         c == 0x387 || (c >= 0x2010 && c <= 0x2027) || (c >= 0x2030 && c <= 0x205E) || (c >= 0x3001 && c <= 0x3003) ||
         (c >= 0x3008 && c <= 0x3011) || (c >= 0x3014 && c <= 0x301F) || (c >= 0xFF01 && c <= 0xFF03) ||
         (c >= 0xFF05 && c <= 0xFF0A) || (c >= 0xFF0C && c <= 0xFF0F) || c == 0xFF1A || c == 0xFF1B || c == 0xFF1F ||
         c == 0xFF20 || (c >= 0xFF3B && c <= 0xFF3D) || c == 0xFF3F || c == 0xFF5B || c == 0xFF5D;
}

bool is_chinese(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// Combining marks (category Mn in the common blocks): what NFD-then-drop-Mn removes.
bool is_combining_mark(char32_t c) {
  return (c >= 0x300 && c <= 0x36F) || (c >= 0x1AB0 && c <= 0x1AFF) || (c >= 0x1DC0 && c <= 0x1DFF) ||
         (c >= 0x20D0 && c <= 0x20FF) || (c >= 0xFE20 && c <= 0xFE2F);
}

// Python's str.lower() for Latin-1, Latin Extended-A, basic Greek and Cyrillic.
char32_t to_lower(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0xC0) return c;
  if (c <= 0xDE) return c == 0xD7 ? c : c + 0x20;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x130) return 'i';  // 'İ'.lower() is 'i' + combining dot, which accent stripping drops
    if (c <= 0x137 || (c >= 0x14A && c <= 0x177)) return (c % 2 == 0) ? c + 1 : c;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 1) ? c + 1 : c;
    if (c == 0x178) return 0xFF;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 0x20;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  return c;
}

// Base letter of the canonical decomposition (NFD) of U+00C0..U+017F; '-' where there is none (Æ, Ø, ß, Ł...).
const char* kLatinBase =
    "AAAAAA-CEEEEIIII-NOOOOO--UUUUY--aaaaaa-ceeeeiiii-nooooo--uuuuy-y"   // U+00C0..U+00FF
    "AaAaAaCcCcCcCcDd--EeEeEeEeEeGgGgGgGgHh--IiIiIiIiI---JjKk-LlLlLl-"   // U+0100..U+013F
    "---NnNnNn---OoOoOo--RrRrRrSsSsSsSsTtTt--UuUuUuUuUuUuWwYyYZzZzZz-";  // U+0140..U+017F

// Accent stripping: the base letter, or 0 for a combining mark (dropped).
char32_t strip_accent(char32_t c) {
  if (is_combining_mark(c)) return 0;
  if (c >= 0xC0 && c <= 0x17F) {
    const char b = kLatinBase[c - 0xC0];
    return b == '-' ? c : static_cast<char32_t>(b);
  }
  return c;
}

}  // namespace

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t start = i;
    const char32_t cp = decode_utf8(s, i);
    if (cp == kReplacement && i - start == 1 && static_cast<unsigned char>(s[start]) >= 0x80) {
      out.emplace_back();
      append_utf8(out.back(), kReplacement);
    } else {
      out.push_back(s.substr(start, i - start));
    }
  }
  return out;
}

// ---- Vocab ----
const std::vector<std::string>& Vocab::special_tokens() {
  static const std::vector<std::string> kSpecials = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  return kSpecials;
}

Vocab::Vocab(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {
  ids_.reserve(tokens_.size());
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    ids_.emplace(tokens_[i], static_cast<int32_t>(i));  // first occurrence wins
    const std::string& t = tokens_[i];
    const bool bracketed = t.size() >= 2 && t.front() == '[' && t.back() == ']';
    if (!bracketed && !t.empty()) ordinary_.push_back(static_cast<int32_t>(i));
  }
  auto find = [&](const char* name) {
    auto it = ids_.find(name);
    return it == ids_.end() ? -1 : it->second;
  };
  pad_ = find("[PAD]");
  unk_ = find("[UNK]");
  cls_ = find("[CLS]");
  sep_ = find("[SEP]");
  mask_ = find("[MASK]");
}

Vocab Vocab::load(const std::string& path) {
  std::ifstream in(path);
  if (!in || std::filesystem::is_directory(path))
    throw DataError("cannot read vocab file " + path + " (give a BERT vocab.txt, or --vocab-size N to train one)");
  std::vector<std::string> tokens;
  std::string line;
  while (std::getline(in, line)) {
    // BERT strips each line; keep inner spaces (none in real vocabs).
    std::size_t b = line.find_first_not_of(" \t\r\n"), e = line.find_last_not_of(" \t\r\n");
    tokens.push_back(b == std::string::npos ? std::string() : line.substr(b, e - b + 1));
  }
  if (in.bad()) throw DataError("error reading vocab file " + path);
  Vocab v(std::move(tokens));
  for (const auto& s : special_tokens())
    if (!v.contains(s))
      throw DataError("vocab file " + path + " has no " + s +
                      " token (a BERT vocab.txt needs [PAD] [UNK] [CLS] [SEP] [MASK])");
  return v;
}

void Vocab::save(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw DataError("cannot write vocab file " + tmp);
    for (const auto& t : tokens_) out << t << '\n';
    out.flush();
    if (!out) throw DataError("error writing vocab file " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

int32_t Vocab::id(const std::string& token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? unk_ : it->second;
}

// ---- tokenization ----
std::vector<std::string> basic_tokenize(const std::string& text, bool lower_case) {
  std::vector<std::string> words;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) words.push_back(std::move(cur));
    cur.clear();
  };
  for (std::size_t i = 0; i < text.size();) {
    char32_t c = decode_utf8(text, i);
    if (is_control(c)) continue;
    if (is_whitespace(c)) {
      flush();
      continue;
    }
    if (is_chinese(c)) {
      flush();
      append_utf8(cur, c);
      flush();
      continue;
    }
    if (lower_case) {
      c = strip_accent(to_lower(c));
      if (c == 0) continue;
    }
    if (is_punctuation(c)) {
      flush();
      append_utf8(cur, c);
      flush();
      continue;
    }
    append_utf8(cur, c);
  }
  flush();
  return words;
}

std::vector<std::string> wordpiece_tokenize(const std::string& word, const Vocab& vocab, int max_chars) {
  static const std::string kUnk = "[UNK]";
  // Byte offsets of the code point boundaries.
  std::vector<std::size_t> bounds{0};
  for (std::size_t i = 0; i < word.size();) {
    decode_utf8(word, i);
    bounds.push_back(i);
  }
  const std::size_t n = bounds.size() - 1;
  if (n == 0) return {};
  if (static_cast<int>(n) > max_chars) return {kUnk};
  std::vector<std::string> pieces;
  std::string candidate;
  for (std::size_t start = 0; start < n;) {
    std::size_t end = n;
    bool found = false;
    for (; end > start; --end) {
      candidate.assign(start > 0 ? "##" : "");
      candidate.append(word, bounds[start], bounds[end] - bounds[start]);
      if (vocab.contains(candidate)) {
        found = true;
        break;
      }
    }
    if (!found) return {kUnk};
    pieces.push_back(candidate);
    start = end;
  }
  return pieces;
}

Tokenizer::Tokenizer(Vocab vocab, bool lower_case) : vocab_(std::move(vocab)), lower_case_(lower_case) {}

std::vector<std::string> Tokenizer::tokenize(const std::string& text) {
  std::vector<std::string> out;
  for (const auto& w : basic_tokenize(text, lower_case_))
    for (int32_t id : encode_word(w)) out.push_back(vocab_.token(id));
  return out;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) {
  std::vector<int32_t> out;
  for (const auto& w : basic_tokenize(text, lower_case_)) {
    const auto& ids = encode_word(w);
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

const std::vector<int32_t>& Tokenizer::encode_word(const std::string& word) {
  auto it = cache_.find(word);
  if (it != cache_.end()) return it->second;
  std::vector<int32_t> ids;
  for (const auto& p : wordpiece_tokenize(word, vocab_)) ids.push_back(vocab_.id(p));
  return cache_.emplace(word, std::move(ids)).first->second;
}

}  // namespace bs
