// The `mpi` backend (OpenMPI): a comm thread owns every MPI call; see Communicator.h.
#include <mpi.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>

#include "distributed/Communicator.h"

namespace bs {
namespace {

// ---------------------------------------------------------------- mpi: a comm thread owns every MPI call.

// Set once a collective timed out: MPI state is then unusable (a request is still pending forever), so the
// process must not call MPI_Finalize (it would hang); it exits with its error and mpirun ends the job.
std::atomic<bool> g_mpi_broken{false};

void finalize_mpi_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !g_mpi_broken) MPI_Finalize();
}

// MPI can be initialised once per process; several communicators in turn (tests) share it.
void ensure_mpi_initialized() {
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    throw DistributedError("MPI_Init_thread failed: start the job with mpirun (or srun with PMIx)");
  if (provided < MPI_THREAD_SERIALIZED)
    throw DistributedError(
        "this MPI library provides no MPI_THREAD_SERIALIZED support, which the comm thread "
        "needs; use an OpenMPI built with thread support");
  std::atexit(finalize_mpi_at_exit);
}

// MPI has no bfloat16: buckets travel as 16-bit words and these user ops add (or max) them in fp32 and round
// back, so `distributed.grad_dtype: compute` halves the bytes on the wire.
extern "C" void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const c10::BFloat16*>(in);
  auto* b = static_cast<c10::BFloat16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = c10::BFloat16(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}
extern "C" void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const c10::BFloat16*>(in);
  auto* b = static_cast<c10::BFloat16*>(inout);
  for (int i = 0; i < *len; ++i)
    if (static_cast<float>(a[i]) > static_cast<float>(b[i])) b[i] = a[i];
}

// Created on first use, on the thread that makes every MPI call.
MPI_Op mpi_op(ReduceOp op, torch::ScalarType t) {
  if (t != torch::kBFloat16) return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM;
  static MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL;
  if (sum == MPI_OP_NULL) {
    MPI_Op_create(bf16_sum, /*commute=*/1, &sum);
    MPI_Op_create(bf16_max, /*commute=*/1, &max);
  }
  return op == ReduceOp::kMax ? max : sum;
}

MPI_Datatype mpi_type(torch::ScalarType t) {
  switch (t) {
    case torch::kBFloat16: return MPI_UINT16_T;  // reduced with the bf16 ops above
    case torch::kFloat: return MPI_FLOAT;
    case torch::kDouble: return MPI_DOUBLE;
    case torch::kLong: return MPI_INT64_T;
    case torch::kInt: return MPI_INT32_T;
    case torch::kByte: return MPI_UINT8_T;
    default:
      throw std::invalid_argument(std::string("mpi communicator: dtype ") + c10::toString(t) +
                                  " is not supported (bfloat16, float32, float64, int32, int64, uint8)");
  }
}

class MpiWork : public CommWork {
 public:
  MpiWork(std::string what, double timeout_s)
      : what_(std::move(what)), timeout_s_(timeout_s), enqueued_(Clock::now()) {}
  void wait() override {
    std::unique_lock<std::mutex> lock(m_);
    // The comm thread enforces the deadline; this is only a backstop should that thread itself be stuck.
    auto backstop = std::chrono::duration<double>(2 * timeout_s_ + 10);
    if (!cv_.wait_for(lock, backstop, [&] { return finished_; }))
      throw DistributedError("mpi: " + what_ + " never completed and the communication thread is stuck");
    if (!error_.empty()) throw DistributedError(error_);
  }
  bool done() const override {
    std::lock_guard<std::mutex> lock(m_);
    return finished_;
  }
  Clock::time_point enqueued_at() const override { return enqueued_; }
  Clock::time_point started_at() const override {
    std::lock_guard<std::mutex> lock(m_);
    return started_;
  }
  Clock::time_point finished_at() const override {
    std::lock_guard<std::mutex> lock(m_);
    return finished_at_;
  }

