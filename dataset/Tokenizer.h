// BERT-compatible tokenization: a vocab.txt, the basic tokenizer (clean, lower-case, strip accents, split
// punctuation and CJK characters) and greedy longest-match-first WordPiece over the vocab.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace bs {

// Token <-> id as in BERT's vocab.txt (one token per line, id = line number). Special ids are looked up
// by name, so a real BERT vocab ([PAD]=0, [UNK]=100, ...) and our own ([PAD]=0 .. [MASK]=4) both work.
class Vocab {
 public:
  Vocab() = default;
  explicit Vocab(std::vector<std::string> tokens);
  static Vocab load(const std::string& path);  // DataError naming the file when unreadable or lacking specials
  void save(const std::string& path) const;    // written to path.tmp, then renamed

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  bool contains(const std::string& token) const { return ids_.count(token) > 0; }
  int32_t id(const std::string& token) const;  // unk_id() when absent
  const std::string& token(int32_t id) const { return tokens_.at(id); }
  const std::vector<std::string>& tokens() const { return tokens_; }

  int32_t pad_id() const { return pad_; }
  int32_t unk_id() const { return unk_; }
  int32_t cls_id() const { return cls_; }
  int32_t sep_id() const { return sep_; }
  int32_t mask_id() const { return mask_; }
  // Ids a masked token may be replaced by (the "10% random word"): every token not of the form [XXX].
  const std::vector<int32_t>& ordinary_ids() const { return ordinary_; }

  static const std::vector<std::string>& special_tokens();  // [PAD] [UNK] [CLS] [SEP] [MASK]

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<int32_t> ordinary_;
  int32_t pad_ = -1, unk_ = -1, cls_ = -1, sep_ = -1, mask_ = -1;
};

// The code points of a UTF-8 string, each as its own UTF-8 string (invalid bytes become U+FFFD).
std::vector<std::string> utf8_chars(const std::string& s);

// BERT's BasicTokenizer: text -> words and punctuation marks (UTF-8 in, UTF-8 out).
std::vector<std::string> basic_tokenize(const std::string& text, bool lower_case = true);

// Greedy longest-match-first WordPiece of one basic token; a word longer than `max_chars` code points, or
// one that cannot be covered by vocab pieces, becomes [UNK].
std::vector<std::string> wordpiece_tokenize(const std::string& word, const Vocab& vocab, int max_chars = 100);

// Basic + WordPiece tokenization with a per-word cache (corpora repeat words a lot).
class Tokenizer {
 public:
  explicit Tokenizer(Vocab vocab, bool lower_case = true);
  std::vector<std::string> tokenize(const std::string& text);
  std::vector<int32_t> encode(const std::string& text);
  const Vocab& vocab() const { return vocab_; }

 private:
  const std::vector<int32_t>& encode_word(const std::string& word);
  Vocab vocab_;
  bool lower_case_;
  std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace bs
