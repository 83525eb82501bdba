// Learns a WordPiece vocab.txt from a corpus that has none: BPE-style merges over word counts, where a
// piece that does not start a word carries BERT's "##" prefix. The result is applied with greedy
// longest-match-first WordPiece (Tokenizer.h), as BERT's vocabularies are.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "dataset/Tokenizer.h"

namespace bs {

struct VocabTrainerOptions {
  int64_t vocab_size = 8192;   // including the 5 special tokens
  int64_t min_pair_count = 2;  // stop merging when no pair occurs this often
  bool lower_case = true;
};

class VocabTrainer {
 public:
  explicit VocabTrainer(VocabTrainerOptions opts = {});
  // Counts the basic tokens of a text (call once per sentence or document).
  void add_text(const std::string& text);
  void add_word(const std::string& word, int64_t count = 1);
  // [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4, then single characters (as "c" and "##c"), then merges.
  Vocab train() const;
  int64_t distinct_words() const { return static_cast<int64_t>(counts_.size()); }

 private:
  VocabTrainerOptions opts_;
  std::unordered_map<std::string, int64_t> counts_;
};

}  // namespace bs
