#include "distributed/GradientBucketer.h"

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

GradientBucketer::GradientBucketer(const std::vector<torch::Tensor>& params, Communicator& comm, const ClipConfig& clip,
                                   std::optional<torch::ScalarType> reduce_dtype,
                                   const std::vector<torch::Tensor>& flat_grads)
    : comm_(comm), clip_(clip), mode_(parse_choice<ClipMode>(clip.mode)) {
  if (clip.bucket_mb <= 0) throw ConfigError("clip.bucket_mb must be > 0");
  // Tied weights appear once.
  for (const auto& p : params) {
    if (!p.requires_grad()) continue;
    bool dup = false;
    for (const auto& q : params_) dup = dup || q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl();
    if (!dup) params_.push_back(p);
  }
  bucket_of_.assign(params_.size(), -1);
  const bool same_dtype = !flat_grads.empty() && (!reduce_dtype || *reduce_dtype == flat_grads.front().scalar_type());
  views_ = same_dtype && build_view_buckets(flat_grads);
  if (!views_) build_copy_buckets(reduce_dtype);
  seen_.assign(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    if (!acc) throw std::invalid_argument("GradientBucketer: parameter " + std::to_string(i) + " is not a leaf");
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>([this, i] { on_grad_ready(int64_t(i)); })));
    accumulators_.push_back(std::move(acc));
  }
}

// Buckets of about bucket_mb in reverse registration order, each with its own buffer.
void GradientBucketer::build_copy_buckets(std::optional<torch::ScalarType> reduce_dtype) {
  const double cap_bytes = clip_.bucket_mb * 1024.0 * 1024.0;
  for (int64_t i = int64_t(params_.size()) - 1; i >= 0; --i) {
    const auto& p = params_[i];
    bool fresh = buckets_.empty();
    if (!fresh) {
      const auto& first = params_[buckets_.back().params.front()];
      const int64_t used = buckets_.back().offsets.back() + params_[buckets_.back().params.back()].numel();
      const int64_t elem = reduce_dtype ? int64_t(c10::elementSize(*reduce_dtype)) : int64_t(first.element_size());
      fresh = double(used * elem) >= cap_bytes || first.dtype() != p.dtype() || first.device() != p.device();
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
}

// Buckets as ranges of the flat gradient buffers, when every gradient is a contiguous view into one of them.
// Within a buffer, parameters are laid out in registration order: walking it from the end gives buckets in
// about the order backward completes them. Buckets of all buffers are then ordered by their earliest
// registered parameter, latest first (the last gradient a bucket waits for).
bool GradientBucketer::build_view_buckets(const std::vector<torch::Tensor>& flat_grads) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> in_flat(flat_grads.size());  // (offset, param)
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& g = params_[i].grad();
    if (!g.defined() || !g.is_contiguous()) return false;
    size_t k = 0;
    while (k < flat_grads.size() && !g.is_alias_of(flat_grads[k])) ++k;
    if (k == flat_grads.size() || flat_grads[k].dim() != 1 || g.scalar_type() != flat_grads[k].scalar_type())
      return false;
    const int64_t off = g.storage_offset() - flat_grads[k].storage_offset();
    if (off < 0 || off + g.numel() > flat_grads[k].numel()) return false;
    in_flat[k].emplace_back(off, int64_t(i));
  }
  const double cap_bytes = clip_.bucket_mb * 1024.0 * 1024.0;
  std::vector<Bucket> made;
  for (size_t k = 0; k < flat_grads.size(); ++k) {
    auto& entries = in_flat[k];
    std::sort(entries.begin(), entries.end());
    const int64_t elem = int64_t(flat_grads[k].element_size());
    int64_t hi = flat_grads[k].numel();  // this bucket's end (exclusive): the previous bucket's start
    Bucket b;
    for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
      b.params.push_back(it->second);
      const bool last = std::next(it) == entries.rend();
      const int64_t lo = last ? 0 : it->first;  // the lowest bucket also takes any leading padding
      if (last || double((hi - lo) * elem) >= cap_bytes) {
        b.buffer = flat_grads[k].narrow(0, lo, hi - lo);
        made.push_back(std::move(b));
        b = Bucket{};
        hi = lo;
      }
    }
  }
  auto earliest = [](const Bucket& b) { return *std::min_element(b.params.begin(), b.params.end()); };
  std::stable_sort(made.begin(), made.end(),
                   [&](const Bucket& a, const Bucket& b) { return earliest(a) > earliest(b); });
  buckets_ = std::move(made);
  for (size_t j = 0; j < buckets_.size(); ++j)
    for (int64_t i : buckets_[j].params) bucket_of_[i] = int64_t(j);
  return true;
}

GradientBucketer::~GradientBucketer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  // Pending works hold only the bucket buffers' storage; waiting keeps MPI from writing freed memory.
  for (auto& b : buckets_)
    if (b.work) try {
        b.work->wait();
      } catch (...) {
      }
}

std::vector<std::vector<int64_t>> GradientBucketer::bucket_params() const {
  std::vector<std::vector<int64_t>> out;
  for (const auto& b : buckets_) out.push_back(b.params);
  return out;
}

bool GradientBucketer::uses_buffers() const { return comm_.world() > 1 || mode_ == ClipMode::kBucketBeforeAllreduce; }

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
    b.local_norm = torch::Tensor();
  }
  finished_ = false;
  step_norm_ = torch::Tensor();
  backward_done_.reset();
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
  if (mode_ != ClipMode::kLocalBeforeAllreduce) launch_ready_buckets(true);
}

