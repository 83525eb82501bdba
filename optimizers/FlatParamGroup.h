// A group of parameters whose data and gradients live in two contiguous 1-D buffers, so that an optimizer
// updates the whole group with a few vectorised tensor ops instead of a loop of small ops per parameter.
#pragma once
#include <string>
#include <vector>

#include <torch/torch.h>

namespace bs::optim {

class FlatParamGroup {
 public:
  // Copies each parameter into the flat buffer and re-points it there (param.set_data(view): the same
  // Variable, so modules holding it see the change and requires_grad is kept); .grad() becomes a view of the
  // flat gradient buffer. With several parameters each one starts at a multiple of `chunk` elements (zero
  // padding), so per-parameter norms reduce over fixed-size rows of a [chunks, chunk] view.
  FlatParamGroup(std::vector<std::string> names, std::vector<torch::Tensor> params, bool decay, int64_t chunk = 512);

  const torch::Tensor& params() const { return flat_params_; }  // 1-D, length numel()
  const torch::Tensor& grads() const { return flat_grads_; }
  bool decay() const { return decay_; }
  int64_t num_params() const { return static_cast<int64_t>(tensors_.size()); }
  int64_t numel() const { return flat_params_.numel(); }  // including padding
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<torch::Tensor>& tensors() const { return tensors_; }
  const std::vector<int64_t>& offsets() const { return offsets_; }

  // Per-parameter L2 norms of a buffer laid out like params(): float64, shape [num_params].
  torch::Tensor segment_norms(const torch::Tensor& flat) const;
  // Multiplies each parameter's slice of `flat` by its entry of `per_param` (shape [num_params]) in place.
  void scale_segments_(torch::Tensor& flat, const torch::Tensor& per_param) const;
  // The same in pieces: row_scales() expands per-parameter factors to rows once, scale_block_() applies them to
  // the block [start, start + block.numel()) of a flat buffer (start and length multiples of block_align()).
  torch::Tensor row_scales(const torch::Tensor& per_param, torch::ScalarType dtype) const;
  void scale_block_(torch::Tensor block, const torch::Tensor& row_scales, int64_t start) const;
  int64_t block_align() const { return chunk_; }

  // Re-points any parameter whose data or .grad() someone replaced (e.g. Module::zero_grad(set_to_none),
  // or .to()), copying its current values into the flat buffers first. Cheap when nothing changed.
  void reattach();
  void zero_grad();

 private:
  std::vector<std::string> names_;
  std::vector<torch::Tensor> tensors_;      // the caller's parameters (shared Variables)
  std::vector<torch::Tensor> param_views_;  // their slices of flat_params_, shaped like them
  std::vector<torch::Tensor> grad_views_;
  std::vector<int64_t> offsets_;
  bool decay_;
  int64_t chunk_ = 1;  // row length of the [chunks, chunk] view; 1 = single parameter
  torch::Tensor flat_params_, flat_grads_;
  torch::Tensor chunk_owner_;  // int64 [chunks]: index of the parameter each row belongs to
};

}  // namespace bs::optim
