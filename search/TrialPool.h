// The process side of running `bertsweep train` children, shared by the study controller (search/Controller.cpp)
// and `study confirm` (search/ConfirmRuns.cpp), so that both launch, limit, stop and interrupt their runs the
// same way: a run is launched into the pool (its GPU slot, its Slurm job name under srun), its event lines
// are read, it is held to the limits (no event for trial_timeout s; a Slurm job not started within
// launcher.queue_timeout), stopped the graceful way and killed after the grace period, and the Ctrl-C
// protocol (drain, stop now, kill) is kept. What a run means (Optuna, pruning, the store, retries) stays
// with the caller: it gets each event line and each exit, with the reason the pool stopped the run if it did.
#pragma once
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "search/Slurm.h"
#include "search/StudyConfig.h"
#include "search/TrialEvent.h"
#include "search/TrialLauncher.h"

namespace bs::search {

// CPU threads of each rank of one of `parallel` runs of `launcher` (cpus_per_rank in Slurm.h) with `cores`
// cores to share, 0 meaning this machine's. Written into each run's config: float reductions depend on it.
int threads_per_rank(const LauncherConfig& launcher, int parallel, int cores);

// What `parallel` runs of `launcher` get on this machine. Checked before the caller writes anything or
// starts a run: the GPUs must fit (check_gpu_fit) and Slurm must be able to grant one run
// (check_slurm_request); both throw ConfigError naming `source`'s keys.
struct PoolResources {
  std::vector<std::string> gpus;  // every GPU runs may get (empty: CPU runs)
  int threads = 1;                // per rank
};
PoolResources pool_resources(const LauncherConfig& launcher, int parallel, int cores, const std::string& source);

// Ctrl-C / SIGTERM while one of these is alive: the first signal asks to drain (no new runs; running ones
// finish), the second to stop the running runs now (TrialPool::take_interrupt), a third one kills the
// process at once (the default action). Outside its lifetime the signals keep their previous handlers, so
// a signal during the caller's setup still ends it.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct Saved;
  std::unique_ptr<Saved> saved_;
};

// Why the pool stopped a run (kNone: it did not; a stop the caller asked for with stop() is the caller's).
enum class StopCause { kNone, kTimeout, kQueueTimeout, kInterrupted };

struct PoolOptions {
  LauncherConfig launcher;
  std::string trainer_exe;                      // the bertsweep executable that runs `train`
  PoolResources resources;                      // pool_resources()
  double trial_timeout = 0;                     // a started run without an event for this long is stopped; 0: never
  double kill_grace_s = 10;                     // after the graceful stop, SIGKILL (and scancel) after this long
  std::string noun = "trial";                   // what a run is called in messages ("stopping 2 running trial(s) now")
  std::string self = "the controller";          // what the third signal kills, in messages
  std::function<void(const std::string&)> say;  // progress lines; nullptr: none
};

class TrialPool {
 public:
  struct Run {
    int64_t id = 0;     // the caller's (trial number, run index)
    std::string label;  // names the run in the pool's messages; the caller may set it after launch
    std::unique_ptr<TrialProcess> proc;
    std::vector<std::string> gpus;  // its GPU slot (empty: a CPU run)
    // Slurm (launcher.kind srun): its job, or its step of our allocation, once known (squeue while it
    // queues; the trainer's start event names both).
    bool slurm = false, started = false;  // started: its first event arrived
    std::string job_name, slurm_id;       // slurm_id: "12" or "12.3"
    double launched = 0, last_event = 0, term_sent = 0, next_slurm_poll = 0;
    bool killed = false;                 // SIGKILLed after the grace period
    StopCause cause = StopCause::kNone;  // why the pool stopped it
    std::string reason;                  // and in words ("timeout: no event for 2 s"); empty for kNone

    Run() = default;
    Run(const Run&) = delete;
    Run& operator=(const Run&) = delete;
    // Dropped while still running (the caller is failing): a Slurm job is cancelled by id, since killing
    // srun alone can leave the job allocated; the TrialProcess then kills the local process group.
    ~Run();
  };

  struct Request {
    int64_t id = 0;
    std::string label, config_path, run_dir;
    std::string job_name;                 // its Slurm job name (used under srun only)
    std::vector<std::string> extra_args;  // appended to the trainer's argv (e.g. --set seed=3)
  };

  explicit TrialPool(PoolOptions options);
  ~TrialPool();
  TrialPool(const TrialPool&) = delete;
  TrialPool& operator=(const TrialPool&) = delete;

  // Starts a run with the lowest free GPU slot; throws with the reason when it cannot be started (the slot
  // is given back). The run stays in the pool until step() hands over its exit.
  Run& launch(const Request& request);
  std::size_t size() const { return runs_.size(); }
  bool empty() const { return runs_.empty(); }
  bool slurm() const { return options_.launcher.kind == "srun"; }
  const SlurmAllocation& allocation() const { return alloc_; }  // runs are its steps when inside
  int threads() const { return options_.resources.threads; }

  // The Ctrl-C protocol, while a StopSignals lives. What happened since the last call: kDrain once after
  // the first signal (launch nothing more); kStopNow once after the second, when every running run not
  // already stopping has just been stopped gracefully, with cause kInterrupted and `stop_reason`, and the
  // pool has said so. Both signals before one call give kStopNow (which drains too).
  enum class Interrupt { kNone, kDrain, kStopNow };
  Interrupt take_interrupt(const std::string& stop_reason);
  int drain_signal() const;  // the first signal (SIGINT, SIGTERM); 0 before it

  // One round: waits up to 200 ms for event lines; then, for each run in launch order, hands its complete
  // event lines to on_event; when it has exited (its last lines read), gives back its GPU slot and hands
  // it to on_exit (exit code, 128+N for signal N), after which it leaves the pool; else holds it to the limits.
  using EventFn = std::function<void(Run&, const TrialEvent&)>;
  using ExitFn = std::function<void(Run&, int exit_code)>;
  void step(const EventFn& on_event, const ExitFn& on_exit);

  // The graceful stop (for the caller's own reasons, e.g. pruning): SIGTERM, or `scancel --signal=TERM`
  // under Slurm since srun answers a SIGTERM of its own by killing the task (a job still queued is
  // cancelled). The trainer saves its checkpoint and exits 6; step() kills it after kill_grace_s.
  void stop(Run& run);
  // Its Slurm job's id from squeue while the run has not said it (no-op inside an allocation).
  void find_slurm_job(Run& run);
  // Called when a run's Slurm job or step id becomes known (e.g. to store it with the trial).
  std::function<void(Run&, const std::string& id)> on_slurm_id;

 private:
  void set_slurm_id(Run& run, const std::string& id);
  void read_events(Run& run, const EventFn& on_event);
  void enforce_limits(Run& run);
  void force_stop(Run& run);
  void say(const std::string& s) const;

  PoolOptions options_;
  GpuSlots slots_;
  SlurmAllocation alloc_ = current_slurm_allocation();
  std::list<std::unique_ptr<Run>> runs_;
  bool drain_seen_ = false, stop_now_seen_ = false;
};

}  // namespace bs::search
