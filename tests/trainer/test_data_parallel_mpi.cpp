// Data parallelism is exact: 2 MPI ranks x batch b train to the same parameters as 1 rank x batch 2b.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "TestUtil.h"

namespace {

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

std::string config(const std::string& dir, const std::string& sampler, const std::string& clip) {
  std::string path = dir + "/dp-" + sampler + "-" + clip + ".yaml";
  std::ofstream(path) << "extends: " << bs::test::source_dir() << "/configs/models/bert-tiny.yaml\n"
                      << "model: {dropout: 0.0}\n"
                      << "data: {dir: " << bs::test::small_brown_dataset() << ", sampler: " << sampler
                      << ", eval_samples: 64}\n"
                      << "optimizer: {name: lamb, lr: 0.002}\n"
                      << "schedule: {name: constant}\n"
                      << "batch: {global: 32, micro: 16}\n"
                      << "clip: {mode: " << clip << ", max_norm: 1.0, bucket_mb: 0.25}\n"
                      << "target: {mlm_accuracy: 0.99, max_samples: 128, eval_every_samples: 100000}\n"
                      << "threads: 1\nseed: 5\n";
  return path;
}

std::vector<std::string> event_lines(const std::string& path, const std::string& kind) {
  std::vector<std::string> out;
  std::ifstream in(path);
  const std::regex is_kind("\"event\"\\s*:\\s*\"" + kind + "\"");
  for (std::string line; std::getline(in, line);)
    if (std::regex_search(line, is_kind)) out.push_back(line);
  return out;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / (1e-3 + std::abs(double(b[i]))));
  return worst;
}

}  // namespace

TEST(DataParallel, TwoRanksEqualOneRankWithTwiceTheBatch) {
  auto dir = bs::test::make_temp_dir("dp");
  auto cfg = config(dir, "random", "none");
  // One rank: global 32 as two accumulated micro-batches of 16.
  auto one = bs::test::run({bs::test::bertsweep_bin(), "train", "--config", cfg, "--set", "distributed.backend=none",
                            "--quiet", "--dump-params", dir + "/one.bin", "--events", dir + "/one.jsonl"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_FALSE(event_lines(dir + "/one.jsonl", "throughput").empty());
  EXPECT_TRUE(event_lines(dir + "/one.jsonl", "rank_load").empty()) << "one rank has no load to compare";
  // Two ranks: global 32 = 16 per rank, averaged by the overlapped bucket allreduce.
  auto two = bs::test::run({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "OMP_NUM_THREADS=1",
                            bs::test::bertsweep_bin(), "train", "--config", cfg, "--set", "distributed.backend=mpi",
                            "--quiet", "--dump-params", dir + "/two.bin", "--events", dir + "/two.jsonl"},
                           300);
  ASSERT_EQ(two.exit_code, 0) << two.err;
  // Each throughput window has a rank_load event with one entry per rank; its per-rank tokens add up to the
  // window's padding waste, which the throughput event computes from the all-rank totals.
  const auto loads = event_lines(dir + "/two.jsonl", "rank_load");
  const auto windows = event_lines(dir + "/two.jsonl", "throughput");
  ASSERT_FALSE(loads.empty());
  ASSERT_EQ(loads.size(), windows.size());
  for (std::size_t i = 0; i < loads.size(); ++i) {
    const auto real = bs::test::json_numbers(loads[i], "real_tokens"),
               computed = bs::test::json_numbers(loads[i], "computed_tokens");
    const auto seconds = bs::test::json_numbers(loads[i], "compute_seconds");
    ASSERT_EQ(real.size(), 2u) << loads[i];
    ASSERT_EQ(computed.size(), 2u) << loads[i];
    ASSERT_EQ(seconds.size(), 2u) << loads[i];
    for (int r = 0; r < 2; ++r) {
      EXPECT_GT(real[r], 0) << loads[i];
      EXPECT_LE(real[r], computed[r]) << loads[i];
      EXPECT_GT(seconds[r], 0) << loads[i];
    }
    EXPECT_EQ(bs::test::json_number(loads[i], "step"), bs::test::json_number(windows[i], "step"));
    EXPECT_NEAR(1.0 - (real[0] + real[1]) / (computed[0] + computed[1]),
                bs::test::json_number(windows[i], "padding_waste"), 1e-9)
        << loads[i] << "\n"
        << windows[i];
  }
  auto a = read_floats(dir + "/one.bin"), b = read_floats(dir + "/two.bin");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 100000u);
  EXPECT_LT(max_rel_diff(b, a), 1e-3) << "4 LAMB steps must agree to float tolerance";
  // The check can fail: a different seed's run is far away.
  auto other = bs::test::run({bs::test::bertsweep_bin(), "train", "--config", cfg, "--set", "distributed.backend=none",
                              "--set", "seed=6", "--quiet", "--dump-params", dir + "/other.bin"});
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_GT(max_rel_diff(read_floats(dir + "/other.bin"), a), 1e-2);
}

TEST(DataParallel, MismatchedConfigsAcrossRanksAreRefused) {
  auto dir = bs::test::make_temp_dir("dp");
  auto cfg = config(dir, "random", "none");
  // Rank 1 gets another lr through an MPMD launch: the ranks must notice before training.
  // clang-format off
  auto r = bs::test::run({"mpirun", "--allow-run-as-root", "--oversubscribe",
                          "-np", "1", bs::test::bertsweep_bin(), "train", "--config", cfg,
                          "--set", "distributed.backend=mpi", "--quiet", ":",
                          "-np", "1", bs::test::bertsweep_bin(), "train", "--config", cfg,
                          "--set", "distributed.backend=mpi", "--set", "optimizer.lr=0.5", "--quiet"},
                         300);
  // clang-format on
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.err + r.out).find("differ"), std::string::npos) << r.err << r.out;
}
