// The `nccl` backend: GPU tensors reduced by NCCL on a dedicated CUDA stream. Compiled only with
// BERTSWEEP_WITH_NCCL (CMake sets it when LibTorch has CUDA and NCCL is found; CI syntax-checks this file
// against the CUDA toolkit either way).
// The NCCL unique id travels over the MPI bootstrap communicator, which also serves barrier, broadcast and
// allgather (small host data). allreduce_async orders the NCCL stream after the caller's current stream, so
// the gradient is complete before the reduction reads it. wait() never blocks the host: it makes the caller's
// stream wait for the reduction's event. A watchdog thread aborts the NCCL communicator when a reduction is
// not done within distributed.timeout_s (a peer died or hangs), which unblocks the streams; the next call
// then throws DistributedError. Times come from CUDA events, mapped onto the host clock.
#ifdef BERTSWEEP_WITH_NCCL

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "distributed/Communicator.h"

namespace bs {
namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw DistributedError(std::string("nccl: ") + what + " failed: " + ncclGetErrorString(r));
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw DistributedError(std::string("nccl: ") + what + " failed: " + cudaGetErrorString(e));
}

ncclDataType_t nccl_type(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return ncclFloat32;
    case torch::kDouble: return ncclFloat64;
    case torch::kHalf: return ncclFloat16;
    case torch::kBFloat16: return ncclBfloat16;
    case torch::kLong: return ncclInt64;
    case torch::kInt: return ncclInt32;
    case torch::kByte: return ncclUint8;
    default: throw std::invalid_argument(std::string("nccl communicator: unsupported dtype ") + c10::toString(t));
  }
}

// Maps CUDA event times onto the host clock through one reference event recorded at start-up whose host time
// is known. cudaEventElapsedTime is float milliseconds: positions lose precision slowly (about 0.5 ms after an
// hour), durations between a work's own events do not.
class EventClock {
 public:
  explicit EventClock(cudaStream_t stream) {
    check_cuda(cudaEventCreate(&ref_), "cudaEventCreate");
    check_cuda(cudaEventRecord(ref_, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(ref_), "cudaEventSynchronize");
    ref_host_ = Clock::now();
  }
  ~EventClock() { cudaEventDestroy(ref_); }
  static double elapsed_s(cudaEvent_t from, cudaEvent_t to) {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, from, to), "cudaEventElapsedTime");
    return double(ms) / 1000.0;
  }
  // `e` must have completed.
  Clock::time_point to_host(cudaEvent_t e) const {
    return ref_host_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(elapsed_s(ref_, e)));
  }

 private:
  cudaEvent_t ref_ = nullptr;
  Clock::time_point ref_host_;
};

// State shared by the communicator, its works and the watchdog.
struct NcclShared {
  ncclComm_t comm = nullptr;
  double timeout_s = 120;
  std::atomic<bool> aborted{false};
  std::string abort_reason;  // set before `aborted`
  void throw_if_aborted() const {
    if (aborted.load()) throw DistributedError(abort_reason);
  }
};

// One reduction (or a mark on the compute stream): timing events around it on its stream.
class NcclWork : public CommWork {
 public:
  // Events of `device` (the caller holds a guard for it), recorded on `stream` of that device.
  NcclWork(std::shared_ptr<NcclShared> shared, std::shared_ptr<EventClock> clock, int device, cudaStream_t stream)
      : shared_(std::move(shared)), clock_(std::move(clock)), device_(device), enqueued_(Clock::now()) {
    check_cuda(cudaEventCreate(&start_), "cudaEventCreate");
    check_cuda(cudaEventCreate(&end_), "cudaEventCreate");
    check_cuda(cudaEventRecord(start_, stream), "cudaEventRecord");
  }
  ~NcclWork() override {
    cudaEventDestroy(start_);
    cudaEventDestroy(end_);
  }
  void record_end(cudaStream_t stream) { check_cuda(cudaEventRecord(end_, stream), "cudaEventRecord"); }

