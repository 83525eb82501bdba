#include "optimizers/FlatParamGroup.h"

#include <stdexcept>

namespace bs::optim {

namespace {
int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
}  // namespace

FlatParamGroup::FlatParamGroup(std::vector<std::string> names, std::vector<torch::Tensor> params, bool decay,
                               int64_t chunk)
    : names_(std::move(names)), tensors_(std::move(params)), decay_(decay) {
  if (tensors_.empty()) throw std::invalid_argument("FlatParamGroup: a group needs at least one parameter");
  if (names_.size() != tensors_.size()) throw std::invalid_argument("FlatParamGroup: one name per parameter");
  if (chunk < 1) throw std::invalid_argument("FlatParamGroup: chunk must be >= 1");
  const auto options = tensors_.front().options().requires_grad(false);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const auto& p = tensors_[i];
    if (!p.is_floating_point() || p.scalar_type() != options.dtype().toScalarType() || p.device() != options.device())
      throw std::invalid_argument("FlatParamGroup: parameter '" + names_[i] +
                                  "' differs in dtype/device from the rest of its group (or is not floating point)");
  }
  // A lone parameter needs no padding and its norms are plain norms.
  chunk_ = tensors_.size() == 1 ? 1 : chunk;

  int64_t total = 0;
  std::vector<int64_t> owner;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    offsets_.push_back(total);
    const int64_t padded = round_up(tensors_[i].numel(), chunk_);
    if (chunk_ > 1) owner.insert(owner.end(), padded / chunk_, static_cast<int64_t>(i));
    total += padded;
  }
  torch::NoGradGuard no_grad;
  flat_params_ = torch::zeros({total}, options);
  flat_grads_ = torch::zeros({total}, options);
  if (chunk_ > 1) chunk_owner_ = torch::tensor(owner, torch::dtype(torch::kLong)).to(options.device());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    auto& p = tensors_[i];
    param_views_.push_back(flat_params_.narrow(0, offsets_[i], p.numel()).view(p.sizes()));
    grad_views_.push_back(flat_grads_.narrow(0, offsets_[i], p.numel()).view(p.sizes()));
    param_views_[i].copy_(p.detach());
    if (p.grad().defined()) grad_views_[i].copy_(p.grad());
    p.set_data(param_views_[i]);
    p.mutable_grad() = grad_views_[i];
  }
}

torch::Tensor FlatParamGroup::segment_norms(const torch::Tensor& flat) const {
  if (chunk_ == 1) return flat.norm().to(torch::kDouble).reshape({1});
  // Rows never straddle two parameters (padding is zero), so row norms combine into parameter norms.
  auto row_sq = flat.view({-1, chunk_}).norm(2, {1}).to(torch::kDouble).square_();
  auto sums = torch::zeros({num_params()}, row_sq.options());
  return sums.index_add_(0, chunk_owner_, row_sq).sqrt_();
}

void FlatParamGroup::scale_segments_(torch::Tensor& flat, const torch::Tensor& per_param) const {
  if (chunk_ == 1) {
    flat.mul_(per_param.to(flat.dtype()).reshape({}));
    return;
  }
  auto row_scale = per_param.index_select(0, chunk_owner_).to(flat.dtype());
  flat.view({-1, chunk_}).mul_(row_scale.unsqueeze(1));
}

torch::Tensor FlatParamGroup::row_scales(const torch::Tensor& per_param, torch::ScalarType dtype) const {
  if (chunk_ == 1) return per_param.to(dtype).reshape({});
  return per_param.index_select(0, chunk_owner_).to(dtype);
}

void FlatParamGroup::scale_block_(torch::Tensor block, const torch::Tensor& row_scales, int64_t start) const {
  if (chunk_ == 1) {
    block.mul_(row_scales);
    return;
  }
  block.view({-1, chunk_}).mul_(row_scales.narrow(0, start / chunk_, block.numel() / chunk_).unsqueeze(1));
}

void FlatParamGroup::reattach() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    auto& p = tensors_[i];
    if (p.data_ptr() != param_views_[i].data_ptr() || p.sizes() != param_views_[i].sizes()) {
      if (p.sizes() != param_views_[i].sizes())
        throw std::runtime_error("optimizer: parameter '" + names_[i] +
                                 "' changed shape after the optimizer was built; rebuild the optimizer");
      param_views_[i].copy_(p.detach());
      p.set_data(param_views_[i]);
    }
    const auto g = p.grad();
    if (!g.defined()) {
      grad_views_[i].zero_();
      p.mutable_grad() = grad_views_[i];
    } else if (g.data_ptr() != grad_views_[i].data_ptr()) {
      grad_views_[i].copy_(g);
      p.mutable_grad() = grad_views_[i];
    }
  }
}

void FlatParamGroup::zero_grad() {
  reattach();
  flat_grads_.zero_();
}

}  // namespace bs::optim
