// Gradient buckets in 2 real MPI ranks on a small torch::nn model: the averaged (and clipped, per mode)
// gradients equal a float64 reference that each rank computes alone from both ranks' inputs; buckets start
// during backward; gradient accumulation communicates only on the last micro-batch; .grad() views into a
// flat optimizer buffer keep pointing there. Every case runs in both layouts: buckets with their own
// buffers (gather/scatter copies) and buckets that are ranges of the flat gradient buffer.
#include <gtest/gtest.h>

#include <cmath>

#include "MpiTestUtil.h"
#include "distributed/Communicator.h"
#include "distributed/GradientBucketer.h"

namespace {

torch::nn::Sequential make_model() {
  torch::manual_seed(0);  // identical weights on every rank
  return torch::nn::Sequential(torch::nn::Linear(8, 24), torch::nn::Tanh(), torch::nn::Linear(24, 24),
                               torch::nn::Tanh(), torch::nn::Linear(24, 4));
}

// Rank r's micro-batch m: deterministic, so any rank can recompute any other rank's input.
std::pair<torch::Tensor, torch::Tensor> batch(int rank, int micro) {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(1000 + 17 * rank + micro);
  auto x = torch::randn({6, 8}, g, torch::kDouble);
  auto y = torch::randn({6, 4}, g, torch::kDouble);
  return {x, y};
}

torch::Tensor loss_of(torch::nn::Sequential& m, int rank, int micro, torch::Dtype dt) {
  auto [x, y] = batch(rank, micro);
  return torch::mse_loss(m->forward(x.to(dt)), y.to(dt)) * (1.0 + rank);  // ranks differ in scale too
}

// Float64 gradients (registration order) of rank r's loss summed over `micros` micro-batches.
std::vector<torch::Tensor> reference_grads(int rank, int micros) {
  auto m = make_model();
  m->to(torch::kDouble);
  for (int k = 0; k < micros; ++k) loss_of(m, rank, k, torch::kDouble).backward();
  std::vector<torch::Tensor> g;
  for (auto& p : m->parameters()) g.push_back(p.grad().clone());
  return g;
}

double norm_of(const std::vector<torch::Tensor>& ts) {
  double sq = 0;
  for (const auto& t : ts) sq += t.pow(2).sum().item<double>();
  return std::sqrt(sq);
}

std::vector<torch::Tensor> scaled(const std::vector<torch::Tensor>& ts, double s) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back(t * s);
  return out;
}

std::vector<torch::Tensor> mean_of(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < a.size(); ++i) out.push_back((a[i] + b[i]) / 2);
  return out;
}

// Local gradient with each bucket clipped to max_norm / sqrt(n_buckets) (float64).
std::vector<torch::Tensor> bucket_clipped(std::vector<torch::Tensor> g,
                                          const std::vector<std::vector<int64_t>>& buckets, double max_norm) {
  const double cap = max_norm / std::sqrt(double(buckets.size()));
  for (const auto& b : buckets) {
    std::vector<torch::Tensor> part;
    for (int64_t i : b) part.push_back(g[i]);
    const double n = norm_of(part);
    if (n > cap)
      for (int64_t i : b) g[i] = g[i] * (cap / n);
  }
  return g;
}

// The optimizer's layout: every .grad() a view into one flat buffer.
torch::Tensor flat_grad_views(torch::nn::Sequential& m) {
  int64_t total = 0;
  for (auto& p : m->parameters()) total += p.numel();
  torch::Tensor flat = torch::zeros({total});
  int64_t off = 0;
  for (auto& p : m->parameters()) {
    p.mutable_grad() = flat.narrow(0, off, p.numel()).view(p.sizes());
    off += p.numel();
  }
  return flat;
}

struct StepResult {
  std::vector<torch::Tensor> grads;
  bs::BucketStats stats;
  std::vector<std::vector<int64_t>> buckets;
  bool views_kept = true;
  bool launched_before_backward_end = true;
  bool nothing_launched_early = true;
};

enum class Layout { kCopies, kViews };

