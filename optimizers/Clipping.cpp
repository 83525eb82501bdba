#include "optimizers/Clipping.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace bs::optim {

namespace {
// As torch.nn.utils.clip_grad_norm_, plus 1e-6 relative headroom so that float32 rounding of the scaled
// values cannot push the clipped norm above max_norm.
double clip_coefficient(double norm, double max_norm) { return max_norm / (norm * (1 + 1e-6) + 1e-6); }

void check_max_norm(double max_norm) {
  if (!(max_norm > 0)) throw std::invalid_argument("clip.max_norm must be > 0, got " + std::to_string(max_norm));
}
}  // namespace

double global_norm(const std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> sq;
  for (const auto& g : grads)
    if (g.defined() && g.numel() > 0) sq.push_back(g.norm().to(torch::kDouble).square().cpu());
  if (sq.empty()) return 0.0;
  return std::sqrt(torch::stack(sq).sum().item<double>());
}

double clip_global_norm_(const std::vector<torch::Tensor>& grads, double max_norm) {
  check_max_norm(max_norm);
  const double norm = global_norm(grads);
  const double coef = clip_coefficient(norm, max_norm);
  if (std::isfinite(norm) && coef < 1.0) {
    torch::NoGradGuard no_grad;
    for (const auto& g : grads)
      if (g.defined()) g.mul_(coef);
  }
  return norm;
}

double clip_bucket_(torch::Tensor bucket, double max_norm, int64_t n_buckets) {
  check_max_norm(max_norm);
  if (n_buckets < 1) throw std::invalid_argument("clip_bucket_: n_buckets must be >= 1");
  const double norm = global_norm({bucket});
  const double coef = clip_coefficient(norm, max_norm / std::sqrt(static_cast<double>(n_buckets)));
  if (std::isfinite(norm) && coef < 1.0) {
    torch::NoGradGuard no_grad;
    bucket.mul_(coef);
  }
  return norm;
}

namespace {
// min(1, coefficient) as a tensor; 1 where the norm is not finite.
torch::Tensor clip_factor(const torch::Tensor& norm, double max_norm) {
  auto coef = max_norm / (norm * (1 + 1e-6) + 1e-6);
  return torch::where(torch::isfinite(norm), coef.clamp_max(1.0), torch::ones_like(coef));
}
}  // namespace

torch::Tensor global_norm_tensor(const std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> sq;
  torch::Device device = torch::kCPU;
  for (const auto& g : grads)
    if (g.defined() && g.numel() > 0) {
      sq.push_back(g.norm().to(torch::kDouble).square());
      device = g.device();
    }
  if (sq.empty()) return torch::zeros({}, torch::dtype(torch::kDouble).device(device));
  return torch::stack(sq).sum().sqrt();
}

torch::Tensor clip_global_norm_tensor_(const std::vector<torch::Tensor>& grads, double max_norm) {
  check_max_norm(max_norm);
  torch::NoGradGuard no_grad;
  auto norm = global_norm_tensor(grads);
  auto factor = clip_factor(norm, max_norm);
  for (const auto& g : grads)
    if (g.defined() && g.numel() > 0) g.mul_(factor.to(g.scalar_type()));
  return norm;
}

torch::Tensor clip_bucket_tensor_(torch::Tensor bucket, double max_norm, int64_t n_buckets) {
  check_max_norm(max_norm);
  if (n_buckets < 1) throw std::invalid_argument("clip_bucket_tensor_: n_buckets must be >= 1");
  torch::NoGradGuard no_grad;
  auto norm = global_norm_tensor({bucket});
  bucket.mul_(clip_factor(norm, max_norm / std::sqrt(static_cast<double>(n_buckets))).to(bucket.scalar_type()));
  return norm;
}

}  // namespace bs::optim
