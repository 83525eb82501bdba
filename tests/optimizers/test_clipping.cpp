// Gradient clipping: the global norm against a float64 reference, global-norm clipping, and the bucket-wise
// clip (each bucket to max_norm/sqrt(n_buckets), so the whole gradient stays within max_norm).
#include <gtest/gtest.h>

#include <cmath>

#include "optimizers/Clipping.h"

namespace {

double reference_norm(const std::vector<torch::Tensor>& ts) {
  double s = 0;
  for (const auto& t : ts) {
    auto d = t.to(torch::kDouble).contiguous();
    const double* p = d.data_ptr<double>();
    for (int64_t i = 0; i < d.numel(); ++i) s += p[i] * p[i];
  }
  return std::sqrt(s);
}

std::vector<torch::Tensor> random_grads(int64_t seed, double scale) {
  torch::manual_seed(seed);
  return {torch::randn({40, 30}) * scale, torch::randn({30}) * scale, torch::randn({5, 5, 5}) * scale};
}

TEST(Clipping, GlobalNormMatchesFloat64Reference) {
  auto g = random_grads(1, 3.0);
  EXPECT_NEAR(bs::optim::global_norm(g), reference_norm(g), 1e-6 * reference_norm(g));
  EXPECT_EQ(bs::optim::global_norm({}), 0.0);
}

TEST(Clipping, GlobalClipScalesOnlyAboveMaxNorm) {
  auto g = random_grads(2, 1.0);
  std::vector<torch::Tensor> before;
  for (auto& t : g) before.push_back(t.clone());
  const double n = reference_norm(g);
  EXPECT_NEAR(bs::optim::clip_global_norm_(g, 2 * n), n, 1e-6 * n);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(torch::equal(g[i], before[i]));

  const double max_norm = n / 4;
  EXPECT_NEAR(bs::optim::clip_global_norm_(g, max_norm), n, 1e-6 * n);
  const double after = reference_norm(g);
  EXPECT_LE(after, max_norm);
  EXPECT_NEAR(after, max_norm, 1e-5 * max_norm);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(torch::allclose(g[i], before[i] * (after / n), 1e-5, 1e-7));
  EXPECT_THROW(bs::optim::clip_global_norm_(g, 0.0), std::invalid_argument);
}

TEST(Clipping, BucketClipKeepsWholeGradientWithinMaxNorm) {
  torch::manual_seed(3);
  const double max_norm = 1.0;
  const int64_t n_buckets = 4;
  std::vector<torch::Tensor> buckets = {torch::randn({1000}) * 5, torch::randn({200}) * 0.001, torch::randn({3000}),
                                        torch::randn({50}) * 10};
  auto small_before = buckets[1].clone();
  for (auto& b : buckets) {
    const double before = reference_norm({b});
    EXPECT_NEAR(bs::optim::clip_bucket_(b, max_norm, n_buckets), before, 1e-6 * before);
    EXPECT_LE(reference_norm({b}), max_norm / std::sqrt(double(n_buckets)) + 1e-12);
  }
  EXPECT_TRUE(torch::equal(buckets[1], small_before));  // under its share: untouched
  EXPECT_NEAR(reference_norm({buckets[0]}), 0.5, 1e-5);
  EXPECT_LE(reference_norm(buckets), max_norm);
  EXPECT_THROW(bs::optim::clip_bucket_(buckets[0], 1.0, 0), std::invalid_argument);
}

// The tensor-valued clips (norm and factor stay on the device: no host read in an autograd hook) give exactly
// what the host-side clips they replace give: the same norm, bitwise the same gradients in float32, within one
// rounding in bf16; a non-finite norm leaves the gradients untouched in both.
TEST(Clipping, TensorValuedClipsEqualTheHostSideClips) {
  for (double scale : {0.001, 1.0, 50.0}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    for (int64_t n_buckets : {1, 4}) {
      auto host = random_grads(7, scale);
      std::vector<torch::Tensor> dev;
      for (auto& t : host) dev.push_back(t.clone());
      for (size_t i = 0; i < host.size(); ++i) {
        const double host_norm = bs::optim::clip_bucket_(host[i], 1.0, n_buckets);
        const torch::Tensor dev_norm = bs::optim::clip_bucket_tensor_(dev[i], 1.0, n_buckets);
        EXPECT_EQ(dev_norm.dim(), 0);
        EXPECT_EQ(dev_norm.scalar_type(), torch::kDouble);
        EXPECT_DOUBLE_EQ(dev_norm.item<double>(), host_norm);
        EXPECT_TRUE(torch::equal(dev[i], host[i])) << "bucket " << i << " of " << n_buckets;
      }
    }
    auto host = random_grads(8, scale);
    std::vector<torch::Tensor> dev;
    for (auto& t : host) dev.push_back(t.clone());
    const double host_norm = bs::optim::clip_global_norm_(host, 2.0);
    EXPECT_DOUBLE_EQ(bs::optim::clip_global_norm_tensor_(dev, 2.0).item<double>(), host_norm);
    for (size_t i = 0; i < host.size(); ++i) EXPECT_TRUE(torch::equal(dev[i], host[i])) << "tensor " << i;
    EXPECT_DOUBLE_EQ(bs::optim::global_norm_tensor(dev).item<double>(), bs::optim::global_norm(dev));
  }
  // bf16 buckets: the factor is rounded to bf16 before the multiply, the host's is not: one rounding apart.
  auto b_host = (torch::randn({300}) * 5).to(torch::kBFloat16);
  auto b_dev = b_host.clone();
  bs::optim::clip_bucket_(b_host, 1.0, 2);
  bs::optim::clip_bucket_tensor_(b_dev, 1.0, 2);
  EXPECT_TRUE(torch::allclose(b_dev.to(torch::kFloat), b_host.to(torch::kFloat), 1e-2, 0));
  // Non-finite: untouched, the norm says so.
  auto bad = torch::randn({10});
  bad[3] = std::nan("");
  auto bad_before = bad.clone();
  EXPECT_TRUE(std::isnan(bs::optim::clip_bucket_tensor_(bad, 1.0, 1).item<double>()));
  EXPECT_TRUE(torch::equal(bad.nan_to_num(0), bad_before.nan_to_num(0)));
  EXPECT_EQ(bs::optim::global_norm_tensor({}).item<double>(), 0.0);
}

}  // namespace
