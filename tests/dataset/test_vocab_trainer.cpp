// WordPiece vocab training: hand-checked merges, determinism, and coverage on real Brown text.
#include <gtest/gtest.h>

#include <set>

#include "dataset/Corpus.h"
#include "dataset/VocabTrainer.h"

namespace {
using Strs = std::vector<std::string>;

TEST(VocabTrainer, MergesTheMostFrequentPairFirst) {
  // Characters: a ##b c ##d (4) after the 5 specials; "ab" occurs 10 times, "cd" 3 times.
  bs::VocabTrainerOptions o;
  o.vocab_size = 10;
  bs::VocabTrainer t(o);
  t.add_word("ab", 10);
  t.add_word("cd", 3);
  EXPECT_EQ(t.train().tokens(), (Strs{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##b", "c", "##d", "ab"}));
  o.vocab_size = 11;
  bs::VocabTrainer t2(o);
  t2.add_word("ab", 10);
  t2.add_word("cd", 3);
  EXPECT_EQ(t2.train().tokens().back(), "cd");
}

TEST(VocabTrainer, ContinuationMergesKeepOneHashPrefix) {
  // "xyz" x 5: pairs (x,##y) and (##y,##z) tie at 5; then the word becomes one token.
  bs::VocabTrainerOptions o;
  o.vocab_size = 100;
  bs::VocabTrainer t(o);
  t.add_word("xyz", 5);
  t.add_word("yz", 4);  // (y,##z) 4, (##y,##z) 5
  const auto v = t.train();
  EXPECT_TRUE(v.contains("xyz"));
  EXPECT_TRUE(v.contains("yz"));
  for (const auto& tok : v.tokens()) EXPECT_EQ(tok.find("####"), std::string::npos) << tok;
  bs::Tokenizer tok(v);
  EXPECT_EQ(tok.tokenize("xyz yz xy xz"), (Strs{"xyz", "yz", "xy", "x", "##z"}));
}

TEST(VocabTrainer, StopsAtTheRequestedSizeAndIsDeterministic) {
  bs::VocabTrainerOptions o;
  o.vocab_size = 60;
  auto train = [&] {
    bs::VocabTrainer t(o);
    t.add_text("The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs!");
    t.add_text("Foxes and dogs: quick, lazy, brown. THE END.");
    return t.train();
  };
  const auto a = train(), b = train();
  EXPECT_EQ(a.tokens(), b.tokens());
  EXPECT_LE(a.size(), 60);
  EXPECT_EQ(a.token(0), "[PAD]");
  EXPECT_EQ(a.token(4), "[MASK]");
  EXPECT_TRUE(a.contains("the"));  // 5 occurrences: merged into one piece
  std::set<std::string> unique(a.tokens().begin(), a.tokens().end());
  EXPECT_EQ(unique.size(), a.tokens().size());
}

TEST(VocabTrainer, CoversBrownTextWithoutUnknownsAndFewPiecesPerWord) {
  auto docs = bs::read_brown_corpus(bs::brown_corpus_dir(), 20);
  ASSERT_EQ(docs.size(), 20u);
  bs::VocabTrainerOptions o;
  o.vocab_size = 2000;
  bs::VocabTrainer t(o);
  for (std::size_t i = 0; i < 18; ++i)
    for (const auto& s : docs[i].sentences) t.add_text(s);
  const auto v = t.train();
  EXPECT_EQ(v.size(), 2000);
  bs::Tokenizer tok(v);
  int64_t words = 0, pieces = 0, unk = 0;
  for (std::size_t i = 0; i < 18; ++i)
    for (const auto& s : docs[i].sentences) {
      words += static_cast<int64_t>(bs::basic_tokenize(s).size());
      for (int32_t id : tok.encode(s)) {
        ++pieces;
        unk += id == v.unk_id();
      }
    }
  EXPECT_EQ(unk, 0);
  EXPECT_LT(static_cast<double>(pieces) / words, 1.6);  // frequent words are whole pieces (characters: ~4.5)
  EXPECT_GT(static_cast<double>(pieces) / words, 1.0);  // rare ones are split
  // Held-out text (documents 19, 20) still tokenizes with few unknowns (only unseen characters can be).
  int64_t held = 0, held_unk = 0;
  for (std::size_t i = 18; i < 20; ++i)
    for (const auto& s : docs[i].sentences)
      for (int32_t id : tok.encode(s)) {
        ++held;
        held_unk += id == v.unk_id();
      }
  EXPECT_LT(static_cast<double>(held_unk) / held, 0.01);
}

}  // namespace
