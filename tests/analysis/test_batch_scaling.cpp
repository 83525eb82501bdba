// The batch-scaling part of the report (analysis/BatchScaling.h): the critical-batch fit against exact least
// squares, its bootstrap against a straightforward reimplementation here (and numpy's percentiles), the cluster
// time model against hand computation, and `bertsweep report` of a study written through the real stores with
// per-batch confirmation runs: the new sections, their numbers (computed here from the test's own data) and PNGs.
#include <SQLiteCpp/SQLiteCpp.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <sstream>

#include "PngCheck.h"
#include "StudyFixture.h"
#include "TestUtil.h"
#include "analysis/BatchScaling.h"
#include "analysis/Report.h"

using namespace bs;
using namespace bs::analysis;
namespace fs = std::filesystem;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Least squares y = a + b x by the normal equations in long double (not the centred sums the library uses).
std::pair<double, double> normal_equations(const std::vector<double>& x, const std::vector<double>& y) {
  long double n = x.size(), sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    sx += x[i], sy += y[i], sxx += (long double)x[i] * x[i], sxy += (long double)x[i] * y[i];
  const long double det = n * sxx - sx * sx;
  return {static_cast<double>((sy * sxx - sx * sxy) / det), static_cast<double>((n * sxy - sx * sy) / det)};
}

// The bootstrap written out plainly: mt19937_64(seed); per replicate, per batch in order, n_i draws rng() % n_i.
struct Replicates {
  std::vector<double> crit, a, b;
  int unbounded = 0;
};
Replicates reference_bootstrap(const std::vector<double>& batches, const std::vector<std::vector<double>>& samples,
                               int replicates, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Replicates out;
  for (int r = 0; r < replicates; ++r) {
    std::vector<double> x, y;
    for (std::size_t i = 0; i < batches.size(); ++i)
      for (std::size_t j = 0; j < samples[i].size(); ++j) {
        x.push_back(batches[i]);
        y.push_back(samples[i][rng() % samples[i].size()]);
      }
    auto [a, b] = normal_equations(x, y);
    double mx = 0, my = 0;
    for (std::size_t i = 0; i < x.size(); ++i) mx += x[i] / x.size(), my += y[i] / y.size();
    const double tol = 1e-9 * std::abs(my);
    const double crit = b * mx <= tol ? kInf : a <= tol ? 0 : a / b;
    out.unbounded += std::isinf(crit);
    out.crit.push_back(crit);
    out.a.push_back(a);
    out.b.push_back(b);
  }
  return out;
}