StepResult run_step(bs::Communicator& comm, const std::string& mode, double max_norm, int micros,
                    Layout layout = Layout::kCopies) {
  auto m = make_model();
  torch::Tensor flat = flat_grad_views(m);
  bs::ClipConfig clip;
  clip.mode = mode;
  clip.max_norm = max_norm;
  clip.bucket_mb = 200.0 / (1024 * 1024);  // ~50 floats: 3 buckets for this model
  bs::GradientBucketer bucketer(
      m->parameters(), comm, clip, std::nullopt,
      layout == Layout::kViews ? std::vector<torch::Tensor>{flat} : std::vector<torch::Tensor>{});
  EXPECT_EQ(bucketer.buckets_are_views(), layout == Layout::kViews);
  StepResult res;
  for (int k = 0; k < micros; ++k) {
    const bool last = k == micros - 1;
    bucketer.begin_micro(last);
    loss_of(m, comm.rank(), k, torch::kFloat).backward();
    const auto backward_end = bs::Clock::now();
    for (auto t : bucketer.launch_times()) {
      if (!last && t != bs::Clock::time_point{}) res.nothing_launched_early = false;
      if (last && mode != "local_before_allreduce" && !(t != bs::Clock::time_point{} && t < backward_end))
        res.launched_before_backward_end = false;
    }
  }
  bucketer.finish();
  res.stats = bucketer.step_stats();
  res.buckets = bucketer.bucket_params();
  const float* lo = flat.data_ptr<float>();
  for (auto& p : m->parameters()) {
    const float* g = p.grad().data_ptr<float>();
    res.views_kept = res.views_kept && g >= lo && g < lo + flat.numel();
    res.grads.push_back(p.grad().to(torch::kDouble));
  }
  return res;
}

void expect_close(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-4, 1e-6))
        << what << ": parameter " << i << " max diff " << (got[i] - want[i]).abs().max().item<double>();
}

bs::DistributedConfig mpi_config() {
  bs::DistributedConfig c;
  c.backend = "mpi";
  c.timeout_s = 20;
  return c;
}

TEST(GradientBucketerMpi, AveragedGradientsMatchTheMeanOfBothRanks) {
  BS_RUN_IN_MPI_RANKS();
  auto comm = bs::make_communicator(mpi_config());
  for (Layout layout : {Layout::kCopies, Layout::kViews}) {
    SCOPED_TRACE(layout == Layout::kViews ? "buckets as views of the flat buffer" : "buckets with copies");
    ASSERT_EQ(comm->world(), 2);
    const auto want = mean_of(reference_grads(0, 1), reference_grads(1, 1));
    StepResult r = run_step(*comm, "none", 1.0, 1, layout);
    EXPECT_GE(r.stats.buckets, 3) << "the test wants several buckets";
    expect_close(r.grads, want, "none");
    EXPECT_NEAR(r.stats.grad_norm, norm_of(want), 1e-4 * norm_of(want));
    EXPECT_TRUE(r.views_kept) << ".grad() must stay a view into the optimizer's flat buffer";
    // Buckets are in reverse registration order: the first bucket holds the last parameter.
    EXPECT_EQ(r.buckets.front().front(), int64_t(want.size()) - 1);
    EXPECT_EQ(r.buckets.back().back(), 0);
  }
}

TEST(GradientBucketerMpi, BucketsStartDuringBackward) {
  BS_RUN_IN_MPI_RANKS();
  auto comm = bs::make_communicator(mpi_config());
  for (Layout layout : {Layout::kCopies, Layout::kViews}) {
    SCOPED_TRACE(layout == Layout::kViews ? "buckets as views of the flat buffer" : "buckets with copies");
    StepResult r = run_step(*comm, "bucket_before_allreduce", 0.05, 1, layout);
    EXPECT_EQ(r.stats.launched_in_backward, r.stats.buckets) << "every bucket should start from an autograd hook";
    EXPECT_TRUE(r.launched_before_backward_end) << "a bucket's allreduce started only after backward returned";
    EXPECT_GT(r.stats.comm_seconds, 0.0);
    EXPECT_GE(r.stats.overlap, 0.0);
    EXPECT_LE(r.stats.overlap, 1.0);
  }
}

TEST(GradientBucketerMpi, GradientAccumulationCommunicatesOnlyOnTheLastMicroBatch) {
  BS_RUN_IN_MPI_RANKS();
  auto comm = bs::make_communicator(mpi_config());
  for (Layout layout : {Layout::kCopies, Layout::kViews}) {
    SCOPED_TRACE(layout == Layout::kViews ? "buckets as views of the flat buffer" : "buckets with copies");
    const auto want = mean_of(reference_grads(0, 3), reference_grads(1, 3));
    StepResult r = run_step(*comm, "none", 1.0, 3, layout);
    EXPECT_TRUE(r.nothing_launched_early);
    EXPECT_EQ(r.stats.launched_in_backward, r.stats.buckets);
    expect_close(r.grads, want, "3 micro-batches");
  }
}

