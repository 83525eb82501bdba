#include "distributed/Communicator.h"

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

#include "common/Choices.h"
#include "common/Env.h"

namespace bs {

#ifdef BERTSWEEP_WITH_NCCL
// NcclCommunicator.cpp: bootstraps over `bootstrap` (MPI, or none for one rank), which it keeps for
// barrier/broadcast/allgather.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                     const DistributedConfig& cfg);
#endif
#ifdef BERTSWEEP_WITH_MPI
// MpiCommunicator.cpp.
std::unique_ptr<Communicator> make_mpi_communicator(const DistributedConfig& cfg);
#endif

namespace {

// ---------------------------------------------------------------- none: one rank, everything is local.

class CompletedWork : public CommWork {
 public:
  CompletedWork() : t_(Clock::now()) {}
  void wait() override {}
  bool done() const override { return true; }
  Clock::time_point enqueued_at() const override { return t_; }
  Clock::time_point started_at() const override { return t_; }
  Clock::time_point finished_at() const override { return t_; }

 private:
  Clock::time_point t_;
};

class NoneCommunicator : public Communicator {
 public:
  std::string backend() const override { return "none"; }
  int rank() const override { return 0; }
  int world() const override { return 1; }
  std::shared_ptr<CommWork> allreduce_async(torch::Tensor, ReduceOp) override {
    return std::make_shared<CompletedWork>();
  }
  void barrier() override {}
  std::string broadcast(const std::string& bytes, int) override { return bytes; }
  std::vector<double> allgather(const std::vector<double>& values) override { return values; }
};

std::string fnv1a_hex(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

LaunchInfo detect_launch() {
  LaunchInfo info;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    info.launcher = "mpirun";
    info.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    info.world = env_int("OMPI_COMM_WORLD_SIZE", 1);
    info.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    info.local_world = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (std::getenv("PMI_SIZE")) {
    info.launcher = "pmi";
    info.rank = env_int("PMI_RANK", 0);
    info.world = env_int("PMI_SIZE", 1);
    info.local_rank = env_int("MPI_LOCALRANKID", 0);
    info.local_world = env_int("MPI_LOCALNRANKS", 1);
  } else if (std::getenv("SLURM_NTASKS") && std::getenv("SLURM_PROCID")) {
    info.launcher = "slurm";
    info.rank = env_int("SLURM_PROCID", 0);
    info.world = env_int("SLURM_NTASKS", 1);
    info.local_rank = env_int("SLURM_LOCALID", 0);
    info.local_world = env_int("SLURM_NTASKS_PER_NODE", 1);
  }
  return info;
}

std::shared_ptr<CommWork> Communicator::mark() { return std::make_shared<CompletedWork>(); }

double Communicator::allreduce(double x, ReduceOp op) {
  torch::Tensor t = torch::tensor({x}, torch::kDouble);
  allreduce_async(t, op)->wait();
  return t.item<double>();
}

std::unique_ptr<Communicator> make_communicator(const DistributedConfig& cfg, bool cuda) {
  using B = BackendKind;
  B backend = parse_choice<B>(cfg.backend);
  if (backend == B::kAuto) {
    LaunchInfo info = detect_launch();
    const bool many = !info.launcher.empty() && info.world > 1;
    backend = !many ? B::kNone : cuda ? B::kNccl : B::kMpi;
  }
  if (cuda && backend == B::kMpi)
    throw ConfigError("distributed.backend: mpi reduces CPU tensors, but device is cuda; use nccl or auto");
  if (!cuda && backend == B::kNccl)
    throw ConfigError("distributed.backend: nccl reduces GPU tensors, but device is cpu; use mpi or auto");
  if (backend == B::kNone) return std::make_unique<NoneCommunicator>();
#ifdef BERTSWEEP_WITH_MPI
  if (backend == B::kMpi) return make_mpi_communicator(cfg);
#else
  if (backend == B::kMpi)
    throw ConfigError("distributed.backend: mpi is not built in (a core-only build, BERTSWEEP_CORE_ONLY); use none");
#endif
  {  // nccl
#ifdef BERTSWEEP_WITH_NCCL
#ifdef BERTSWEEP_WITH_MPI
    const bool alone = detect_launch().world <= 1;
    return make_nccl_communicator(alone ? std::make_unique<NoneCommunicator>() : make_mpi_communicator(cfg), cfg);
#else
    if (detect_launch().world > 1)
      throw ConfigError(
          "distributed.backend: nccl with several ranks needs MPI to exchange the NCCL id, and this "
          "core-only build has none");
    return make_nccl_communicator(std::make_unique<NoneCommunicator>(), cfg);
#endif
#else
    throw ConfigError(
        "distributed.backend: nccl is not built in (this LibTorch has no CUDA or NCCL was not found); "
        "use mpi, or rebuild against a CUDA LibTorch with NCCL");
#endif
  }
}

void check_same_config(Communicator& comm, const std::string& resolved_config) {
  const std::string mine = fnv1a_hex(resolved_config);
  const std::string root = comm.broadcast(mine, 0);
  std::vector<double> differs = comm.allgather({mine == root ? 0.0 : 1.0});
  std::string ranks;
  for (size_t r = 0; r < differs.size(); ++r)
    if (differs[r] != 0.0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (!ranks.empty())
    throw DistributedError("ranks " + ranks + " resolved a different training config than rank 0 (hash " + root +
                           "); give every rank the same config file, --set overrides and data");
}

}  // namespace bs