// numpy.percentile (linear) of finite values, by /usr/bin/python3.
std::vector<double> numpy_percentiles(const std::vector<double>& xs, const std::vector<double>& qs) {
  const std::string dir = test::make_temp_dir("np");
  std::ofstream f(dir + "/x.txt");
  f.precision(17);
  for (double x : xs) f << x << "\n";
  f.close();
  std::ostringstream q;
  for (double v : qs) q << (q.tellp() > 0 ? "," : "") << 100 * v;
  auto r = test::run({"/usr/bin/python3", "-c",
                      "import numpy as np,sys\nx=np.loadtxt(sys.argv[1])\nfor v in np.percentile(x,[" + q.str() +
                          "]): print(repr(float(v)))",
                      dir + "/x.txt"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::istringstream in(r.out);
  std::vector<double> out;
  for (double v; in >> v;) out.push_back(v);
  return out;
}

void expect_near_rel(double got, double want, double rel, const std::string& what) {
  if (std::isinf(want)) EXPECT_TRUE(std::isinf(got) && got > 0) << what << ": " << got;
  else
    EXPECT_NEAR(got, want, rel * std::max(1.0, std::abs(want))) << what;
}

}  // namespace

TEST(BatchScaling, FitEqualsExactLeastSquares) {
  // On a line: E = 1000 + 10 B, so E_min 1000, S_min 10, B_crit 100.
  auto f = fit_critical_batch({32, 64, 128, 256}, {1320, 1640, 2280, 3560});
  ASSERT_EQ(f.kind, CriticalBatchFit::Kind::kFit);
  EXPECT_NEAR(f.e_min, 1000, 1e-9);
  EXPECT_NEAR(f.s_min, 10, 1e-12);
  EXPECT_NEAR(f.b_crit, 100, 1e-9);
  // Noisy, repeated batches: the normal equations in long double.
  const std::vector<double> x = {32, 32, 32, 64, 64, 128, 128, 128, 256, 256};
  const std::vector<double> y = {4096, 4096, 6144, 6144, 8192, 12288, 14336, 14336, 20480, 22528};
  auto [a, b] = normal_equations(x, y);
  f = fit_critical_batch(x, y);
  ASSERT_EQ(f.kind, CriticalBatchFit::Kind::kFit);
  EXPECT_NEAR(f.e_min, a, 1e-9 * std::abs(a));
  EXPECT_NEAR(f.s_min, b, 1e-12 * std::abs(b));
  EXPECT_NEAR(f.b_crit, a / b, 1e-9 * a / b);
}

TEST(BatchScaling, BootstrapOfZeroSpreadCollapsesToThePoint) {
  const std::vector<double> batches = {32, 64, 128, 256};
  const std::vector<std::vector<double>> samples = {{1320, 1320, 1320}, {1640, 1640}, {2280}, {3560, 3560, 3560}};
  const auto c = bootstrap_critical_batch(batches, samples);
  ASSERT_EQ(c.point.kind, CriticalBatchFit::Kind::kFit);
  EXPECT_EQ(c.replicates, 2000);
  EXPECT_EQ(c.unbounded, 0);
  EXPECT_NEAR(c.b_crit.lo, c.point.b_crit, 1e-9);
  EXPECT_NEAR(c.b_crit.hi, c.point.b_crit, 1e-9);
  EXPECT_NEAR(c.e_min.lo, 1000, 1e-9);
  EXPECT_NEAR(c.e_min.hi, 1000, 1e-9);
  EXPECT_NEAR(c.s_min.lo, 10, 1e-12);
  EXPECT_NEAR(c.s_min.hi, 10, 1e-12);
  EXPECT_EQ(format_b_crit_interval(c), "[100, 100]");
}

TEST(BatchScaling, BootstrapEqualsAPlainReimplementationAndNumpyPercentiles) {
  const std::vector<double> batches = {32, 64, 128, 256};
  const std::vector<std::vector<double>> samples = {
      {4096, 4096, 6144}, {6144, 8192, 8192}, {12288, 14336, 14336, 16384}, {20480, 22528}};
  BootstrapOptions o;
  o.replicates = 500;
  o.seed = 7;
  const auto c = bootstrap_critical_batch(batches, samples, o);
  const auto ref = reference_bootstrap(batches, samples, o.replicates, o.seed);
  ASSERT_EQ(c.replicates, 500);
  EXPECT_EQ(c.unbounded, ref.unbounded);
  const auto e = numpy_percentiles(ref.a, {0.025, 0.975});
  const auto s = numpy_percentiles(ref.b, {0.025, 0.975});
  ASSERT_EQ(e.size(), 2u);
  ASSERT_EQ(s.size(), 2u);
  expect_near_rel(c.e_min.lo, e[0], 1e-9, "E_min lo");
  expect_near_rel(c.e_min.hi, e[1], 1e-9, "E_min hi");
  expect_near_rel(c.s_min.lo, s[0], 1e-9, "S_min lo");
  expect_near_rel(c.s_min.hi, s[1], 1e-9, "S_min hi");
  ASSERT_EQ(ref.unbounded, 0);  // this data always has a batch penalty: B_crit percentiles by numpy too
  const auto k = numpy_percentiles(ref.crit, {0.025, 0.975});
  expect_near_rel(c.b_crit.lo, k[0], 1e-9, "B_crit lo");
  expect_near_rel(c.b_crit.hi, k[1], 1e-9, "B_crit hi");
  EXPECT_LT(c.b_crit.lo, c.point.b_crit);
  EXPECT_GT(c.b_crit.hi, c.point.b_crit);
  // Fixed seed: the same interval again.
  const auto again = bootstrap_critical_batch(batches, samples, o);
  EXPECT_EQ(again.b_crit.lo, c.b_crit.lo);
  EXPECT_EQ(again.b_crit.hi, c.b_crit.hi);
}

TEST(BatchScaling, FlatSamplesGiveUnboundedReplicatesWrittenAsAboveTheLargestBatch) {
  // LAMB-like: a clear penalty at small batches in some seeds only, flat at the top: many replicates have
  // slope <= 0, so the upper end of the interval is unbounded.
  const std::vector<double> batches = {64, 128, 256};
  const std::vector<std::vector<double>> samples = {
      {10240, 10240, 30720}, {16384, 16384, 16384}, {18432, 18432, 18432}};
  const auto c = bootstrap_critical_batch(batches, samples);
  const auto ref = reference_bootstrap(batches, samples, 2000, BootstrapOptions{}.seed);
  EXPECT_EQ(c.unbounded, ref.unbounded);
  EXPECT_GT(c.unbounded, 50);  // more than 2.5% of 2000: the upper percentile is among them
  EXPECT_TRUE(std::isinf(c.b_crit.hi));
  std::vector<double> crit = ref.crit;
  std::sort(crit.begin(), crit.end());
  const double h = 0.025 * 1999, lo = crit[49] + (h - 49) * (crit[50] - crit[49]);
  EXPECT_NEAR(c.b_crit.lo, lo, 1e-9 * lo);
  EXPECT_EQ(format_b_crit_interval(c), "[" + format_number(std::round(lo)) + ", > 256]");
  // Wholly flat: the point itself is unbounded.
  const auto flat = bootstrap_critical_batch(batches, {{5000, 5200, 4800}, {5000, 5000, 5000}, {4000, 4000, 4000}});
  EXPECT_EQ(flat.point.kind, CriticalBatchFit::Kind::kAboveRange);
  EXPECT_EQ(format_b_crit(kInf, flat), "> 256");
}

TEST(BatchScaling, RingAllreduceAndStepTimeEqualHandComputation) {
  ClusterModel m;  // 25 GB/s, 10 us, local batch >= 4
  // N = 8, G = 4 MB: 2 * 7/8 * 4e6 / 25e9 = 2.8e-4 s, plus 2 * 7 * 1e-5 = 1.4e-4 s.
  EXPECT_NEAR(ring_allreduce_seconds(8, 4e6, m), 4.2e-4, 1e-15);
  EXPECT_EQ(ring_allreduce_seconds(1, 4e6, m), 0);
  // B = 256 on 8 devices at 1000 samples/s: 32 / 1000 = 0.032 s of compute.
  EXPECT_NEAR(modelled_step_seconds(256, 8, 1000, 4e6, m), 0.03242, 1e-15);
  EXPECT_NEAR(modelled_step_seconds(256, 1, 1000, 4e6, m), 0.256, 1e-15);

  const std::vector<CellTiming> cells = {{"adam", 32, 150, 1000, 4e6},
                                         {"adam", 256, 85, 1000, 4e6},
                                         {"lamb", 64, 200, 900, 4e6},
                                         {"lamb", 256, 110, 900, 4e6}};
  const auto rows = model_time_to_train(cells, m);
  ASSERT_EQ(rows.size(), 7u);  // N = 1 .. 64 (256 / 64 = 4)
  // N = 1: adam 150 * 0.032 = 4.8 s at 32; lamb 200 * 64/900 = 14.2222 s at 64.
  EXPECT_EQ(rows[0].devices, 1);
  EXPECT_EQ(rows[0].best.at("adam").batch, 32);
  EXPECT_NEAR(rows[0].best.at("adam").seconds, 4.8, 1e-12);
  EXPECT_NEAR(rows[0].best.at("lamb").seconds, 200 * 64 / 900.0, 1e-12);
  EXPECT_EQ(rows[0].winner, "adam");
  // N = 16: adam's 32 would be local batch 2 (< 4): 256 -> 85 * (0.016 + 3e-4 + 3e-4) = 1.411 s;
  // lamb 64 -> local 4: 200 * (4/900 + 3e-4 + 3e-4) = 1.00889 s: lamb is faster.
  EXPECT_EQ(rows[4].devices, 16);
  EXPECT_EQ(rows[4].best.at("adam").batch, 256);
  EXPECT_NEAR(rows[4].best.at("adam").seconds, 1.411, 1e-12);
  EXPECT_EQ(rows[4].best.at("lamb").batch, 64);
  EXPECT_NEAR(rows[4].best.at("lamb").seconds, 200 * (4 / 900.0 + 6e-4), 1e-12);
  EXPECT_EQ(rows[4].winner, "lamb");
  // N = 64: both at 256 (local 4): adam 85 * (0.004 + 2*63/64*1.6e-4 + 1.26e-3) = 0.473875 s.
  EXPECT_EQ(rows[6].devices, 64);
  EXPECT_NEAR(rows[6].best.at("adam").seconds, 0.473875, 1e-12);
  EXPECT_EQ(rows[6].winner, "adam");
  // A larger minimum local batch stops earlier: 256 / 32 = 8 devices.
  m.min_local_batch = 32;
  EXPECT_EQ(model_time_to_train(cells, m).size(), 4u);
}

TEST(BatchScaling, ParameterCountOfBertBaseIsTheKnownOne) {
  ModelConfig m;  // BERT-base uncased: 110,106,428 parameters in BertForPreTraining (tied decoder)
  m.vocab_size = 30522;
  m.hidden = 768;
  m.layers = 12;
  m.heads = 12;
  m.intermediate = 3072;
  m.max_position = 512;
  m.type_vocab_size = 2;
  EXPECT_EQ(bert_parameter_count(m), 110106428);
}

TEST(BatchScaling, VocabFromTheDataFolderAndGradientBytes) {
  const std::string dir = test::make_temp_dir("vocab");
  {
    std::ofstream v(dir + "/vocab.txt");
    for (int i = 0; i < 7; ++i) v << "tok" << i << "\n";
  }
  TrainConfig c;
  c.data.dir = dir;
  std::string where;
  EXPECT_EQ(vocab_size_of(c, where), 7);
  EXPECT_EQ(where, dir + "/vocab.txt");
  c.model.vocab_size = 99;
  EXPECT_EQ(vocab_size_of(c, where), 99);
  c.model.vocab_size = 0;
  c.data.dir = dir + "/missing";
  EXPECT_FALSE(vocab_size_of(c, where));
  EXPECT_NE(where.find("cannot be read"), std::string::npos) << where;

  EXPECT_EQ(grad_bytes_per_value(c), 4);  // fp32 gradients
  c.distributed.grad_dtype = "compute";
  c.precision = "bf16";
  EXPECT_EQ(grad_bytes_per_value(c), 2);
  c.precision = "fp32";
  EXPECT_EQ(grad_bytes_per_value(c), 4);
}

TEST(BatchScaling, StoredThroughputIsTotalSamplesOverTotalWindowTime) {
  // Windows of 640, 640 and 320 samples at 100, 200 and 160 samples/s: 6.4 + 3.2 + 2 s. Out of order, and a
  // point with no rate (skipped, its window unknown).
  std::vector<ThroughputPoint> p(4);
  p[0].samples = 1280, p[0].samples_per_s = 200;
  p[1].samples = 640, p[1].samples_per_s = 100;
  p[2].samples = 1600, p[2].samples_per_s = 160;
  p[3].samples = 1920, p[3].samples_per_s = 0;
  int windows = 0;
  auto r = stored_samples_per_s(p, &windows);
  ASSERT_TRUE(r);
  EXPECT_NEAR(*r, 1600 / 11.6, 1e-12);
  EXPECT_EQ(windows, 3);
  EXPECT_FALSE(stored_samples_per_s({}));
}

namespace {

ScalingCell cell(const std::string& opt, int64_t batch, std::vector<double> samples, int runs) {
  ScalingCell c;
  c.optimizer = opt;
  c.batch = batch;
  c.runs = runs;
  c.reached = static_cast<int>(samples.size());
  c.samples = samples;
  c.samples_stats = stats_of(samples);
  return c;
}

}  // namespace

TEST(BatchScaling, FamilyStatementVerdicts) {
  // At 256 adam [20663, 23028] vs lamb 28672: holds; at the best batches adam 32 vs lamb 64 ([7242, 21430]): holds.
  std::vector<ScalingCell> cells = {
      cell("adam", 32, {4096, 4096, 6144}, 3), cell("adam", 256, {20480, 22528, 22528}, 3),
      cell("lamb", 64, {10240, 10240, 22528}, 3), cell("lamb", 256, {28672, 28672, 28672}, 3)};
  std::string s = family_statement(cells, {});
  EXPECT_NE(s.find("At the largest batch both families were confirmed at (256): adam 21845.3 +- 1182.41 (3 of 3 "
                   "reached) vs lamb 28672 +- 0 (3 of 3 reached): holds on this proxy."),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("adam at batch 32 4778.67 +- 1182.41 (3 of 3 reached) vs lamb at batch 64 14336 +- 7094.48 (3 of 3 "
                   "reached): holds on this proxy."),
            std::string::npos)
      << s;
  // Overlapping ranges at 256 (a lamb seed as good as adam's): inconclusive.
  cells[3] = cell("lamb", 256, {20480, 28672, 28672}, 3);
  s = family_statement(cells, {});
  EXPECT_NE(s.find("(256): adam 21845.3 +- 1182.41 (3 of 3 reached) vs lamb 25941.3 +- 4729.65 (3 of 3 reached): "
                   "inconclusive: intervals overlap."),
            std::string::npos)
      << s;
  // LAMB clearly better at 256: does not hold; adamw is in the Adam family, nvlamb in the LAMB family.
  cells = {cell("adamw", 256, {30000, 31000, 32000}, 3), cell("nvlamb", 256, {20000, 21000, 22000}, 4)};
  s = family_statement(cells, {});
  EXPECT_NE(s.find("adamw 31000 +- 1000 (3 of 3 reached) vs nvlamb 21000 +- 1000 (3 of 4 reached): does not hold on "
                   "this proxy."),
            std::string::npos)
      << s;
  // One family missing: not answered.
  s = family_statement({cell("adam", 32, {4096}, 1)}, {});
  EXPECT_NE(s.find("Not answered: no LAMB-family confirmation run reached the target."), std::string::npos) << s;
}

// ---------------------------------------------------------------------------------------------------------
// The report of a study confirmed per batch (written through StudyStore and ConfirmStore), by the real CLI.
namespace {

struct SynCell {
  std::string optimizer;
  int64_t batch;
  std::vector<std::optional<double>> samples;  // per seed; nullopt: did not reach
  std::vector<double> windows;                 // stored throughput windows (samples/s) of the source trial
};

// Like BENCHMARKS.md section 7: adam, adamw and lamb at batches 32..256, 3 seeds.
std::vector<SynCell> syn_cells() {
  const std::optional<double> miss;
  return {{"adam", 32, {4096, 4096, 6144}, {400, 500, 500, 450}},
          {"adam", 64, {6144, 8192, 8192}, {600, 640}},
          {"adam", 128, {12288, 14336, 14336}, {700, 720, 730}},
          {"adam", 256, {20480, 22528, 22528}, {800, 810}},
          {"adamw", 32, {6144, 6144, 8192}, {}},
          {"adamw", 128, {18432, 22528, miss}, {}},
          {"lamb", 32, {20480, 20480, 24576}, {}},
          {"lamb", 64, {10240, 10240, 22528}, {}},
          {"lamb", 128, {16384, 16384, 16384}, {}},
          {"lamb", 256, {28672, 28672, 28672}, {}},
          {"nvlamb", 64, {16384, 16384, 18432}, {}}};  // one batch size: nothing to fit
}

double seconds_of(const SynCell& c, double samples, int seed) { return samples / (300.0 + c.batch) + seed; }

std::string syn_config(const std::string& opt, int64_t batch, const std::string& data_dir, int64_t seed) {
  TrainConfig c;
  c.optimizer.name = opt;
  c.batch.global = batch;
  c.batch.micro = batch;
  c.data.dir = data_dir;
  c.seed = seed;
  c.device = "cpu";
  c.precision = "fp32";
  return c.to_yaml_string();
}

// The study; returns its folder. Trial i is the source trial of cell i.
std::string write_syn_study(const std::string& root) {
  const std::string data = root + "/data";
  fs::create_directories(data);
  {
    std::ofstream v(data + "/vocab.txt");
    for (int i = 0; i < 1000; ++i) v << "w" << i << "\n";
  }
  fs::create_directories(root + "/studies/syn");
  const std::string db = root + "/studies/syn/study.db";
  StudyStore store(db);
  store.save_study("syn", "name: syn\nobjective: samples_to_target\ndirection: minimize\n");
  ConfirmStore confirm(db, true);
  const auto cells = syn_cells();
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const auto& c = cells[i];
    TrialRecord t = test::make_trial(i, trial_state::kComplete, c.optimizer, c.batch, true, c.samples[0]);
    t.config_yaml = syn_config(c.optimizer, c.batch, data, 1);
    store.insert_trial(t);
    for (std::size_t w = 0; w < c.windows.size(); ++w)
      store.add_throughput({(int64_t)i, (int64_t)(20 * (w + 1)), (int64_t)(20 * (w + 1) * c.batch), c.windows[w]});
    for (int seed = 1; seed <= 3; ++seed) {
      const auto& s = c.samples[seed - 1];
      confirm.add({1, c.optimizer, (int64_t)i, seed, 0, s.has_value(), s,
                   s ? std::optional<double>(seconds_of(c, *s, seed)) : std::nullopt, 0.08,
                   syn_config(c.optimizer, c.batch, data, seed), "", c.batch});
    }
  }
  return root + "/studies";
}

std::string pm(const std::vector<double>& xs) {
  const Stats s = stats_of(xs);
  return format_number(s.mean) + " +- " + format_number(s.std);
}

}  // namespace

