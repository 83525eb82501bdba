#include "dataset/VocabTrainer.h"

#include <algorithm>
#include <map>
#include <optional>
#include <queue>
#include <stdexcept>

namespace bs {
namespace {

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }
int32_t key_first(uint64_t k) { return static_cast<int32_t>(k >> 32); }
int32_t key_second(uint64_t k) { return static_cast<int32_t>(k & 0xFFFFFFFFu); }

// A word of the corpus as its current symbols, with its count.
struct WordState {
  std::vector<int32_t> symbols;
  int64_t count = 0;
};

// WordPiece training state: the symbols ("c" starting a word, "##c" inside one, and merges), the words as
// symbol sequences, and for each adjacent pair its count, the words it occurs in and a lazy max-heap.
class PairMerger {
 public:
  // Single characters of each word (sorted input: deterministic symbol ids).
  explicit PairMerger(const std::vector<std::pair<std::string, int64_t>>& words) {
    for (const auto& [w, c] : words) {
      auto chars = utf8_chars(w);
      if (chars.empty() || chars.size() > 100) continue;  // such words become [UNK] anyway
      WordState ws;
      ws.count = c;
      for (std::size_t i = 0; i < chars.size(); ++i) {
        int32_t s = symbol(i == 0 ? chars[i] : "##" + chars[i]);
        if (static_cast<std::size_t>(s) >= char_freq_.size()) char_freq_.resize(s + 1, 0);
        char_freq_[s] += c;
        ws.symbols.push_back(s);
      }
      words_.push_back(std::move(ws));
    }
  }

  // The `room` most frequent characters (ties: first seen); words with a dropped character never merge.
  std::vector<std::string> keep_alphabet(std::size_t room) {
    std::vector<int32_t> alphabet(names_.size());
    for (std::size_t i = 0; i < alphabet.size(); ++i) alphabet[i] = static_cast<int32_t>(i);
    std::stable_sort(alphabet.begin(), alphabet.end(),
                     [&](int32_t a, int32_t b) { return char_freq_[a] > char_freq_[b]; });
    std::vector<char> kept(names_.size(), 1);
    if (alphabet.size() > room) {
      for (std::size_t i = room; i < alphabet.size(); ++i) kept[alphabet[i]] = 0;
      alphabet.resize(room);
    }
    words_.erase(std::remove_if(words_.begin(), words_.end(),
                                [&](const WordState& ws) {
                                  return std::any_of(ws.symbols.begin(), ws.symbols.end(),
                                                     [&](int32_t s) { return !kept[s]; });
                                }),
                 words_.end());
    std::vector<std::string> out;
    for (int32_t s : alphabet) out.push_back(names_[s]);
    count_pairs();
    return out;
  }

  // Merges the most frequent pair (count desc, then key asc); returns its symbol's name when it is new,
  // "" when it already existed, nullopt when no pair reaches min_count.
  std::optional<std::string> merge_best(int64_t min_count) {
    while (!heap_.empty()) {
      const auto [count, key] = heap_.top();
      heap_.pop();
      auto pc = pair_count_.find(key);
      if (pc == pair_count_.end() || pc->second != count) continue;  // stale entry
      if (count < min_count) return std::nullopt;
      const int32_t a = key_first(key), b = key_second(key);
      const std::string merged = names_[a] + names_[b].substr(2);  // b always starts with "##"
      const bool is_new = ids_.find(merged) == ids_.end();
      merge(key, a, b, symbol(merged));
      return is_new ? merged : std::string();
    }
    return std::nullopt;
  }

 private:
  using Entry = std::pair<int64_t, uint64_t>;
  struct Worse {
    bool operator()(const Entry& x, const Entry& y) const {
      return x.first != y.first ? x.first < y.first : x.second > y.second;
    }
  };

  int32_t symbol(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    names_.push_back(name);
    return ids_[name] = static_cast<int32_t>(names_.size() - 1);
  }

