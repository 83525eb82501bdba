// The `nccl` backend: GPU tensors reduced by NCCL on a dedicated CUDA stream. Compiled only with
// BERTSWEEP_WITH_NCCL (CMake sets it when LibTorch has CUDA and NCCL is found).
// The NCCL unique id travels over the MPI bootstrap communicator, which also serves barrier, broadcast and
// allgather (small host data). allreduce_async orders the NCCL stream after the caller's current stream, so
// the gradient is complete before the reduction reads it; wait() polls the completion event up to
// distributed.timeout_s (then aborts the NCCL communicator and throws) and makes the caller's stream wait.
#ifdef BERTSWEEP_WITH_NCCL

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "trainer/Communicator.h"

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

class NcclWork : public CommWork {
 public:
  NcclWork(cudaEvent_t done, ncclComm_t comm, double timeout_s, Clock::time_point enqueued)
      : done_(done), comm_(comm), timeout_s_(timeout_s), enqueued_(enqueued) {}
  ~NcclWork() override { cudaEventDestroy(done_); }

  void wait() override {
    const auto deadline = enqueued_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
    while (!done()) {
      if (Clock::now() > deadline) {
        ncclCommAbort(comm_);  // unblocks the stream; the communicator is unusable afterwards
        throw DistributedError("nccl: allreduce did not complete within " + std::to_string(timeout_s_) +
                               " s (distributed.timeout_s): a peer rank died or hangs");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    // Later kernels on the caller's stream read the reduced tensor.
    check_cuda(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream().stream(), done_, 0), "cudaStreamWaitEvent");
  }
  bool done() const override {
    if (finished_ != Clock::time_point{}) return true;
    cudaError_t q = cudaEventQuery(done_);
    if (q == cudaErrorNotReady) return false;
    check_cuda(q, "cudaEventQuery");
    finished_ = Clock::now();
    return true;
  }
  Clock::time_point enqueued_at() const override { return enqueued_; }
  Clock::time_point started_at() const override { return enqueued_; }  // the stream starts it when ready
  Clock::time_point finished_at() const override { return finished_; }

 private:
  cudaEvent_t done_;
  ncclComm_t comm_;
  double timeout_s_;
  Clock::time_point enqueued_;
  mutable Clock::time_point finished_{};
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> bootstrap, const DistributedConfig& cfg)
      : boot_(std::move(bootstrap)), timeout_s_(cfg.timeout_s) {
    const int devices = c10::cuda::device_count();
    if (devices == 0) throw DistributedError("nccl: no CUDA device visible; use distributed.backend=mpi");
    LaunchInfo info = detect_launch();
    device_ = info.local_rank % devices;
    c10::cuda::CUDAGuard guard(device_);
    ncclUniqueId id;
    if (boot_->rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::string bytes = boot_->broadcast(std::string(reinterpret_cast<const char*>(&id), sizeof id), 0);
    std::memcpy(&id, bytes.data(), sizeof id);
    check_nccl(ncclCommInitRank(&comm_, boot_->world(), id, boot_->rank()), "ncclCommInitRank");
    stream_ = std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_));
  }
  ~NcclCommunicator() override { ncclCommDestroy(comm_); }

  std::string backend() const override { return "nccl"; }
  int rank() const override { return boot_->rank(); }
  int world() const override { return boot_->world(); }

  std::shared_ptr<CommWork> allreduce_async(torch::Tensor t, ReduceOp op) override {
    if (!t.is_cuda() || !t.is_contiguous())
      throw std::invalid_argument("nccl communicator: allreduce needs a contiguous CUDA tensor");
    const auto enqueued = Clock::now();
    c10::cuda::CUDAGuard guard(t.device());
    cudaEvent_t ready, done;
    check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    // The comm stream waits for whatever the compute stream queued that produces `t`.
    check_cuda(cudaEventRecord(ready, c10::cuda::getCurrentCUDAStream(t.device().index()).stream()), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_->stream(), ready, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);
    // The caching allocator must not hand `t`'s memory out again before the comm stream is done with it.
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), *stream_);
    const ncclRedOp_t red = op == ReduceOp::kSum ? ncclSum : op == ReduceOp::kMax ? ncclMax : ncclAvg;
    check_nccl(ncclAllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t.scalar_type()), red, comm_,
                             stream_->stream()),
               "ncclAllReduce");
    check_cuda(cudaEventRecord(done, stream_->stream()), "cudaEventRecord");
    return std::make_shared<NcclWork>(done, comm_, timeout_s_, enqueued);
  }

  void barrier() override { boot_->barrier(); }
  std::string broadcast(const std::string& bytes, int root) override { return boot_->broadcast(bytes, root); }
  std::vector<double> allgather(const std::vector<double>& values) override { return boot_->allgather(values); }

 private:
  std::unique_ptr<Communicator> boot_;
  double timeout_s_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<c10::cuda::CUDAStream> stream_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                     const DistributedConfig& cfg) {
  return std::make_unique<NcclCommunicator>(std::move(bootstrap), cfg);
}

}  // namespace bs

#endif  // BERTSWEEP_WITH_NCCL