TEST(GradientBucketerMpi, GlobalClipAfterAllreduce) {
  BS_RUN_IN_MPI_RANKS();
  auto comm = bs::make_communicator(mpi_config());
  for (Layout layout : {Layout::kCopies, Layout::kViews}) {
    SCOPED_TRACE(layout == Layout::kViews ? "buckets as views of the flat buffer" : "buckets with copies");
    const auto mean = mean_of(reference_grads(0, 1), reference_grads(1, 1));
    const double max_norm = 0.5 * norm_of(mean);  // binding
    StepResult r = run_step(*comm, "global_after_allreduce", max_norm, 1, layout);
    expect_close(r.grads, scaled(mean, max_norm / norm_of(mean)), "global_after_allreduce");
    EXPECT_NEAR(r.stats.grad_norm, norm_of(mean), 1e-4 * norm_of(mean));
    EXPECT_NEAR(norm_of(r.grads), max_norm, 1e-4 * max_norm);
  }
}

TEST(GradientBucketerMpi, BucketClipBeforeAllreduce) {
  BS_RUN_IN_MPI_RANKS();
  auto comm = bs::make_communicator(mpi_config());
  for (Layout layout : {Layout::kCopies, Layout::kViews}) {
    SCOPED_TRACE(layout == Layout::kViews ? "buckets as views of the flat buffer" : "buckets with copies");
    const auto g0 = reference_grads(0, 1), g1 = reference_grads(1, 1);
    const double max_norm = 0.3 * std::min(norm_of(g0), norm_of(g1));
    StepResult r = run_step(*comm, "bucket_before_allreduce", max_norm, 1, layout);
    const auto want = mean_of(bucket_clipped(g0, r.buckets, max_norm), bucket_clipped(g1, r.buckets, max_norm));
    expect_close(r.grads, want, "bucket_before_allreduce");
    // Each bucket of the result is the mean of two clipped buckets, so within the per-bucket cap.
    const double cap = max_norm / std::sqrt(double(r.buckets.size()));
    for (const auto& b : r.buckets) {
      std::vector<torch::Tensor> part;
      for (int64_t i : b) part.push_back(r.grads[i]);
      EXPECT_LE(norm_of(part), cap * (1 + 1e-5));
    }
    EXPECT_LE(norm_of(r.grads), max_norm * (1 + 1e-5));
    const double local = norm_of(comm->rank() == 0 ? g0 : g1);
    EXPECT_NEAR(r.stats.grad_norm, local, 1e-4 * local);
  }
}

TEST(GradientBucketerMpi, LocalClipBeforeAllreduce) {
  BS_RUN_IN_MPI_RANKS();
  auto comm = bs::make_communicator(mpi_config());
  for (Layout layout : {Layout::kCopies, Layout::kViews}) {
    SCOPED_TRACE(layout == Layout::kViews ? "buckets as views of the flat buffer" : "buckets with copies");
    const auto g0 = reference_grads(0, 1), g1 = reference_grads(1, 1);
    const double max_norm = 0.5 * std::min(norm_of(g0), norm_of(g1));
    StepResult r = run_step(*comm, "local_before_allreduce", max_norm, 1, layout);
    const auto want = mean_of(scaled(g0, max_norm / norm_of(g0)), scaled(g1, max_norm / norm_of(g1)));
    expect_close(r.grads, want, "local_before_allreduce");
    EXPECT_EQ(r.stats.launched_in_backward, 0) << "local clipping needs the whole gradient: nothing can overlap";
  }
}

// One process (backend none): clipping still applies, and gradients stay the local ones.
TEST(GradientBucketerLocal, SingleRankClipModes) {
  if (bs::test::in_mpi_child()) {
    GTEST_SKIP();
  }
  bs::DistributedConfig c;
  c.backend = "none";
  auto comm = bs::make_communicator(c);
  for (Layout layout : {Layout::kCopies, Layout::kViews}) {
    SCOPED_TRACE(layout == Layout::kViews ? "buckets as views of the flat buffer" : "buckets with copies");
    const auto g = reference_grads(0, 1);
    expect_close(run_step(*comm, "none", 1.0, 1, layout).grads, g, "none, 1 rank");
    const double max_norm = 0.5 * norm_of(g);
    expect_close(run_step(*comm, "global_after_allreduce", max_norm, 1, layout).grads, scaled(g, 0.5),
                 "global, 1 rank");
    expect_close(run_step(*comm, "local_before_allreduce", max_norm, 1, layout).grads, scaled(g, 0.5), "local, 1 rank");
    StepResult r = run_step(*comm, "bucket_before_allreduce", max_norm, 1, layout);
    expect_close(r.grads, bucket_clipped(g, r.buckets, max_norm), "bucket, 1 rank");
    EXPECT_EQ(r.stats.comm_seconds, 0.0);
  }
}

}  // namespace
