// Collectives between the ranks of one training job: backends `none` (one rank), `mpi` (CPU tensors,
// OpenMPI), `nccl` (GPU tensors; compiled only with BERTSWEEP_WITH_NCCL). The rank and world size come from
// the launcher's environment (mpirun, srun, PMI).
//
// MPI: OpenMPI progresses a non-blocking collective only inside MPI calls, so every MPI call after init runs
// on one dedicated communication thread fed by a queue. allreduce_async() enqueues and returns at once; the
// comm thread starts the operation and polls it, so the reduction really proceeds while backward computes.
// Every wait has a deadline (DistributedConfig::timeout_s): a peer that died or hangs turns into a
// DistributedError on the others instead of a hang.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/Errors.h"
#include "common/TrainConfig.h"

namespace bs {

// What the launcher told this process.
struct LaunchInfo {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_world = 1;
  std::string launcher;  // "mpirun", "slurm", "pmi" or "" (started alone)
};
// Reads OMPI_COMM_WORLD_*, PMI_RANK/PMI_SIZE, SLURM_PROCID/SLURM_NTASKS (in that order).
LaunchInfo detect_launch();

enum class ReduceOp { kSum, kAvg, kMax };

using Clock = std::chrono::steady_clock;

// One started collective. wait() returns when it has completed on this rank, or throws DistributedError.
class CommWork {
 public:
  virtual ~CommWork() = default;
  virtual void wait() = 0;
  virtual bool done() const = 0;
  // When the operation was handed to the communicator, started on the wire, completed (unset until then).
  virtual Clock::time_point enqueued_at() const = 0;
  virtual Clock::time_point started_at() const = 0;
  virtual Clock::time_point finished_at() const = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string backend() const = 0;
  virtual int rank() const = 0;
  virtual int world() const = 0;

  // Reduces `t` in place over all ranks; returns at once. `t` must stay untouched until the work is done.
  virtual std::shared_ptr<CommWork> allreduce_async(torch::Tensor t, ReduceOp op) = 0;
  // Blocking forms.
  void allreduce(torch::Tensor t, ReduceOp op) { allreduce_async(std::move(t), op)->wait(); }
  double allreduce(double x, ReduceOp op);
  // A point in this rank's compute order: done once everything queued before it has run (on the CPU at
  // once; on a GPU when the current stream gets there). Its finished_at() is when backward really ended,
  // against which communication still in flight is exposed.
  virtual std::shared_ptr<CommWork> mark();
  virtual void barrier() = 0;
  // Root's bytes, on every rank.
  virtual std::string broadcast(const std::string& bytes, int root) = 0;
  // Every rank's `values` (same count on every rank), concatenated in rank order.
  virtual std::vector<double> allgather(const std::vector<double>& values) = 0;
};

// backend: none | mpi | nccl | auto (when launched by mpirun/srun with world > 1: nccl for `cuda`
// gradients, else mpi; alone: none). Throws ConfigError for an unknown or not-built backend or one that
// cannot reduce tensors of that device, DistributedError when the peers cannot be reached.
std::unique_ptr<Communicator> make_communicator(const DistributedConfig& cfg, bool cuda = false);

// Every rank passes its resolved config text; throws DistributedError naming the ranks whose config
// differs from rank 0's (different builds, files or --set overrides).
void check_same_config(Communicator& comm, const std::string& resolved_config);

}  // namespace bs