  void mark_started() {
    std::lock_guard<std::mutex> lock(m_);
    started_ = Clock::now();
  }
  void complete(std::string error) {
    {
      std::lock_guard<std::mutex> lock(m_);
      finished_ = true;
      finished_at_ = Clock::now();
      error_ = std::move(error);
    }
    cv_.notify_all();
  }
  const std::string& what() const { return what_; }

 private:
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::string what_;
  double timeout_s_;
  bool finished_ = false;
  std::string error_;
  Clock::time_point enqueued_, started_, finished_at_;
};

// One queued collective. It owns its buffers (tensors), so an abandoned request never writes freed memory.
struct MpiOp {
  enum Kind { kAllreduce, kBroadcast, kAllgather, kBarrier } kind;
  explicit MpiOp(Kind k) : kind(k) {}
  torch::Tensor buf;   // allreduce/broadcast: in place; allgather: the send buffer
  torch::Tensor recv;  // allgather
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::shared_ptr<MpiWork> work;
  MPI_Request req = MPI_REQUEST_NULL;
  Clock::time_point deadline;
};

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(const DistributedConfig& cfg) : timeout_s_(cfg.timeout_s) {
    ensure_mpi_initialized();
    if (g_mpi_broken) throw DistributedError("mpi: an earlier collective timed out; MPI cannot be used again");
    // Only this thread touches MPI until the comm thread starts (SERIALIZED: never two threads at once).
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_);
    thread_ = std::thread([this] { loop(); });
  }
  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    if (!g_mpi_broken) MPI_Comm_free(&comm_);
  }

  std::string backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world() const override { return world_; }

  std::shared_ptr<CommWork> allreduce_async(torch::Tensor t, ReduceOp op) override {
    if (!t.device().is_cpu() || !t.is_contiguous())
      throw std::invalid_argument("mpi communicator: allreduce needs a contiguous CPU tensor");
    if (t.numel() > INT_MAX) throw std::invalid_argument("mpi communicator: tensor too large for one allreduce");
    if (op == ReduceOp::kAvg && !t.is_floating_point())
      throw std::invalid_argument("mpi communicator: average of an integer tensor");
    mpi_type(t.scalar_type());
    MpiOp o{MpiOp::kAllreduce};
    o.buf = t;
    o.op = op;
    return enqueue(std::move(o), "allreduce of " + std::to_string(t.numel()) + " elements");
  }

  void barrier() override { enqueue(MpiOp{MpiOp::kBarrier}, "barrier")->wait(); }

  std::string broadcast(const std::string& bytes, int root) override {
    MpiOp size_op{MpiOp::kBroadcast};
    size_op.buf = torch::tensor({int64_t(bytes.size())}, torch::kLong);
    size_op.root = root;
    enqueue(size_op, "broadcast (size)")->wait();
    MpiOp data_op{MpiOp::kBroadcast};
    data_op.buf = torch::zeros({size_op.buf.item<int64_t>()}, torch::kByte);
    if (rank_ == root) std::memcpy(data_op.buf.data_ptr(), bytes.data(), bytes.size());
    data_op.root = root;
    enqueue(data_op, "broadcast")->wait();
    return std::string(static_cast<const char*>(data_op.buf.data_ptr()), size_t(data_op.buf.numel()));
  }

  std::vector<double> allgather(const std::vector<double>& values) override {
    MpiOp o{MpiOp::kAllgather};
    o.buf = torch::tensor(values.empty() ? std::vector<double>{} : values, torch::kDouble).contiguous();
    o.recv = torch::zeros({int64_t(values.size()) * world_}, torch::kDouble);
    enqueue(o, "allgather")->wait();
    const double* p = o.recv.data_ptr<double>();
    return std::vector<double>(p, p + o.recv.numel());
  }

 private:
  std::shared_ptr<MpiWork> enqueue(MpiOp op, const std::string& what) {
    op.work = std::make_shared<MpiWork>(what + " #" + std::to_string(seq_++), timeout_s_);
    auto work = op.work;
    {
      std::lock_guard<std::mutex> lock(m_);
      queue_.push_back(std::move(op));
    }
    cv_.notify_all();
    return work;
  }

  void start(MpiOp& o) {
    o.work->mark_started();
    o.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
    int rc = MPI_SUCCESS;
    switch (o.kind) {
      case MpiOp::kAllreduce:
        rc = MPI_Iallreduce(MPI_IN_PLACE, o.buf.data_ptr(), int(o.buf.numel()), mpi_type(o.buf.scalar_type()),
                            mpi_op(o.op, o.buf.scalar_type()), comm_, &o.req);
        break;
      case MpiOp::kBroadcast:
        rc = MPI_Ibcast(o.buf.data_ptr(), int(o.buf.numel()), mpi_type(o.buf.scalar_type()), o.root, comm_, &o.req);
        break;
      case MpiOp::kAllgather:
        rc = MPI_Iallgather(o.buf.data_ptr(), int(o.buf.numel()), MPI_DOUBLE, o.recv.data_ptr(), int(o.buf.numel()),
                            MPI_DOUBLE, comm_, &o.req);
        break;
      case MpiOp::kBarrier: rc = MPI_Ibarrier(comm_, &o.req); break;
    }
    if (rc != MPI_SUCCESS) fail("mpi: " + o.work->what() + " could not start (MPI error " + std::to_string(rc) + ")");
  }

  void fail(const std::string& message) {
    if (broken_.empty()) broken_ = message;
    g_mpi_broken = true;
  }

  // The comm thread: starts queued operations, polls the active ones (MPI_Test drives OpenMPI's progress),
  // completes them in any order, and fails them past their deadline.
  void loop() {
    std::deque<MpiOp> active;
    std::vector<MpiOp> abandoned;  // timed-out requests: MPI may still write their buffers, keep them alive
    for (;;) {
      std::deque<MpiOp> fresh;
      {
        std::unique_lock<std::mutex> lock(m_);
        auto has_work = [&] { return stop_ || !queue_.empty(); };
        if (active.empty()) cv_.wait(lock, has_work);
        else
          cv_.wait_for(lock, std::chrono::microseconds(50), has_work);
        if (stop_ && queue_.empty() && active.empty()) break;
        fresh.swap(queue_);
      }
      for (auto& o : fresh) {
        if (broken_.empty()) start(o);
        if (!broken_.empty()) {
          o.work->complete(broken_);
          continue;
        }
        active.push_back(std::move(o));
      }
      const auto now = Clock::now();
      for (auto it = active.begin(); it != active.end();) {
        int flag = 0;
        if (broken_.empty()) MPI_Test(&it->req, &flag, MPI_STATUS_IGNORE);
        if (flag) {
          if (it->op == ReduceOp::kAvg) it->buf.div_(world_);
          it->work->complete("");
          it = active.erase(it);
        } else if (!broken_.empty() || now > it->deadline) {
          if (broken_.empty()) {
            std::ostringstream msg;
            msg << "mpi rank " << rank_ << ": " << it->work->what() << " did not complete within " << timeout_s_
                << " s (distributed.timeout_s): a peer rank died or hangs; raise distributed.timeout_s if "
                << "steps are legitimately this slow";
            fail(msg.str());
          }
          it->work->complete(broken_);
          abandoned.push_back(std::move(*it));
          it = active.erase(it);
        } else {
          ++it;
        }
      }
    }
    // A broken MPI job cannot be torn down cleanly; the buffers must outlive any late writes by MPI.
    if (!abandoned.empty()) new std::vector<MpiOp>(std::move(abandoned));  // intentionally leaked
  }

  double timeout_s_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, world_ = 1;
  int64_t seq_ = 0;  // main thread only
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<MpiOp> queue_;
  bool stop_ = false;
  std::string broken_;  // comm thread only
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const DistributedConfig& cfg) {
  return std::make_unique<MpiCommunicator>(cfg);
}

}  // namespace bs
