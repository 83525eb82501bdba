// Pretraining instances: structure, masking rates, NSP labels, reproducibility, and held-out eval documents.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "TestUtil.h"
#include "dataset/Corpus.h"
#include "dataset/PretrainingData.h"

namespace {
namespace fs = std::filesystem;

// Synthetic corpus where every token says where it came from: token id -> (document, sentence, position).
struct TracedCorpus {
  bs::Vocab vocab;
  std::vector<bs::TokenizedDocument> docs;
  std::map<int32_t, std::array<int, 3>> origin;
};

TracedCorpus traced_corpus(int n_docs, int sentences, uint64_t seed) {
  std::vector<std::string> tokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  TracedCorpus c;
  std::mt19937_64 gen(seed);
  for (int d = 0; d < n_docs; ++d) {
    bs::TokenizedDocument doc;
    for (int s = 0; s < sentences; ++s) {
      std::vector<int32_t> sent;
      const int len = 3 + static_cast<int>(gen() % 25);
      for (int k = 0; k < len; ++k) {
        const int32_t id = static_cast<int32_t>(tokens.size());
        tokens.push_back("w" + std::to_string(id));
        c.origin[id] = {d, s, k};
        sent.push_back(id);
      }
      doc.push_back(sent);
    }
    c.docs.push_back(doc);
  }
  c.vocab = bs::Vocab(tokens);
  return c;
}

bs::ShardData make(const TracedCorpus& c, const bs::PretrainingOptions& o, uint64_t seed) {
  bs::Rng rng(seed);
  return bs::create_pretraining_instances(c.docs, c.vocab, o, rng);
}

// input_ids with the masked positions restored to their original ids.
torch::Tensor unmasked(const bs::ShardData& d) {
  auto ids = d.input_ids.clone();
  auto pos = d.masked_lm_positions.to(torch::kLong);
  auto keep = d.masked_lm_positions.ne(0);
  auto restored = torch::where(keep, d.masked_lm_ids, ids.gather(1, pos));
  ids.scatter_(1, pos, restored);
  return ids;
}

TEST(Rng, UsesTheStandardMersenneTwisterSequence) {
  // The C++ standard fixes the 10000th output of a default-seeded mt19937_64.
  bs::Rng rng(5489);
  uint64_t x = 0;
  for (int i = 0; i < 10000; ++i) x = rng.next();
  EXPECT_EQ(x, 9981545732273789042ULL);
}

TEST(Rng, BoundedDrawsAreUniformAndInRange) {
  bs::Rng rng(3);
  std::vector<int64_t> counts(6, 0);
  for (int i = 0; i < 60000; ++i) {
    const int64_t v = rng.between(2, 7);
    ASSERT_GE(v, 2);
    ASSERT_LE(v, 7);
    ++counts[v - 2];
  }
  for (int64_t c : counts) EXPECT_NEAR(c, 10000, 400);  // ~4 sigma
  double sum = 0;
  for (int i = 0; i < 100000; ++i) {
    const double u = rng.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
}

TEST(PretrainingInstances, HaveBertLayout) {
  const auto c = traced_corpus(30, 40, 1);
  bs::PretrainingOptions o;
  o.seq_len = 64;
  o.max_predictions = 10;
  o.dupe_factor = 2;
  const auto d = make(c, o, 11);
  ASSERT_GT(d.size(), 100);
  ASSERT_EQ(d.seq_len(), 64);
  ASSERT_EQ(d.max_predictions(), 10);
  const auto ids = unmasked(d);
  for (int64_t r = 0; r < d.size(); ++r) {
    const int len = d.lengths[r].item<int>();
    ASSERT_LE(len, 64);
    ASSERT_EQ(d.input_mask[r].sum().item<int>(), len);
    ASSERT_EQ(ids[r][0].item<int>(), c.vocab.cls_id());
    ASSERT_EQ(ids[r][len - 1].item<int>(), c.vocab.sep_id());
    // Exactly two [SEP]; segment 0 through the first, 1 after it, 0 in the padding.
    std::vector<int> seps;
    for (int t = 0; t < len; ++t)
      if (ids[r][t].item<int>() == c.vocab.sep_id()) seps.push_back(t);
    ASSERT_EQ(seps.size(), 2u);
    for (int t = 0; t < 64; ++t) {
      const int want = t > seps[0] && t < len ? 1 : 0;
      ASSERT_EQ(d.segment_ids[r][t].item<int>(), want) << "row " << r << " pos " << t;
      if (t >= len) {
        ASSERT_EQ(d.input_ids[r][t].item<int>(), 0);
      }
    }
    // Masked positions: sorted, distinct, never [CLS]/[SEP]/padding; count = min(max_pred, round(15% of len)).
    int n_masked = 0, last = 0;
    for (int k = 0; k < 10; ++k) {
      const int p = d.masked_lm_positions[r][k].item<int>();
      if (p == 0) continue;
      ++n_masked;
      ASSERT_GT(p, last);
      last = p;
      ASSERT_LT(p, len);
      ASSERT_NE(p, seps[0]);
      ASSERT_NE(p, seps[1]);
    }
    ASSERT_EQ(n_masked, std::min<int>(10, std::max<int>(1, static_cast<int>(std::nearbyint(len * 0.15)))));
    // NSP: label 0 means B continues A in the same document; label 1 means B is from another document.
    const auto a_tok = ids[r][1].item<int>(), b_tok = ids[r][seps[0] + 1].item<int>();
    const auto a_last = ids[r][seps[0] - 1].item<int>();
    const auto& oa = c.origin.at(a_tok);
    const auto& oa_last = c.origin.at(a_last);
    const auto& ob = c.origin.at(b_tok);
    if (d.next_sentence_labels[r].item<int>() == 0) {
      ASSERT_EQ(oa[0], ob[0]);
      ASSERT_GT(std::make_pair(ob[1], ob[2]), std::make_pair(oa_last[1], oa_last[2]));
    } else {
      ASSERT_NE(oa[0], ob[0]);
    }
  }
}

TEST(PretrainingInstances, MaskingAndNspRatesMatchBert) {
  const auto c = traced_corpus(60, 60, 2);
  bs::PretrainingOptions o;
  o.seq_len = 128;
  o.max_predictions = 40;  // not binding: the 15% rate shows
  o.dupe_factor = 3;
  const auto d = make(c, o, 5);
  const auto masked = d.masked_lm_positions.ne(0);
  const double n = masked.sum().item<double>();
  const double tokens = d.lengths.sum().item<double>();
  EXPECT_NEAR(n / tokens, 0.15, 0.01);
  const auto at = d.input_ids.gather(1, d.masked_lm_positions.to(torch::kLong));
  const double as_mask = (at.eq(c.vocab.mask_id()) & masked).sum().item<double>() / n;
  const double kept = (at.eq(d.masked_lm_ids) & masked).sum().item<double>() / n;
  EXPECT_NEAR(as_mask, 0.80, 0.015);
  EXPECT_NEAR(kept, 0.10, 0.01);
  EXPECT_NEAR(1.0 - as_mask - kept, 0.10, 0.01);
  const double random_next = d.next_sentence_labels.sum().item<double>() / d.size();
  EXPECT_NEAR(random_next, 0.5, 0.05);
}

TEST(PretrainingInstances, MaxPredictionsCapsMasks) {
  const auto c = traced_corpus(20, 40, 3);
  bs::PretrainingOptions o;
  o.seq_len = 128;
  o.max_predictions = 5;
  const auto d = make(c, o, 5);
  EXPECT_EQ(d.max_predictions(), 5);
  EXPECT_LE(d.masked_lm_positions.ne(0).sum(1).max().item<int>(), 5);
  // Long sequences (>= 34 tokens) want more than 5 masks and get exactly the cap.
  auto long_rows = d.lengths.ge(34);
  EXPECT_TRUE(d.masked_lm_positions.ne(0).sum(1).masked_select(long_rows).eq(5).all().item<bool>());
}

TEST(PretrainingInstances, SameSeedSameDataOtherSeedOther) {
  const auto c = traced_corpus(10, 30, 4);
  bs::PretrainingOptions o;
  o.seq_len = 64;
  const auto a = make(c, o, 42), b = make(c, o, 42), x = make(c, o, 43);
  EXPECT_TRUE(torch::equal(a.input_ids, b.input_ids));
  EXPECT_TRUE(torch::equal(a.masked_lm_positions, b.masked_lm_positions));
  EXPECT_TRUE(torch::equal(a.next_sentence_labels, b.next_sentence_labels));
  EXPECT_FALSE(a.input_ids.sizes() == x.input_ids.sizes() && torch::equal(a.input_ids, x.input_ids));
}

TEST(PretrainingInstances, ShortSeqProbMakesShortTargets) {
  const auto c = traced_corpus(30, 40, 5);
  bs::PretrainingOptions o;
  o.seq_len = 128;
  o.short_seq_prob = 0.0;
  const double full = make(c, o, 1).lengths.to(torch::kDouble).mean().item<double>();
  o.short_seq_prob = 1.0;
  const double shorter = make(c, o, 1).lengths.to(torch::kDouble).mean().item<double>();
  EXPECT_GT(full, 100);
  EXPECT_LT(shorter, full - 20);
}

// The prepared small Brown dataset: eval documents never reach the training shards.
TEST(PreparedBrown, EvalDocumentsNeverAppearInTrainingShards) {
  const std::string dir = bs::test::small_brown_dataset();
  bs::DataConfig cfg;
  cfg.dir = dir;
  const auto ds = bs::load_dataset(cfg);
  ASSERT_GT(ds.train.size(), 1000);
  ASSERT_GT(ds.eval.size(), 50);
  ASSERT_GT(ds.eval.lengths.sum().item<int64_t>(), 3000);  // a few thousand eval tokens at least

  // Token 8-grams of each held-out document that occur in no training document of the corpus.
  const auto docs = bs::read_brown_corpus(bs::brown_corpus_dir(), 200);
  ASSERT_EQ(docs.size(), 200u);
  bs::Tokenizer tok(bs::Vocab::load(dir + "/vocab.txt"));
  constexpr int kN = 8;
  auto grams_of = [&](const std::vector<int32_t>& ids, std::set<std::vector<int32_t>>& out) {
    for (std::size_t i = 0; i + kN <= ids.size(); ++i) out.emplace(ids.begin() + i, ids.begin() + i + kN);
  };
  std::set<std::vector<int32_t>> train_doc_grams, eval_doc_grams;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    std::vector<int32_t> ids;
    for (const auto& s : docs[i].sentences) {
      auto e = tok.encode(s);
      ids.insert(ids.end(), e.begin(), e.end());
    }
    grams_of(ids, (i + 1) % 20 == 0 ? eval_doc_grams : train_doc_grams);
  }
  std::set<std::vector<int32_t>> eval_only;
  for (const auto& g : eval_doc_grams)
    if (!train_doc_grams.count(g)) eval_only.insert(g);
  ASSERT_GT(eval_only.size(), 1000u);

  // Shard n-grams (within segments: [SEP]/[CLS] cut them) of the unmasked sequences.
  auto shard_grams = [&](const bs::ShardData& d) {
    std::set<std::vector<int32_t>> out;
    const auto ids = unmasked(d);
    const auto sep = tok.vocab().sep_id(), cls = tok.vocab().cls_id();
    for (int64_t r = 0; r < d.size(); ++r) {
      std::vector<int32_t> seg;
      const int len = d.lengths[r].item<int>();
      auto row = ids[r].contiguous();
      const int32_t* p = row.data_ptr<int32_t>();
      for (int t = 0; t < len; ++t) {
        if (p[t] == sep || p[t] == cls) {
          grams_of(seg, out);
          seg.clear();
        } else {
          seg.push_back(p[t]);
        }
      }
    }
    return out;
  };
  const auto train_grams = shard_grams(ds.train), eval_grams = shard_grams(ds.eval);
  int64_t leaked = 0, eval_hits = 0;
  for (const auto& g : train_grams) leaked += eval_only.count(g);
  for (const auto& g : eval_grams) eval_hits += eval_only.count(g);
  EXPECT_EQ(leaked, 0);
  EXPECT_GT(eval_hits, 1000);  // the check can see eval text where it is
}

TEST(PreparedBrown, MetaCountsMatchTheShards) {
  const std::string dir = bs::test::small_brown_dataset();
  bs::DataConfig cfg;
  cfg.dir = dir;
  const auto ds = bs::load_dataset(cfg);
  std::ifstream in(dir + "/meta.yaml");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("train_instances: " + std::to_string(ds.train.size()) + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("eval_instances: " + std::to_string(ds.eval.size()) + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("seed: 7\n"), std::string::npos) << text;
  EXPECT_NE(text.find("seq_len: 128\n"), std::string::npos) << text;
  EXPECT_NE(text.find("eval_documents: 10\n"), std::string::npos) << text;
  EXPECT_EQ(ds.vocab_size, 4000);
}

TEST(PrepareData, PlainTextCorpusFolder) {
  const std::string dir = bs::test::make_temp_dir("textcorpus");
  fs::create_directories(dir + "/corpus");
  {
    std::ofstream f(dir + "/corpus/a.txt");
    for (int d = 0; d < 12; ++d) {
      for (int s = 0; s < 30; ++s)
        f << "Document " << d << " has sentence number " << s << " about topic" << d * 7 + s << ".\n";
      f << "\n";
    }
  }
  bs::PrepareOptions o;
  o.corpus = dir + "/corpus";
  o.vocab_size = 200;
  o.out = dir + "/data";
  o.eval_every = 4;
  o.shard_size = 40;
  o.pretraining.seq_len = 32;
  o.pretraining.max_predictions = 5;
  o.pretraining.dupe_factor = 2;
  std::vector<std::string> log;
  const auto s = bs::prepare_pretraining_data(o, [&](const std::string& l) { log.push_back(l); });
  EXPECT_EQ(s.documents, 12);
  EXPECT_EQ(s.eval_documents, 3);
  EXPECT_FALSE(log.empty());
  bs::DataConfig cfg;
  cfg.dir = o.out;
  cfg.seq_len = 32;
  const auto ds = bs::load_dataset(cfg);
  EXPECT_EQ(ds.train.size(), s.train_instances);
  EXPECT_EQ(static_cast<int64_t>(ds.train_files.size()), (s.train_instances + 39) / 40);
  EXPECT_TRUE(fs::exists(o.out + "/meta.yaml"));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  fs::remove_all(dir);
}

// Through the CLI: the same seed gives identical shards (compared as data: HDF5 headers carry timestamps).
TEST(PrepareData, SameSeedGivesIdenticalShardsOtherSeedDoesNot) {
  const std::string dir = bs::test::make_temp_dir("seeds");
  auto prepare = [&](const std::string& name, const std::string& seed) {
    auto r = bs::test::run(bs::test::tiny_prepare_args(dir + "/" + name, seed));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(r.err.empty()) << "--quiet printed: " << r.err;
  };
  prepare("a", "1");
  prepare("b", "1");
  prepare("c", "2");
  auto shard = [&](const std::string& name, const std::string& file) {
    return bs::read_shard(dir + "/" + name + "/" + file);
  };
  for (const char* f : {"train_00000.hdf5", "eval.hdf5"}) {
    const auto a = shard("a", f), b = shard("b", f);
    EXPECT_TRUE(torch::equal(a.input_ids, b.input_ids)) << f;
    EXPECT_TRUE(torch::equal(a.segment_ids, b.segment_ids)) << f;
    EXPECT_TRUE(torch::equal(a.masked_lm_positions, b.masked_lm_positions)) << f;
    EXPECT_TRUE(torch::equal(a.masked_lm_ids, b.masked_lm_ids)) << f;
    EXPECT_TRUE(torch::equal(a.next_sentence_labels, b.next_sentence_labels)) << f;
  }
  const auto a = shard("a", "train_00000.hdf5"), c = shard("c", "train_00000.hdf5");
  EXPECT_FALSE(a.input_ids.sizes() == c.input_ids.sizes() && torch::equal(a.input_ids, c.input_ids));
  auto text = [](const std::string& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(text(dir + "/a/vocab.txt"), text(dir + "/b/vocab.txt"));
  EXPECT_EQ(text(dir + "/a/meta.yaml"), text(dir + "/b/meta.yaml"));
  fs::remove_all(dir);
}

}  // namespace