  // The caller's stream waits; the host does not.
  void wait() override {
    shared_->throw_if_aborted();
    c10::cuda::CUDAGuard guard(device_);
    check_cuda(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(device_).stream(), end_, 0), "cudaStreamWaitEvent");
  }
  bool done() const override {
    shared_->throw_if_aborted();
    if (finished_ != Clock::time_point{}) return true;
    if (!completed()) return false;
    started_ = clock_->to_host(start_);
    finished_ = started_ + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(EventClock::elapsed_s(start_, end_)));
    return true;
  }
  // Only the event query (thread-safe; for the watchdog).
  bool completed() const {
    cudaError_t q = cudaEventQuery(end_);
    if (q == cudaErrorNotReady) return false;
    check_cuda(q, "cudaEventQuery");
    return true;
  }
  // Blocks the host until done (for timings): the watchdog bounds it.
  void sync() const {
    while (!done()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  Clock::time_point enqueued_at() const override { return enqueued_; }
  Clock::time_point started_at() const override {
    sync();
    return started_;
  }
  Clock::time_point finished_at() const override {
    sync();
    return finished_;
  }

 private:
  std::shared_ptr<NcclShared> shared_;
  std::shared_ptr<EventClock> clock_;
  int device_;
  cudaEvent_t start_ = nullptr, end_ = nullptr;
  Clock::time_point enqueued_;
  mutable Clock::time_point started_{}, finished_{};
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> bootstrap, const DistributedConfig& cfg)
      : boot_(std::move(bootstrap)), shared_(std::make_shared<NcclShared>()) {
    shared_->timeout_s = cfg.timeout_s;
    const int devices = c10::cuda::device_count();
    if (devices == 0) throw DistributedError("nccl: no CUDA device visible; use device: cpu");
    LaunchInfo info = detect_launch();
    device_ = info.local_rank % devices;
    c10::cuda::CUDAGuard guard(device_);
    ncclUniqueId id;
    if (boot_->rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::string bytes = boot_->broadcast(std::string(reinterpret_cast<const char*>(&id), sizeof id), 0);
    std::memcpy(&id, bytes.data(), sizeof id);
    check_nccl(ncclCommInitRank(&shared_->comm, boot_->world(), id, boot_->rank()), "ncclCommInitRank");
    stream_ = std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_));
    clock_ = std::make_shared<EventClock>(stream_->stream());
    watchdog_ = std::thread([this] { watch(); });
  }
  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    if (!shared_->aborted.load()) ncclCommDestroy(shared_->comm);
  }

  std::string backend() const override { return "nccl"; }
  int rank() const override { return boot_->rank(); }
  int world() const override { return boot_->world(); }

  std::shared_ptr<CommWork> allreduce_async(torch::Tensor t, ReduceOp op) override {
    if (!t.is_cuda() || !t.is_contiguous())
      throw std::invalid_argument("nccl communicator: allreduce needs a contiguous CUDA tensor");
    c10::cuda::CUDAGuard guard(t.device());
    // Held from the abort check to the enqueue: the watchdog (which aborts under this lock) can never abort
    // the communicator between them, and no two threads issue NCCL calls on it at once.
    std::unique_lock<std::mutex> lock(m_);
    shared_->throw_if_aborted();
    // The comm stream waits for whatever the compute stream queued that produces `t`.
    cudaEvent_t ready;
    check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(ready, c10::cuda::getCurrentCUDAStream(t.device().index()).stream()), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_->stream(), ready, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);
    // The caching allocator must not hand `t`'s memory out again before the comm stream is done with it.
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), *stream_);
    auto work = std::make_shared<NcclWork>(shared_, clock_, device_, stream_->stream());
    const ncclRedOp_t red = op == ReduceOp::kSum ? ncclSum : op == ReduceOp::kMax ? ncclMax : ncclAvg;
    check_nccl(ncclAllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t.scalar_type()), red,
                             shared_->comm, stream_->stream()),
               "ncclAllReduce");
    work->record_end(stream_->stream());
    watched_.push_back(work);
    lock.unlock();
    cv_.notify_all();
    return work;
  }

  std::shared_ptr<CommWork> mark() override {
    shared_->throw_if_aborted();
    c10::cuda::CUDAGuard guard(device_);
    cudaStream_t compute = c10::cuda::getCurrentCUDAStream(device_).stream();
    auto work = std::make_shared<NcclWork>(shared_, clock_, device_, compute);
    work->record_end(compute);
    return work;
  }

  void barrier() override { boot_->barrier(); }
  std::string broadcast(const std::string& bytes, int root) override { return boot_->broadcast(bytes, root); }
  std::vector<double> allgather(const std::vector<double>& values) override { return boot_->allgather(values); }

 private:
  // Aborts the communicator when a reduction is not done within timeout_s of being queued.
  void watch() {
    c10::cuda::CUDAGuard guard(device_);
    std::unique_lock<std::mutex> lock(m_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      while (!watched_.empty()) {
        auto& w = watched_.front();
        bool finished = true;  // a failed query: the work is over (its owner sees the error)
        try {
          finished = w->completed();
        } catch (const DistributedError&) {
        }
        if (finished) {
          watched_.pop_front();
          continue;
        }
        if (std::chrono::duration<double>(Clock::now() - w->enqueued_at()).count() > shared_->timeout_s) {
          shared_->abort_reason = "nccl: allreduce did not complete within " + std::to_string(shared_->timeout_s) +
                                  " s (distributed.timeout_s): a peer rank died or hangs";
          shared_->aborted.store(true);
          ncclCommAbort(shared_->comm);  // unblocks the streams; the communicator is unusable afterwards
          watched_.clear();
        }
        break;
      }
    }
  }

  std::unique_ptr<Communicator> boot_;
  std::shared_ptr<NcclShared> shared_;
  int device_ = 0;
  std::unique_ptr<c10::cuda::CUDAStream> stream_;
  std::shared_ptr<EventClock> clock_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<NcclWork>> watched_;
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                     const DistributedConfig& cfg) {
  return std::make_unique<NcclCommunicator>(std::move(bootstrap), cfg);
}

}  // namespace bs

#endif  // BERTSWEEP_WITH_NCCL
