#include "trainer/GradientBucketer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "optimizers/Clipping.h"

namespace bs {
namespace {

// Runs after AccumulateGrad has added this backward's gradient into param.grad().
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Length of the union of [start, end) intervals.
double union_seconds(std::vector<std::pair<Clock::time_point, Clock::time_point>> spans) {
  std::sort(spans.begin(), spans.end());
  double total = 0;
  Clock::time_point cur_start{}, cur_end{};
  bool open = false;
  for (const auto& [s, e] : spans) {
    if (!open || s > cur_end) {
      if (open) total += seconds(cur_end - cur_start);
      cur_start = s;
      cur_end = e;
      open = true;
    } else {
      cur_end = std::max(cur_end, e);
    }
  }
  if (open) total += seconds(cur_end - cur_start);
  return total;
}

}  // namespace

GradientBucketer::GradientBucketer(const std::vector<torch::Tensor>& params, Communicator& comm,
                                   const ClipConfig& clip, std::optional<torch::ScalarType> reduce_dtype)
    : comm_(comm), clip_(clip) {
  static const std::vector<std::string> modes = {"none", "global_after_allreduce", "bucket_before_allreduce",
                                                 "local_before_allreduce"};
  if (std::find(modes.begin(), modes.end(), clip.mode) == modes.end())
    throw ConfigError("clip.mode: unknown mode '" + clip.mode +
                      "'; use none, global_after_allreduce, bucket_before_allreduce or local_before_allreduce");
  if (clip.bucket_mb <= 0) throw ConfigError("clip.bucket_mb must be > 0");
  // Tied weights appear once.
  for (const auto& p : params) {
    if (!p.requires_grad()) continue;
    bool dup = false;
    for (const auto& q : params_) dup = dup || q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl();
    if (!dup) params_.push_back(p);
  }
  const double cap_bytes = clip.bucket_mb * 1024.0 * 1024.0;
  bucket_of_.assign(params_.size(), -1);
  for (int64_t i = int64_t(params_.size()) - 1; i >= 0; --i) {
    const auto& p = params_[i];
    bool fresh = buckets_.empty();
    if (!fresh) {
      const auto& first = params_[buckets_.back().params.front()];
      const int64_t used = buckets_.back().offsets.back() + params_[buckets_.back().params.back()].numel();
      const int64_t elem = reduce_dtype ? int64_t(c10::elementSize(*reduce_dtype)) : int64_t(first.element_size());
      fresh = double(used * elem) >= cap_bytes || first.dtype() != p.dtype() ||
              first.device() != p.device();
    }
    if (fresh) buckets_.emplace_back();
    Bucket& b = buckets_.back();
    b.offsets.push_back(b.params.empty() ? 0 : b.offsets.back() + params_[b.params.back()].numel());
    b.params.push_back(i);
    bucket_of_[i] = int64_t(buckets_.size()) - 1;
  }
  for (auto& b : buckets_) {
    const auto& first = params_[b.params.front()];
    auto options = first.options().requires_grad(false);
    if (reduce_dtype) options = options.dtype(*reduce_dtype);
    b.buffer = torch::zeros({b.offsets.back() + params_[b.params.back()].numel()}, options);
  }
  seen_.assign(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    if (!acc) throw std::invalid_argument("GradientBucketer: parameter " + std::to_string(i) + " is not a leaf");
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>([this, i] { on_grad_ready(int64_t(i)); })));
    accumulators_.push_back(std::move(acc));
  }
}

GradientBucketer::~GradientBucketer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  // Pending works hold only the bucket buffers' storage; waiting keeps MPI from writing freed memory.
  for (auto& b : buckets_)
    if (b.work) try { b.work->wait(); } catch (...) {}
}

std::vector<std::vector<int64_t>> GradientBucketer::bucket_params() const {
  std::vector<std::vector<int64_t>> out;
  for (const auto& b : buckets_) out.push_back(b.params);
  return out;
}

bool GradientBucketer::uses_buffers() const {
  return comm_.world() > 1 || clip_.mode == "bucket_before_allreduce";
}

std::vector<torch::Tensor> GradientBucketer::grads() const {
  std::vector<torch::Tensor> g;
  for (const auto& p : params_) g.push_back(p.grad());
  return g;
}

void GradientBucketer::begin_micro(bool last) {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = last;
  if (!last) return;
  for (auto& b : buckets_) {
    b.pending = int64_t(b.params.size());
    b.launched = false;
    b.work.reset();
    b.local_norm = 0;
  }
  std::fill(seen_.begin(), seen_.end(), 0);
  next_launch_ = 0;
  launched_in_backward_ = 0;
  launch_times_.assign(buckets_.size(), Clock::time_point{});
}

