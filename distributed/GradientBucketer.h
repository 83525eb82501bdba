// Gradient buckets all-reduced during backward, with the paper's clipping modes.
// Parameters are grouped into buckets of about clip.bucket_mb in reverse registration order (about the order
// in which backward produces their gradients). A post-hook on each parameter's grad accumulator marks its
// gradient ready; when every gradient of a bucket is ready (and all earlier buckets were launched, so ranks
// issue collectives in the same order) the bucket's gradients are copied into its flat buffer, optionally
// clipped, and its average over ranks starts at once, overlapping with the rest of backward. finish() waits
// for all buckets and copies the averages back into the .grad() tensors (which it never replaces: they may
// be views into an optimizer's flat buffer).
//
// Layout: given the optimizer's flat gradient buffers (every .grad() a view into one of them) and a reduce
// dtype equal to theirs, each bucket IS a contiguous range of a flat buffer: no gather/scatter copies. Else
// each bucket has its own buffer in the reduce dtype (bf16 allreduce of fp32 gradients) filled by copies.
//
// No host synchronisation in the step: bucket norms and clip factors are 0-dim tensors on the gradients'
// device, and on a GPU waiting for a bucket makes the compute stream wait. step_stats() reads the norm and
// the timings to the host: call it once per step, where the step's statistics are exchanged anyway.
//
// Clip modes (clip.mode):
//   none                     average only
//   global_after_allreduce   after all buckets are averaged: clip the global norm to max_norm (classic)
//   bucket_before_allreduce  in the bucket-ready path: clip the local bucket to max_norm/sqrt(n_buckets)
//   local_before_allreduce   after backward: clip the whole local gradient to max_norm, then average all
//                            buckets (no overlap: the baseline)
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/Choices.h"
#include "common/TrainConfig.h"
#include "distributed/Communicator.h"

namespace bs {

struct BucketStats {
  double comm_seconds = 0;     // time with at least one bucket's allreduce in flight (started -> done)
  double exposed_seconds = 0;  // time finish() waited for communication (not hidden behind backward)
  double overlap = 0;          // 1 - exposed / comm (0 when nothing was communicated)
  double grad_norm = 0;        // pre-clip norm: of the averaged gradient (none, global_after_allreduce);
                               // of this rank's local gradient (bucket_before_, local_before_allreduce)
  double loss = 0;             // the `loss` given to step_stats()
  int64_t buckets = 0;
  int64_t launched_in_backward = 0;  // buckets whose allreduce started from an autograd hook
};

class GradientBucketer {
 public:
  // `params`: the model's parameters in registration order (those without requires_grad are skipped).
  // `reduce_dtype`: the dtype of the bucket buffers (what is all-reduced and bucket-clipped); by default
  // the gradients' own. Gradients are cast into the buckets and back (fp32 grads, bf16 allreduce).
  // `flat_grads`: the optimizer's grad_buffers(); when every gradient is a view into them and the reduce
  // dtype is theirs, buckets are ranges of these buffers (see above).
  GradientBucketer(const std::vector<torch::Tensor>& params, Communicator& comm, const ClipConfig& clip,
                   std::optional<torch::ScalarType> reduce_dtype = std::nullopt,
                   const std::vector<torch::Tensor>& flat_grads = {});
  ~GradientBucketer();
  GradientBucketer(const GradientBucketer&) = delete;
  GradientBucketer& operator=(const GradientBucketer&) = delete;

  // Before each micro-batch's backward: only the last micro-batch of a step communicates.
  void begin_micro(bool last);
  // After the last backward: launches what is left, waits (on a GPU: the stream waits), copies back, clips
  // (per mode). Never reads a value to the host.
  void finish();
  // The last step's statistics: reads the norm (and `loss`, a 0-dim tensor of the step, into
  // BucketStats::loss) and the communication times to the host: one synchronisation.
  BucketStats step_stats(const torch::Tensor& loss = {});

  int64_t num_buckets() const { return int64_t(buckets_.size()); }
  // Buckets are ranges of the flat gradient buffers (no copies).
  bool buckets_are_views() const { return views_; }
  // Parameter indices (into `params`) of each bucket, in bucket order.
  std::vector<std::vector<int64_t>> bucket_params() const;
  // When each bucket of the last step was handed to the communicator (for measurements and tests).
  const std::vector<Clock::time_point>& launch_times() const { return launch_times_; }

 private:
  struct Bucket {
    std::vector<int64_t> params;   // indices into params_
    std::vector<int64_t> offsets;  // element offset of each param in `buffer`
    torch::Tensor buffer;          // flat: reduce dtype, the params' device (a view of a flat grad buffer
                                   // when views_)
    int64_t pending = 0;           // gradients not yet ready this step
    bool launched = false;
    std::shared_ptr<CommWork> work;
    torch::Tensor local_norm;  // bucket_before_allreduce: 0-dim norm before the clip
  };

  void build_copy_buckets(std::optional<torch::ScalarType> reduce_dtype);
  bool build_view_buckets(const std::vector<torch::Tensor>& flat_grads);

  void on_grad_ready(int64_t param);
  void launch_ready_buckets(bool from_hook);
  void launch(Bucket& b, bool from_hook);
  void gather(Bucket& b);
  void scatter(Bucket& b);
  bool uses_buffers() const;
  std::vector<torch::Tensor> grads() const;

  std::vector<torch::Tensor> params_;
  Communicator& comm_;
  ClipConfig clip_;
  ClipMode mode_;  // clip_.mode, parsed
  std::vector<Bucket> buckets_;
  std::vector<int64_t> bucket_of_;                                    // param -> bucket
  std::vector<char> seen_;                                            // param's gradient already counted this step
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive: hooks live on them
  std::vector<uintptr_t> hook_keys_;
  std::mutex mutex_;    // hooks may run on autograd's device threads
  bool armed_ = false;  // this backward belongs to the last micro-batch
  bool views_ = false;
  bool finished_ = false;                    // finish() ran for this step; step_stats() may read
  torch::Tensor step_norm_;                  // 0-dim float64: this step's pre-clip norm (see BucketStats)
  std::shared_ptr<CommWork> backward_done_;  // the compute stream reached finish()
  size_t next_launch_ = 0;
  int64_t launched_in_backward_ = 0;
  std::vector<Clock::time_point> launch_times_;
};

}  // namespace bs