void GradientBucketer::launch_ready_buckets(bool from_hook) {
  // In bucket order only: every rank must issue the same collectives in the same order.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0)
    launch(buckets_[next_launch_++], from_hook);
}

void GradientBucketer::gather(Bucket& b) {
  if (views_) return;  // the gradients are already in place
  for (size_t j = 0; j < b.params.size(); ++j) {
    const auto& p = params_[b.params[j]];
    auto slice = b.buffer.narrow(0, b.offsets[j], p.numel());
    const auto& g = p.grad();
    if (g.defined()) slice.copy_(g.reshape(-1));
    else
      slice.zero_();  // a parameter this step did not use
  }
}

void GradientBucketer::scatter(Bucket& b) {
  if (views_) return;
  for (size_t j = 0; j < b.params.size(); ++j) {
    auto p = params_[b.params[j]];
    auto slice = b.buffer.narrow(0, b.offsets[j], p.numel()).view(p.sizes());
    if (p.grad().defined()) p.mutable_grad().copy_(slice);  // in place: .grad() may be a view of a flat buffer
    else
      p.mutable_grad() = slice.clone();
  }
}

void GradientBucketer::launch(Bucket& b, bool from_hook) {
  torch::NoGradGuard no_grad;
  b.launched = true;
  launch_times_[&b - buckets_.data()] = Clock::now();
  if (from_hook) ++launched_in_backward_;
  if (!uses_buffers()) return;
  gather(b);
  if (mode_ == ClipMode::kBucketBeforeAllreduce)
    b.local_norm = optim::clip_bucket_tensor_(b.buffer, clip_.max_norm, num_buckets());
  if (comm_.world() > 1) b.work = comm_.allreduce_async(b.buffer, ReduceOp::kAvg);
}

void GradientBucketer::finish() {
  torch::NoGradGuard no_grad;
  // Backward has been queued; on a GPU the stream reaches this point later than the host. Communication still
  // running after it (including what finish() itself launches) is exposed.
  backward_done_ = comm_.mark();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
    if (launch_times_.size() != buckets_.size()) launch_times_.assign(buckets_.size(), Clock::time_point{});
    if (mode_ == ClipMode::kLocalBeforeAllreduce) {
      // The whole local gradient first: its norm needs every bucket, so nothing could start earlier.
      if (uses_buffers()) {
        std::vector<torch::Tensor> bufs;
        for (auto& b : buckets_) {
          gather(b);
          bufs.push_back(b.buffer);
        }
        step_norm_ = optim::clip_global_norm_tensor_(bufs, clip_.max_norm);
      } else {
        step_norm_ = optim::clip_global_norm_tensor_(grads(), clip_.max_norm);
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
  }
  for (auto& b : buckets_)
    if (b.work) b.work->wait();
  if (uses_buffers())
    for (auto& b : buckets_) scatter(b);

  // With view buckets the flat buffers are the gradients: a few large kernels instead of one per parameter.
  std::vector<torch::Tensor> all_grads;
  if (views_)
    for (const auto& b : buckets_) all_grads.push_back(b.buffer);
  else
    all_grads = grads();
  if (mode_ == ClipMode::kGlobalAfterAllreduce) {
    step_norm_ = optim::clip_global_norm_tensor_(all_grads, clip_.max_norm);
  } else if (mode_ == ClipMode::kBucketBeforeAllreduce) {
    std::vector<torch::Tensor> sq;
    for (const auto& b : buckets_)
      if (b.local_norm.defined()) sq.push_back(b.local_norm.square());
    step_norm_ = sq.empty() ? optim::global_norm_tensor({}) : torch::stack(sq).sum().sqrt();
  } else if (mode_ == ClipMode::kNone) {
    step_norm_ = optim::global_norm_tensor(all_grads);
  }
  finished_ = true;
}

BucketStats GradientBucketer::step_stats(const torch::Tensor& loss) {
  if (!finished_) throw std::logic_error("GradientBucketer::step_stats before finish()");
  BucketStats st;
  st.buckets = num_buckets();
  st.launched_in_backward = launched_in_backward_;
  {  // the one host read: norm and loss together
    auto norm = step_norm_.defined() ? step_norm_ : optim::global_norm_tensor({});
    auto l = loss.defined() ? loss.to(norm.device(), torch::kDouble).reshape({}) : torch::zeros_like(norm);
    auto host = torch::stack({norm, l}).cpu();
    st.grad_norm = host[0].item<double>();
    st.loss = host[1].item<double>();
  }
  // Communication still running after backward ended was exposed: the step waited for it.
  Clock::time_point backward_end =
      backward_done_ ? (backward_done_->wait(), backward_done_->finished_at()) : Clock::now();
  Clock::time_point last_done = backward_end;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> spans;
  for (auto& b : buckets_)
    if (b.work) {
      b.work->wait();
      spans.emplace_back(b.work->started_at(), b.work->finished_at());
      last_done = std::max(last_done, b.work->finished_at());
    }
  st.comm_seconds = union_seconds(spans);
  st.exposed_seconds = seconds(last_done - backward_end);
  st.overlap = st.comm_seconds > 0 ? std::clamp(1.0 - st.exposed_seconds / st.comm_seconds, 0.0, 1.0) : 0.0;
  for (auto& b : buckets_) b.work.reset();
  return st;
}

}  // namespace bs
