#include "trainer/MixedPrecision.h"

#include <stdexcept>
#include <string>

namespace bs {

ComputeCopy::ComputeCopy(BertForPretraining& master, const optim::Optimizer& optimizer, torch::ScalarType dtype)
    : copy_(master->config()), master_flat_(optimizer.param_buffers()) {
  torch::NoGradGuard no_grad;
  if (!master_flat_.empty()) copy_->to(master_flat_.front().device());  // buffers (e.g. position ids) too
  for (const auto& m : master_flat_) compute_flat_.push_back(torch::zeros_like(m, m.options().dtype(dtype)));
  const auto masters = master->named_parameters();
  const auto copies = copy_->named_parameters();
  if (masters.size() != copies.size()) throw std::logic_error("ComputeCopy: the copy has other parameters");
  for (size_t i = 0; i < masters.size(); ++i) {
    const torch::Tensor& p = masters[i].value();
    torch::Tensor q = copies[i].value();
    if (!p.requires_grad()) {  // frozen: not in the flat buffers, cast on every refresh
      q.set_requires_grad(false);
      q.set_data(p.detach().to(dtype));
      frozen_.emplace_back(p, q);
      continue;
    }
    size_t k = 0;
    while (k < master_flat_.size() && !p.is_alias_of(master_flat_[k])) ++k;
    if (k == master_flat_.size() || !p.grad().defined())
      throw std::logic_error("ComputeCopy: parameter " + masters[i].key() +
                             " is not a view of the optimizer's flat buffers");
    const int64_t offset = p.storage_offset() - master_flat_[k].storage_offset();
    q.set_data(compute_flat_[k].narrow(0, offset, p.numel()).view(p.sizes()));
    // fp32 gradient of a bf16 parameter: autograd's AccumulateGrad adds the bf16 gradient in place.
    q.mutable_grad() = p.grad();
  }
  refresh();
}

void ComputeCopy::refresh() {
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < master_flat_.size(); ++k) compute_flat_[k].copy_(master_flat_[k]);
  for (auto& [master, copy] : frozen_) copy.copy_(master);
}

int64_t ComputeCopy::bytes() const {
  int64_t n = 0;
  for (const auto& t : compute_flat_) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

}  // namespace bs
