#include "trainer/VocabTrainer.h"

#include <algorithm>
#include <map>
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

  // Symbols: single characters first ("c" starting a word, "##c" inside one).
  std::vector<std::string> names;
  std::unordered_map<std::string, int32_t> ids;
  auto symbol = [&](const std::string& name) {
    auto it = ids.find(name);
    if (it != ids.end()) return it->second;
    names.push_back(name);
    return ids[name] = static_cast<int32_t>(names.size() - 1);
  };
  std::vector<WordState> state;
  std::vector<int64_t> char_freq;
  for (const auto& [w, c] : words) {
    auto chars = utf8_chars(w);
    if (chars.empty() || chars.size() > 100) continue;  // such words become [UNK] anyway
    WordState ws;
    ws.count = c;
    for (std::size_t i = 0; i < chars.size(); ++i) {
      int32_t s = symbol(i == 0 ? chars[i] : "##" + chars[i]);
      if (static_cast<std::size_t>(s) >= char_freq.size()) char_freq.resize(s + 1, 0);
      char_freq[s] += c;
      ws.symbols.push_back(s);
    }
    state.push_back(std::move(ws));
  }

  // Alphabet: most frequent characters first, cut to the budget; words with dropped characters do not merge.
  std::vector<int32_t> alphabet(names.size());
  for (std::size_t i = 0; i < alphabet.size(); ++i) alphabet[i] = static_cast<int32_t>(i);
  std::stable_sort(alphabet.begin(), alphabet.end(), [&](int32_t a, int32_t b) { return char_freq[a] > char_freq[b]; });
  const std::size_t room = budget - specials.size();
  std::vector<char> kept(names.size(), 1);
  if (alphabet.size() > room) {
    for (std::size_t i = room; i < alphabet.size(); ++i) kept[alphabet[i]] = 0;
    alphabet.resize(room);
  }
  std::vector<std::string> vocab(specials.begin(), specials.end());
  for (int32_t s : alphabet) vocab.push_back(names[s]);
  state.erase(std::remove_if(state.begin(), state.end(),
                             [&](const WordState& ws) {
                               return std::any_of(ws.symbols.begin(), ws.symbols.end(),
                                                  [&](int32_t s) { return !kept[s]; });
                             }),
              state.end());

  // Pair counts, the words each pair occurs in, and a lazy max-heap (count desc, then key asc for ties).
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words;
  using Entry = std::pair<int64_t, uint64_t>;
  auto worse = [](const Entry& x, const Entry& y) { return x.first != y.first ? x.first < y.first : x.second > y.second; };
  std::priority_queue<Entry, std::vector<Entry>, decltype(worse)> heap(worse);
  for (std::size_t w = 0; w < state.size(); ++w) {
    const auto& s = state[w].symbols;
    for (std::size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t k = pair_key(s[i], s[i + 1]);
      pair_count[k] += state[w].count;
      auto& ws = pair_words[k];
      if (ws.empty() || ws.back() != static_cast<int32_t>(w)) ws.push_back(static_cast<int32_t>(w));
    }
  }
  for (const auto& [k, c] : pair_count) heap.emplace(c, k);

  std::vector<uint32_t> seen(state.size(), 0);
  uint32_t stamp = 0;
  std::map<uint64_t, int64_t> delta;  // ordered: heap pushes happen in a fixed order
  while (vocab.size() < budget && !heap.empty()) {
    const auto [count, key] = heap.top();
    heap.pop();
    auto pc = pair_count.find(key);
    if (pc == pair_count.end() || pc->second != count) continue;  // stale entry
    if (count < opts_.min_pair_count) break;
    const int32_t a = key_first(key), b = key_second(key);
    const std::string merged = names[a] + names[b].substr(2);  // b always starts with "##"
    const bool is_new = ids.find(merged) == ids.end();
    const int32_t m = symbol(merged);
    if (is_new) vocab.push_back(merged);

    ++stamp;
    delta.clear();
    const std::vector<int32_t> affected = std::move(pair_words[key]);
    pair_words.erase(key);
    for (int32_t w : affected) {
      if (seen[w] == stamp) continue;
      seen[w] = stamp;
      auto& ws = state[w];
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
          auto& pw = pair_words[k];
          if (pw.empty() || pw.back() != w) pw.push_back(w);
        }
      }
    }
    for (const auto& [k, d] : delta) {
      if (d == 0) continue;
      int64_t& c = pair_count[k];
      c += d;
      if (c <= 0) {
        pair_count.erase(k);
      } else {
        heap.emplace(c, k);
      }
    }
  }
  return Vocab(std::move(vocab));
}

}  // namespace bs