  void count_pairs() {
    for (std::size_t w = 0; w < words_.size(); ++w) {
      const auto& s = words_[w].symbols;
      for (std::size_t i = 0; i + 1 < s.size(); ++i) {
        const uint64_t k = pair_key(s[i], s[i + 1]);
        pair_count_[k] += words_[w].count;
        auto& ws = pair_words_[k];
        if (ws.empty() || ws.back() != static_cast<int32_t>(w)) ws.push_back(static_cast<int32_t>(w));
      }
    }
    for (const auto& [k, c] : pair_count_) heap_.emplace(c, k);
    seen_.assign(words_.size(), 0);
  }

  // Replaces pair (a, b) by m in every word that has it, updating the counts of the pairs around it.
  void merge(uint64_t key, int32_t a, int32_t b, int32_t m) {
    ++stamp_;
    std::map<uint64_t, int64_t> delta;  // ordered: heap pushes happen in a fixed order
    const std::vector<int32_t> affected = std::move(pair_words_[key]);
    pair_words_.erase(key);
    for (int32_t w : affected) {
      if (seen_[w] == stamp_) continue;
      seen_[w] = stamp_;
      auto& ws = words_[w];
      auto& s = ws.symbols;
      // Remove the word's pairs, merge left to right, add its pairs back.
      for (std::size_t i = 0; i + 1 < s.size(); ++i) delta[pair_key(s[i], s[i + 1])] -= ws.count;
      std::vector<int32_t> out;
      out.reserve(s.size());
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          out.push_back(m);
          ++i;
        } else {
          out.push_back(s[i]);
        }
      }
      s.swap(out);
      for (std::size_t i = 0; i + 1 < s.size(); ++i) {
        const uint64_t k = pair_key(s[i], s[i + 1]);
        delta[k] += ws.count;
        if (s[i] == m || s[i + 1] == m) {
          auto& pw = pair_words_[k];
          if (pw.empty() || pw.back() != w) pw.push_back(w);
        }
      }
    }
    for (const auto& [k, d] : delta) {
      if (d == 0) continue;
      int64_t& c = pair_count_[k];
      c += d;
      if (c <= 0) {
        pair_count_.erase(k);
      } else {
        heap_.emplace(c, k);
      }
    }
  }

  std::vector<std::string> names_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<int64_t> char_freq_;
  std::vector<WordState> words_;
  std::unordered_map<uint64_t, int64_t> pair_count_;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words_;
  std::priority_queue<Entry, std::vector<Entry>, Worse> heap_;
  std::vector<uint32_t> seen_;
  uint32_t stamp_ = 0;
};

}  // namespace

VocabTrainer::VocabTrainer(VocabTrainerOptions opts) : opts_(opts) {
  if (opts_.vocab_size < static_cast<int64_t>(Vocab::special_tokens().size()) + 1)
    throw std::invalid_argument("vocab size must exceed the number of special tokens");
}

void VocabTrainer::add_text(const std::string& text) {
  for (const auto& w : basic_tokenize(text, opts_.lower_case)) ++counts_[w];
}

void VocabTrainer::add_word(const std::string& word, int64_t count) { counts_[word] += count; }

Vocab VocabTrainer::train() const {
  const auto& specials = Vocab::special_tokens();
  const std::size_t budget = static_cast<std::size_t>(opts_.vocab_size);
  // Deterministic order: unordered_map iteration order is not.
  std::vector<std::pair<std::string, int64_t>> words(counts_.begin(), counts_.end());
  std::sort(words.begin(), words.end());

  PairMerger merger(words);
  std::vector<std::string> vocab(specials.begin(), specials.end());
  for (auto& c : merger.keep_alphabet(budget - specials.size())) vocab.push_back(std::move(c));
  while (vocab.size() < budget) {
    const std::optional<std::string> merged = merger.merge_best(opts_.min_pair_count);
    if (!merged) break;
    if (!merged->empty()) vocab.push_back(*merged);
  }
  return Vocab(std::move(vocab));
}

}  // namespace bs