TEST(BatchScalingReport, PerBatchConfirmedStudyGetsTheSectionsWithTheRightNumbers) {
  const std::string root = test::make_temp_dir("scaling-report");
  const std::string dir = write_syn_study(root);
  const std::string out = root + "/out";
  auto r = test::run({test::bertsweep_bin(), "report", "syn", "--dir", dir, "--out", out, "--link-gbytes-per-s", "12.5",
                      "--link-latency-us", "5", "--min-local-batch", "8"},
                     300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string md = test::file_bytes(out + "/report.md"), html = test::file_bytes(out + "/report.html");
  for (const char* h : {"#### Samples and steps to target vs batch size", "#### Critical batch size",
                        "#### Time to train: measured on this machine",
                        "#### Time to train: modelled data-parallel cluster", "#### Adam family vs LAMB family"}) {
    EXPECT_NE(md.find(h), std::string::npos) << h << "\n" << md;
    EXPECT_NE(html.find(std::string("<h4>") + (h + 5) + "</h4>"), std::string::npos) << h;
  }
  // Samples and steps per cell, over the reached seeds (adamw 128: 2 of 3).
  const ClusterModel m{12.5e9, 5e-6, 8};
  const int64_t params = 625130;  // H128 L2 I512, vocab 1000: (1000+512+2)*128+256 + 2*198272 + 17768 + 16770
  std::map<std::string, std::map<int64_t, std::pair<double, double>>> steps_rate;  // mean steps, samples/s
  const auto cells = syn_cells();
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const auto& c = cells[i];
    std::vector<double> xs, steps, secs;
    int seed = 0;
    for (const auto& s : c.samples) {
      ++seed;
      if (!s) continue;
      xs.push_back(*s);
      steps.push_back(*s / c.batch);
      secs.push_back(seconds_of(c, *s, seed));
    }
    const std::string head = "| " + c.optimizer + " | " + std::to_string(c.batch) + " | " + std::to_string(xs.size()) +
                             " of " + std::to_string(c.samples.size()) + " | ";
    EXPECT_NE(md.find(head + pm(xs) + " | " + pm(steps) + " |"), std::string::npos) << head << "\n" << md;
    // Measured: seconds to target; the rate from the stored windows (20 steps each) or the confirm runs.
    double rate = 0, total_s = 0, total_t = 0;
    std::string from;
    if (!c.windows.empty()) {
      for (double w : c.windows) total_s += 20 * c.batch, total_t += 20 * c.batch / w;
      from = "study trial " + std::to_string(i) + " (" + std::to_string(c.windows.size()) + " windows)";
    } else {
      for (std::size_t k = 0; k < xs.size(); ++k) total_s += xs[k], total_t += secs[k];
      from = "confirm runs (samples / seconds to target)";
    }
    rate = total_s / total_t;
    EXPECT_NE(md.find(head + pm(secs) + " | " + format_number(rate) + " | " + from + " |"), std::string::npos)
        << head << from << "\n"
        << md;
    steps_rate[c.optimizer][c.batch] = {stats_of(steps).mean, rate};
  }
  // Modelled: by hand, from the numbers above.
  EXPECT_NE(md.find("G = 625130 parameters x 4 bytes (fp32) = 2.50052 MB, bw = 12.5 GB/s per device, alpha = 5 us"),
            std::string::npos)
      << md;
  for (int64_t n = 1; n <= 32; n *= 2) {  // 256 / 8 = 32 devices at most
    std::string row = "| " + std::to_string(n) + " |", winner;
    double fastest = kInf;
    for (const auto& [opt, by_batch] : steps_rate) {
      double best = kInf;
      int64_t best_b = 0;
      for (const auto& [b, sr] : by_batch) {
        if (b % n || b / n < m.min_local_batch) continue;
        const double ar =
            n == 1 ? 0 : 2.0 * (n - 1) / n * params * 4 / m.link_bytes_per_s + 2.0 * (n - 1) * m.latency_s;
        const double t = sr.first * ((double)b / n / sr.second + ar);
        if (t < best) best = t, best_b = b;
      }
      row += best_b ? " " + format_number(best) + " (" + std::to_string(best_b) + ") |" : " - |";
      if (best < fastest) fastest = best, winner = opt;
    }
    row += " " + winner + " |";
    EXPECT_NE(md.find(row), std::string::npos) << row << "\n" << md;
  }
  const auto model_at = md.find("#### Time to train: modelled"), model_end = md.find("#### Adam family");
  ASSERT_LT(model_at, model_end);
  EXPECT_EQ(md.substr(model_at, model_end - model_at).find("\n| 64 |"), std::string::npos);  // 256/64 = 4 < 8
  // Critical batch: the point fit by the normal equations, the interval by the plain bootstrap above.
  std::vector<double> x, y, batches;
  std::vector<std::vector<double>> groups;
  for (const auto& c : cells) {
    if (c.optimizer != "lamb") continue;
    batches.push_back(c.batch);
    groups.emplace_back();
    for (const auto& s : c.samples) x.push_back(c.batch), y.push_back(*s), groups.back().push_back(*s);
  }
  auto [a, b] = normal_equations(x, y);
  const auto ref = reference_bootstrap(batches, groups, 2000, BootstrapOptions{}.seed);
  std::vector<double> crit = ref.crit;
  std::sort(crit.begin(), crit.end());
  auto pct = [&](double q) {
    const double h = q * 1999;
    const auto k = (std::size_t)h;
    return std::isinf(crit[k + 1]) ? kInf : crit[k] + (h - k) * (crit[k + 1] - crit[k]);
  };
  auto show = [](double v) {
    return std::isinf(v) ? std::string("> 256") : v <= 0 ? std::string("< 32") : format_number(std::round(v));
  };
  const std::string lamb_row = "| lamb | 12 | " + format_number(a) + " | ";
  const auto at = md.find(lamb_row);
  ASSERT_NE(at, std::string::npos) << lamb_row << "\n" << md;
  const std::string line = md.substr(at, md.find('\n', at) - at);
  EXPECT_NE(line.find(" | " + format_number(b) + " | "), std::string::npos) << line;
  EXPECT_NE(line.find(" | " + format_number(a / b) + " | [" + show(pct(0.025)) + ", " + show(pct(0.975)) + "] | " +
                      std::to_string(ref.unbounded) + " of 2000 |"),
            std::string::npos)
      << line;
  // One batch size: no line, so no E_min, S_min or B_crit (not a fit of 0).
  EXPECT_NE(md.find("| nvlamb | 3 | - | - | - | - | - (one batch size) | - | - |"), std::string::npos) << md;
  // The statement: adam vs lamb at 256 and at their best batches.
  EXPECT_NE(md.find("(256): adam 21845.3 +- 1182.41 (3 of 3 reached) vs lamb 28672 +- 0 (3 of 3 reached): holds on "
                    "this proxy."),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("adam at batch 32 4778.67 +- 1182.41 (3 of 3 reached) vs lamb at batch 64 14336 +- 7094.48 (3 of "
                    "3 reached): holds on this proxy."),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("; lamb " + show(a / b) + " [" + show(pct(0.025)) + ", " + show(pct(0.975)) + "]."),
            std::string::npos)
      << md;
  // The plots: real PNGs, linked from the Markdown and embedded in the HTML.
  for (const char* png : {"syn-batch-scaling.png", "syn-time-to-train.png", "syn-confirm.png"}) {
    const std::string path = out + "/" + png;
    ASSERT_TRUE(fs::exists(path)) << path;
    const auto info = test::inspect_png(path);
    EXPECT_TRUE(info.signature_ok) << png;
    EXPECT_GE(info.width, 600u) << png;
    EXPECT_GT(info.distinct_colours, 8) << png;
    EXPECT_NE(md.find(std::string("](") + png + ")"), std::string::npos) << png;
    EXPECT_NE(html.find("data-file=\"" + std::string(png) + "\" src=\"data:image/png;base64," +
                        base64(test::file_bytes(path)) + "\""),
              std::string::npos)
        << png;
  }
  std::cout << md.substr(md.find("### Confirmation runs")) << "\n";
}