void GradientBucketer::on_grad_ready(int64_t param) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_ || seen_[param]) return;
  seen_[param] = 1;
  --buckets_[bucket_of_[param]].pending;
  if (clip_.mode != "local_before_allreduce") launch_ready_buckets(true);
}

void GradientBucketer::launch_ready_buckets(bool from_hook) {
  // In bucket order only: every rank must issue the same collectives in the same order.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0)
    launch(buckets_[next_launch_++], from_hook);
}

void GradientBucketer::gather(Bucket& b) {
  for (size_t j = 0; j < b.params.size(); ++j) {
    const auto& p = params_[b.params[j]];
    auto slice = b.buffer.narrow(0, b.offsets[j], p.numel());
    const auto& g = p.grad();
    if (g.defined()) slice.copy_(g.reshape(-1));
    else slice.zero_();  // a parameter this step did not use
  }
}

void GradientBucketer::scatter(Bucket& b) {
  for (size_t j = 0; j < b.params.size(); ++j) {
    auto p = params_[b.params[j]];
    auto slice = b.buffer.narrow(0, b.offsets[j], p.numel()).view(p.sizes());
    if (p.grad().defined()) p.mutable_grad().copy_(slice);  // in place: .grad() may be a view of a flat buffer
    else p.mutable_grad() = slice.clone();
  }
}

void GradientBucketer::launch(Bucket& b, bool from_hook) {
  torch::NoGradGuard no_grad;
  b.launched = true;
  launch_times_[&b - buckets_.data()] = Clock::now();
  if (from_hook) ++launched_in_backward_;
  if (!uses_buffers()) return;
  gather(b);
  if (clip_.mode == "bucket_before_allreduce")
    b.local_norm = optim::clip_bucket_(b.buffer, clip_.max_norm, num_buckets());
  if (comm_.world() > 1) b.work = comm_.allreduce_async(b.buffer, ReduceOp::kAvg);
}

BucketStats GradientBucketer::finish() {
  torch::NoGradGuard no_grad;
  BucketStats st;
  st.buckets = num_buckets();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
    if (launch_times_.size() != buckets_.size()) launch_times_.assign(buckets_.size(), Clock::time_point{});
    if (clip_.mode == "local_before_allreduce") {
      // The whole local gradient first: its norm needs every bucket, so nothing could start earlier.
      if (uses_buffers()) {
        std::vector<torch::Tensor> bufs;
        for (auto& b : buckets_) {
          gather(b);
          bufs.push_back(b.buffer);
        }
        st.grad_norm = optim::clip_global_norm_(bufs, clip_.max_norm);
      } else {
        st.grad_norm = optim::clip_global_norm_(grads(), clip_.max_norm);
      }
      for (auto& b : buckets_) {
        b.pending = 0;
        b.launched = true;
        launch_times_[&b - buckets_.data()] = Clock::now();
        if (comm_.world() > 1) b.work = comm_.allreduce_async(b.buffer, ReduceOp::kAvg);
      }
      next_launch_ = buckets_.size();
    } else {
      for (auto& b : buckets_) b.pending = 0;  // unused parameters: their buckets go now
      launch_ready_buckets(false);
    }
    st.launched_in_backward = launched_in_backward_;
  }
  const auto wait_start = Clock::now();
  for (auto& b : buckets_)
    if (b.work) b.work->wait();
  st.exposed_seconds = seconds(Clock::now() - wait_start);
  std::vector<std::pair<Clock::time_point, Clock::time_point>> spans;
  for (auto& b : buckets_)
    if (b.work) spans.emplace_back(b.work->started_at(), b.work->finished_at());
  st.comm_seconds = union_seconds(spans);
  st.overlap = st.comm_seconds > 0 ? std::clamp(1.0 - st.exposed_seconds / st.comm_seconds, 0.0, 1.0) : 0.0;
  if (uses_buffers())
    for (auto& b : buckets_) scatter(b);
  for (auto& b : buckets_) b.work.reset();

  if (clip_.mode == "global_after_allreduce") {
    st.grad_norm = optim::clip_global_norm_(grads(), clip_.max_norm);
  } else if (clip_.mode == "bucket_before_allreduce") {
    double sq = 0;
    for (const auto& b : buckets_) sq += b.local_norm * b.local_norm;
    st.grad_norm = std::sqrt(sq);
  } else if (clip_.mode == "none") {
    st.grad_norm = optim::global_norm(grads());
  }
  return st;
}

}  // namespace bs
