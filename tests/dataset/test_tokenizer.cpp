// BERT tokenization on hand-checked cases with a small hand-written vocab.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "dataset/ShardIO.h"
#include "dataset/Tokenizer.h"

namespace {
using bs::Vocab;
using Strs = std::vector<std::string>;

// BERT's own tokenization test vocab, plus the specials our loader requires.
Vocab small_vocab() {
  return Vocab({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "want", "##want", "##ed", "wa", "un",    "runn", "##ing",
                ",",     "!",     "hello", "##aff", "##able", "a",    "##a",    "##b",  "c",  "naive", "cafe"});
}

TEST(BasicTokenizer, SplitsPunctuationAndLowerCases) {
  EXPECT_EQ(bs::basic_tokenize(" \tHeLLo!how  \n Are yoU?  "), (Strs{"hello", "!", "how", "are", "you", "?"}));
  EXPECT_EQ(bs::basic_tokenize("don't re-enter 3.14$"),
            (Strs{"don", "'", "t", "re", "-", "enter", "3", ".", "14", "$"}));
  EXPECT_EQ(bs::basic_tokenize("\"Quoted\" (words)"), (Strs{"\"", "quoted", "\"", "(", "words", ")"}));
}

TEST(BasicTokenizer, StripsAccentsOfLatin1AndLatinExtendedA) {
  // NFD base letters: é->e, Å->a, ï->i, Ł has no decomposition (stays ł), ź->z, ß and Æ have none either.
  EXPECT_EQ(bs::basic_tokenize("H\u00e9llo \u00c5ngstr\u00f6m na\u00efve \u0141\u00f3d\u017a Stra\u00dfe \u00c6sir"),
            (Strs{"hello", "angstrom", "naive", "\u0142odz", "stra\u00dfe", "\u00e6sir"}));
  EXPECT_EQ(bs::basic_tokenize("\u010c\u0159\u0115\u0161\u0171 \u0130stanbul \u0178"),
            (Strs{"cresu", "istanbul", "y"}));
  // An already decomposed accent (e + combining acute) is dropped too.
  EXPECT_EQ(bs::basic_tokenize("cafe\u0301"), (Strs{"cafe"}));
  // Without lower-casing, accents stay (as in BERT's cased models).
  EXPECT_EQ(bs::basic_tokenize("H\u00e9llo", false), (Strs{"H\u00e9llo"}));
}

TEST(BasicTokenizer, CleansWhitespaceAndControlCharacters) {
  // Tab and no-break space separate; zero-width space (Cf), \x01 (Cc) and invalid UTF-8 are dropped.
  EXPECT_EQ(bs::basic_tokenize("a\tb\u00a0c\u200bd\x01"
                               "e\xff"
                               "f"),
            (Strs{"a", "b", "cdef"}));
  EXPECT_TRUE(bs::basic_tokenize(" \n\t ").empty());
}

TEST(BasicTokenizer, SplitsChineseCharacters) {
  EXPECT_EQ(bs::basic_tokenize("ah\u535a\u63a8zz"), (Strs{"ah", "\u535a", "\u63a8", "zz"}));
}

TEST(WordPiece, GreedyLongestMatchFirstWithContinuationPieces) {
  const Vocab v = small_vocab();
  EXPECT_EQ(bs::wordpiece_tokenize("unwanted", v), (Strs{"un", "##want", "##ed"}));
  EXPECT_EQ(bs::wordpiece_tokenize("running", v), (Strs{"runn", "##ing"}));
  EXPECT_EQ(bs::wordpiece_tokenize("unaffable", v), (Strs{"un", "##aff", "##able"}));
  EXPECT_EQ(bs::wordpiece_tokenize("wanted", v), (Strs{"want", "##ed"}));  // "want" beats "wa"
  EXPECT_EQ(bs::wordpiece_tokenize("aab", v), (Strs{"a", "##a", "##b"}));
  // One uncoverable piece makes the whole word [UNK].
  EXPECT_EQ(bs::wordpiece_tokenize("unwantedx", v), (Strs{"[UNK]"}));
  EXPECT_EQ(bs::wordpiece_tokenize("xyz", v), (Strs{"[UNK]"}));
  EXPECT_TRUE(bs::wordpiece_tokenize("", v).empty());
}

TEST(WordPiece, WordsLongerThan100CharactersAreUnknown) {
  const Vocab v = small_vocab();
  EXPECT_EQ(bs::wordpiece_tokenize(std::string(100, 'a'), v).size(), 100u);
  EXPECT_EQ(bs::wordpiece_tokenize(std::string(101, 'a'), v), (Strs{"[UNK]"}));
}

TEST(Tokenizer, FullTokenizationAsInBert) {
  bs::Tokenizer tok(small_vocab());
  // BERT's test: u"UNwant\u00E9d,running" -> un ##want ##ed , runn ##ing
  EXPECT_EQ(tok.tokenize("UNwant\u00e9d,running"), (Strs{"un", "##want", "##ed", ",", "runn", "##ing"}));
  EXPECT_EQ(tok.tokenize("Na\u00efve caf\u00e9!"), (Strs{"naive", "cafe", "!"}));
  const auto ids = tok.encode("UNwant\u00e9d, zebra!");
  EXPECT_EQ(ids, (std::vector<int32_t>{9, 6, 7, 12, 1, 13}));
  // The cache must not change results on repeated words.
  EXPECT_EQ(tok.encode("running running"), (std::vector<int32_t>{10, 11, 10, 11}));
}

TEST(Vocab, SpecialIdsComeFromTheVocabNotFixedNumbers) {
  // Real BERT vocabs have [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103.
  std::vector<std::string> tokens = {"[PAD]"};
  for (int i = 1; i < 100; ++i) tokens.push_back("[unused" + std::to_string(i) + "]");
  for (const char* t : {"[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world"}) tokens.push_back(t);
  const Vocab v(tokens);
  EXPECT_EQ(v.pad_id(), 0);
  EXPECT_EQ(v.unk_id(), 100);
  EXPECT_EQ(v.cls_id(), 101);
  EXPECT_EQ(v.sep_id(), 102);
  EXPECT_EQ(v.mask_id(), 103);
  EXPECT_EQ(v.id("nothere"), 100);
  EXPECT_EQ(v.ordinary_ids(), (std::vector<int32_t>{104, 105}));  // [unusedN] and specials are never random words
  bs::Tokenizer tok(v);
  EXPECT_EQ(tok.encode("Hello, world"), (std::vector<int32_t>{104, 100, 105}));
}

TEST(Vocab, LoadsAndSavesVocabTxt) {
  const std::string dir = bs::test::make_temp_dir("vocab");
  const std::string path = dir + "/vocab.txt";
  small_vocab().save(path);
  const Vocab v = Vocab::load(path);
  EXPECT_EQ(v.tokens(), small_vocab().tokens());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::filesystem::remove_all(dir);
}

TEST(Vocab, UnreadableOrIncompleteVocabIsADataErrorNamingTheFile) {
  const std::string dir = bs::test::make_temp_dir("vocab");
  try {
    Vocab::load(dir + "/missing.txt");
    FAIL() << "no error for a missing vocab";
  } catch (const bs::DataError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/missing.txt"), std::string::npos) << e.what();
  }
  {
    std::ofstream out(dir + "/nomask.txt");
    out << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n";
  }
  try {
    Vocab::load(dir + "/nomask.txt");
    FAIL() << "no error for a vocab without [MASK]";
  } catch (const bs::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("nomask.txt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[MASK]"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(Utf8, SplitsIntoCodePoints) {
  EXPECT_EQ(bs::utf8_chars("a\u00e9\u535b"), (Strs{"a", "\u00e9", "\u535b"}));
  EXPECT_EQ(bs::utf8_chars("x\xffy").size(), 3u);
}

}  // namespace
