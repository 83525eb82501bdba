// MLPerf-layout HDF5 shards: round trips, other integer dtypes, and clear errors for bad files.
#include <gtest/gtest.h>

#include <H5Cpp.h>

#include <filesystem>
#include <functional>
#include <tuple>
#include <fstream>
#include <map>

#include "TestUtil.h"
#include "dataset/ShardIO.h"

namespace {
namespace fs = std::filesystem;

// A shard with `n` samples of random lengths, ids below `vocab`.
bs::ShardData random_shard(int64_t n, int64_t s, int64_t p, int64_t vocab, uint64_t seed) {
  torch::manual_seed(seed);
  bs::ShardData d;
  d.lengths = torch::randint(5, s + 1, {n}, torch::kInt32);
  auto cols = torch::arange(s, torch::kInt32).unsqueeze(0);
  d.input_mask = cols.lt(d.lengths.unsqueeze(1)).to(torch::kInt32);
  d.input_ids = torch::randint(5, vocab, {n, s}, torch::kInt32) * d.input_mask;
  d.segment_ids = cols.ge(d.lengths.unsqueeze(1) / 2).to(torch::kInt32) * d.input_mask;
  // BERT's structure (check_shard_structure): k masked tokens first, at increasing positions after [CLS]
  // inside the real tokens (lengths >= 5), zeros after them.
  auto k = torch::minimum(torch::randint(1, p + 1, {n}, torch::kInt32), d.lengths - 1).unsqueeze(1);
  auto slots = torch::arange(p, torch::kInt32).unsqueeze(0);
  auto used = slots.lt(k).to(torch::kInt32);
  d.masked_lm_positions = (slots + 1) * used;
  d.masked_lm_ids = torch::randint(5, vocab, {n, p}, torch::kInt32) * used;
  d.next_sentence_labels = torch::randint(0, 2, {n}, torch::kInt32);
  return d;
}

void expect_equal(const bs::ShardData& a, const bs::ShardData& b) {
  EXPECT_TRUE(torch::equal(a.input_ids, b.input_ids));
  EXPECT_TRUE(torch::equal(a.input_mask, b.input_mask));
  EXPECT_TRUE(torch::equal(a.segment_ids, b.segment_ids));
  EXPECT_TRUE(torch::equal(a.masked_lm_positions, b.masked_lm_positions));
  EXPECT_TRUE(torch::equal(a.masked_lm_ids, b.masked_lm_ids));
  EXPECT_TRUE(torch::equal(a.next_sentence_labels, b.next_sentence_labels));
  EXPECT_TRUE(torch::equal(a.lengths, b.lengths));
}

// Writes datasets with the HDF5 C++ API directly: other dtypes, missing datasets, wrong ranks.
void write_raw(const std::string& path, const std::map<std::string, torch::Tensor>& sets, const H5::PredType& type) {
  H5::H5File f(path, H5F_ACC_TRUNC);
  for (const auto& [name, t] : sets) {
    auto c = t.to(torch::kInt64).contiguous();
    std::vector<hsize_t> dims(c.sizes().begin(), c.sizes().end());
    H5::DataSpace space(static_cast<int>(dims.size()), dims.data());
    f.createDataSet(name, type, space).write(c.data_ptr<int64_t>(), H5::PredType::NATIVE_INT64);
  }
}

std::map<std::string, torch::Tensor> as_map(const bs::ShardData& d) {
  return {{"input_ids", d.input_ids},         {"input_mask", d.input_mask},
          {"segment_ids", d.segment_ids},     {"masked_lm_positions", d.masked_lm_positions},
          {"masked_lm_ids", d.masked_lm_ids}, {"next_sentence_labels", d.next_sentence_labels}};
}

template <class F>
std::string data_error(F&& f) {
  try {
    f();
  } catch (const bs::DataError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no DataError";
  return "";
}

class ShardIO : public ::testing::Test {
 protected:
  void SetUp() override { dir = bs::test::make_temp_dir("shardio"); }
  void TearDown() override { fs::remove_all(dir); }
  std::string dir;
};

TEST_F(ShardIO, WriteThenReadGivesTheSameData) {
  const auto d = random_shard(300, 64, 10, 1000, 1);
  write_shard(dir + "/a.hdf5", d);
  EXPECT_FALSE(fs::exists(dir + "/a.hdf5.tmp"));
  const auto r = bs::read_shard(dir + "/a.hdf5");
  EXPECT_EQ(r.size(), 300);
  EXPECT_EQ(r.seq_len(), 64);
  EXPECT_EQ(r.max_predictions(), 10);
  EXPECT_EQ(r.input_ids.scalar_type(), torch::kInt32);
  expect_equal(d, r);
}

TEST_F(ShardIO, ReadsOtherIntegerTypesAndColumnLabels) {
  // Real MLPerf shards store int64 (and some tools write next_sentence_labels as [N,1]).
  const auto d = random_shard(20, 32, 5, 30000, 2);
  auto sets = as_map(d);
  sets["next_sentence_labels"] = d.next_sentence_labels.unsqueeze(1);
  write_raw(dir + "/i64.hdf5", sets, H5::PredType::STD_I64LE);
  expect_equal(d, bs::read_shard(dir + "/i64.hdf5"));
  write_raw(dir + "/u16.hdf5", as_map(d), H5::PredType::STD_U16LE);
  expect_equal(d, bs::read_shard(dir + "/u16.hdf5"));
}

TEST_F(ShardIO, MissingDatasetNamesFileAndLayout) {
  auto sets = as_map(random_shard(4, 16, 3, 100, 3));
  sets.erase("masked_lm_ids");
  write_raw(dir + "/X.hdf5", sets, H5::PredType::STD_I32LE);
  const auto msg = data_error([&] { bs::read_shard(dir + "/X.hdf5"); });
  EXPECT_NE(msg.find(dir + "/X.hdf5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("masked_lm_ids"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not an MLPerf BERT shard"), std::string::npos) << msg;
}

TEST_F(ShardIO, WrongRankOrRowCountIsRejected) {
  const auto d = random_shard(4, 16, 3, 100, 4);
  auto sets = as_map(d);
  sets["input_ids"] = d.input_ids.flatten();
  write_raw(dir + "/rank.hdf5", sets, H5::PredType::STD_I32LE);
  auto msg = data_error([&] { bs::read_shard(dir + "/rank.hdf5"); });
  EXPECT_NE(msg.find("input_ids"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank.hdf5"), std::string::npos) << msg;
  sets = as_map(d);
  sets["segment_ids"] = d.segment_ids.slice(0, 0, 3);
  write_raw(dir + "/rows.hdf5", sets, H5::PredType::STD_I32LE);
  msg = data_error([&] { bs::read_shard(dir + "/rows.hdf5"); });
  EXPECT_NE(msg.find("segment_ids"), std::string::npos) << msg;
}

TEST_F(ShardIO, TruncatedOrNonHdf5FilesAreDataErrors) {
  write_shard(dir + "/full.hdf5", random_shard(500, 128, 20, 5000, 5));
  fs::copy_file(dir + "/full.hdf5", dir + "/cut.hdf5");
  fs::resize_file(dir + "/cut.hdf5", fs::file_size(dir + "/full.hdf5") / 2);
  auto msg = data_error([&] { bs::read_shard(dir + "/cut.hdf5"); });
  EXPECT_NE(msg.find(dir + "/cut.hdf5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;

  std::ofstream(dir + "/text.hdf5") << "input_ids,input_mask\n1,2\n";
  msg = data_error([&] { bs::read_shard(dir + "/text.hdf5"); });
  EXPECT_NE(msg.find("text.hdf5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not an HDF5 file"), std::string::npos) << msg;

  msg = data_error([&] { bs::read_shard(dir + "/nothere.hdf5"); });
  EXPECT_NE(msg.find("nothere.hdf5"), std::string::npos) << msg;
}

TEST_F(ShardIO, ConcatAddsSamplesAndChecksShapes) {
  const auto a = random_shard(7, 32, 5, 100, 6), b = random_shard(5, 32, 5, 100, 7);
  const auto c = bs::concat_shards({a, b});
  EXPECT_EQ(c.size(), 12);
  EXPECT_TRUE(torch::equal(c.input_ids.slice(0, 7, 12), b.input_ids));
  EXPECT_TRUE(torch::equal(c.lengths.slice(0, 0, 7), a.lengths));
  EXPECT_THROW(bs::concat_shards({a, random_shard(3, 64, 5, 100, 8)}), bs::DataError);
}

TEST_F(ShardIO, LengthHistogramBinsByUpperBound) {
  bs::ShardData d = random_shard(6, 128, 2, 100, 9);
  d.lengths = torch::tensor({1, 32, 33, 64, 128, 100}, torch::kInt32);
  EXPECT_EQ(bs::length_histogram(d, 32), (std::vector<int64_t>{2, 2, 0, 2}));
  EXPECT_EQ(bs::length_histogram(d, 128), (std::vector<int64_t>{6}));
}

class LoadDataset : public ShardIO {
 protected:
  void SetUp() override {
    ShardIO::SetUp();
    write_shard(dir + "/train_00000.hdf5", random_shard(30, 64, 8, 500, 10));
    write_shard(dir + "/train_00001.hdf5", random_shard(20, 64, 8, 500, 11));
    write_shard(dir + "/eval.hdf5", random_shard(10, 64, 8, 500, 12));
    std::ofstream v(dir + "/vocab.txt");
    v << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";  // BERT's special tokens, which load_dataset requires
    for (int i = 5; i < 500; ++i) v << "t" << i << "\n";
    cfg.dir = dir;
    cfg.seq_len = 64;
  }
  bs::DataConfig cfg;
};

TEST_F(LoadDataset, TrainShardsAreEveryHdf5ButTheEvalFile) {
  const auto ds = bs::load_dataset(cfg);
  EXPECT_EQ(ds.train_files.size(), 2u);
  EXPECT_EQ(ds.train.size(), 50);
  EXPECT_EQ(ds.eval.size(), 10);
  EXPECT_EQ(ds.vocab_size, 500);
  // A custom eval file name: eval.hdf5 (not named like the training shards) is then not read, but named in
  // a warning; so is any other stray *.hdf5 beside the shards.
  fs::rename(dir + "/eval.hdf5", dir + "/heldout.hdf5");
  write_shard(dir + "/eval.hdf5", random_shard(4, 64, 8, 500, 13));
  write_shard(dir + "/train_00001.copy.hdf5", random_shard(4, 64, 8, 500, 14));
  cfg.eval_file = dir + "/heldout.hdf5";
  testing::internal::CaptureStderr();
  const auto ds2 = bs::load_dataset(cfg);
  const std::string warning = testing::internal::GetCapturedStderr();
  EXPECT_EQ(ds2.train.size(), 50);
  EXPECT_EQ(ds2.train_files.size(), 2u);
  EXPECT_EQ(ds2.eval.size(), 10);
  EXPECT_NE(warning.find("not reading " + dir + "/eval.hdf5, " + dir + "/train_00001.copy.hdf5"), std::string::npos)
      << warning;
  // Shards named in meta.yaml: only those are read, the rest is named in the warning.
  std::ofstream(dir + "/meta.yaml") << "# bertsweep data prepare\nshards: [train_00001.hdf5]\n";
  testing::internal::CaptureStderr();
  const auto ds3 = bs::load_dataset(cfg);
  const std::string meta_warning = testing::internal::GetCapturedStderr();
  EXPECT_EQ(ds3.train.size(), 20);
  EXPECT_NE(meta_warning.find(dir + "/train_00000.hdf5"), std::string::npos) << meta_warning;
  EXPECT_NE(meta_warning.find("not a shard listed in meta.yaml"), std::string::npos) << meta_warning;
}

// Values in range but a structure no BERT pretraining data has: each rule broken once is refused with the
// rule, the dataset and the sample named; the valid shard passes.
TEST_F(ShardIO, StructureOfBertDataIsChecked) {
  const bs::ShardData valid = random_shard(40, 32, 6, 500, 21);
  EXPECT_NO_THROW(bs::check_shard_values(valid, "x.hdf5", 500));
  auto clone = [&] {
    bs::ShardData d;
    d.input_ids = valid.input_ids.clone();
    d.input_mask = valid.input_mask.clone();
    d.segment_ids = valid.segment_ids.clone();
    d.masked_lm_positions = valid.masked_lm_positions.clone();
    d.masked_lm_ids = valid.masked_lm_ids.clone();
    d.next_sentence_labels = valid.next_sentence_labels.clone();
    return d;
  };
  const int64_t len7 = valid.input_mask[7].sum().item<int64_t>();
  const int64_t shortest = valid.input_mask.sum(1).argmin().item<int64_t>();  // has padding
  const int64_t len_short = valid.input_mask[shortest].sum().item<int64_t>();
  ASSERT_LT(len_short, 32);
  const std::vector<std::tuple<std::string, std::function<void(bs::ShardData&)>, std::string>> breaks = {
      {"all [PAD]", [](bs::ShardData& d) { d.input_ids.zero_(); }, "is never id 0"},
      {"one [PAD] among the real tokens", [](bs::ShardData& d) { d.input_ids[7][1] = 0; }, "sample 7"},
      {"hole in the mask", [](bs::ShardData& d) { d.input_mask[7][1] = 0; }, "no hole"},
      {"two real tokens", [](bs::ShardData& d) { d.input_mask[7].slice(0, 2).zero_(); }, "at least 3 real tokens"},
      {"segment 1 then 0",
       [&](bs::ShardData& d) {
         d.segment_ids[7].slice(0, 1, len7).fill_(1);
         d.segment_ids[7][len7 - 1] = 0;
       },
       "0 for sentence A, then 1"},
      {"[CLS] in segment 1", [](bs::ShardData& d) { d.segment_ids.select(1, 0).fill_(1); }, "[CLS]) is in sentence A"},
      {"masked positions all 0", [](bs::ShardData& d) { d.masked_lm_positions.zero_(); }, "after [CLS]"},
      {"masked position in the padding",
       [&](bs::ShardData& d) { d.masked_lm_positions[shortest][0] = static_cast<int>(len_short); },
       "inside the real tokens"},
      {"masked ids with a hole",
       [](bs::ShardData& d) {
         d.masked_lm_ids[7][0] = 0;
         d.masked_lm_ids[7][1] = 9;
       },
       "ids first, then 0"},
      {"unused position not 0",
       [](bs::ShardData& d) {
         d.masked_lm_ids.select(1, 5).zero_();
         d.masked_lm_positions.select(1, 5).fill_(2);
       },
       "0 for each unused prediction"},
      {"positions not increasing",
       [](bs::ShardData& d) {
         d.masked_lm_positions.select(1, 0).fill_(1);
         d.masked_lm_positions.select(1, 1).fill_(1);
         d.masked_lm_ids.select(1, 1).fill_(7);
       },
       "strictly increasing"},
      {"no masked token at all",
       [](bs::ShardData& d) {
         d.masked_lm_ids.zero_();
         d.masked_lm_positions.zero_();
       },
       "no sample has a masked token"},
  };
  for (const auto& [what, change, rule] : breaks) {
    bs::ShardData d = clone();
    change(d);
    try {
      bs::check_shard_values(d, "x.hdf5", 500);
      ADD_FAILURE() << what << ": accepted";
    } catch (const bs::DataError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(rule), std::string::npos) << what << ": " << m;
      EXPECT_NE(m.find("x.hdf5: dataset "), std::string::npos) << what << ": " << m;
    }
  }
}

TEST_F(LoadDataset, VocabSizeFallsBackToLargestIdPlusOne) {
  fs::remove(dir + "/vocab.txt");
  const auto ds = bs::load_dataset(cfg);
  const int64_t m = std::max({ds.train.input_ids.max().item<int64_t>(), ds.train.masked_lm_ids.max().item<int64_t>(),
                              ds.eval.input_ids.max().item<int64_t>(), ds.eval.masked_lm_ids.max().item<int64_t>()});
  EXPECT_EQ(ds.vocab_size, m + 1);
}

TEST_F(LoadDataset, MismatchesAreDataErrorsNamingTheProblem) {
  cfg.seq_len = 128;
  auto msg = data_error([&] { bs::load_dataset(cfg); });
  EXPECT_NE(msg.find("train_00000.hdf5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("128"), std::string::npos) << msg;
  cfg.seq_len = 64;

  std::ofstream(dir + "/vocab.txt") << "[PAD]\n[UNK]\n";
  msg = data_error([&] { bs::load_dataset(cfg); });
  EXPECT_NE(msg.find("lacks the special token(s) [CLS] [MASK] [SEP]"), std::string::npos) << msg;

  std::ofstream(dir + "/vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  msg = data_error([&] { bs::load_dataset(cfg); });
  EXPECT_NE(msg.find("train_00000.hdf5: dataset input_ids holds"), std::string::npos) << msg;
  EXPECT_NE(msg.find("5-token vocab"), std::string::npos) << msg;

  fs::remove(dir + "/eval.hdf5");
  msg = data_error([&] { bs::load_dataset(cfg); });
  EXPECT_NE(msg.find("eval.hdf5"), std::string::npos) << msg;

  cfg.dir = dir + "/nope";
  msg = data_error([&] { bs::load_dataset(cfg); });
  EXPECT_NE(msg.find(dir + "/nope"), std::string::npos) << msg;
}

}  // namespace
