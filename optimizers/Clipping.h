// Gradient clipping: global-norm clipping (after allreduce) and the per-bucket clip applied to each local
// gradient bucket before its allreduce (bucket_before_allreduce: no wait for a global norm, so overlap stays).
#pragma once
#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace bs::optim {

// L2 norm over all tensors (float64 accumulation). Undefined tensors count as zero.
double global_norm(const std::vector<torch::Tensor>& grads);
// Scales grads in place so that their global norm is <= max_norm (up to bf16/fp16 rounding); returns the norm
// before clipping.
// A non-finite norm leaves the grads untouched (the caller decides to skip the step).
double clip_global_norm_(const std::vector<torch::Tensor>& grads, double max_norm);
// Bucket-wise clip: scales `bucket` in place to norm <= max_norm / sqrt(n_buckets); returns its norm before.
// With every bucket clipped so, the whole gradient's norm is <= max_norm.
double clip_bucket_(torch::Tensor bucket, double max_norm, int64_t n_buckets);

// The same clips with the norm and the factor kept as 0-dim float64 tensors on the gradients' device: no
// host synchronisation, so a GPU stream never stalls in an autograd hook. A non-finite norm gives factor 1
// (grads untouched), as above. Each returns the norm before clipping; read it once per step.
torch::Tensor global_norm_tensor(const std::vector<torch::Tensor>& grads);
torch::Tensor clip_global_norm_tensor_(const std::vector<torch::Tensor>& grads, double max_norm);
torch::Tensor clip_bucket_tensor_(torch::Tensor bucket, double max_norm, int64_t n_buckets);

}  // namespace bs::optim