TEST(BatchScalingReport, QuietWithoutPerBatchConfirmationAndBadFlagsAreUsageErrors) {
  const std::string root = test::make_temp_dir("scaling-quiet");
  fs::create_directories(root + "/studies/one");
  {
    StudyStore store(root + "/studies/one/study.db");
    store.save_study("one", "name: one\nobjective: samples_to_target\n");
    store.insert_trial(test::make_trial(0, trial_state::kComplete, "lamb", 64, true, 3000.0));
    store.insert_trial(test::make_trial(1, trial_state::kComplete, "adam", 64, true, 2000.0));
    ConfirmStore confirm(root + "/studies/one/study.db", true);
    for (int s = 1; s <= 2; ++s) {
      confirm.add({1, "lamb", 0, s, 0, true, 3000.0 + s, 10.0, 0.3, "", "", 64});
      confirm.add({1, "adam", 1, s, 0, true, 2000.0 + s, 10.0, 0.3, "", "", 64});
    }
  }
  const std::string out = root + "/out";
  auto r = test::run({test::bertsweep_bin(), "report", "one", "--dir", root + "/studies", "--out", out}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string md = test::file_bytes(out + "/report.md");
  EXPECT_NE(md.find("### Confirmation runs"), std::string::npos) << md;
  EXPECT_EQ(md.find("####"), std::string::npos) << md;
  EXPECT_FALSE(fs::exists(out + "/one-batch-scaling.png"));
  EXPECT_FALSE(fs::exists(out + "/one-time-to-train.png"));
  const std::vector<std::vector<std::string>> bads = {{"--link-gbytes-per-s", "0"},
                                                      {"--link-gbytes-per-s", "fast"},
                                                      {"--link-latency-us", "-1"},
                                                      {"--min-local-batch", "0"}};
  for (const auto& bad : bads) {
    std::vector<std::string> argv = {test::bertsweep_bin(), "report", "one", "--dir", root + "/studies", "--out", out};
    argv.insert(argv.end(), bad.begin(), bad.end());
    auto b = test::run(argv, 60);
    EXPECT_EQ(b.exit_code, 2) << bad[0] << " " << bad[1] << ": " << b.err;
    EXPECT_NE(b.err.find(bad[0]), std::string::npos) << b.err;
  }
  auto h = test::run({test::bertsweep_bin(), "report", "--help"});
  EXPECT_NE(h.out.find("--link-gbytes-per-s"), std::string::npos);
  EXPECT_NE(h.out.find("--min-local-batch"), std::string::npos);
}
