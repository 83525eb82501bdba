// Slurm as the controller's cluster engine, through Slurm's own commands (srun, squeue, scontrol, scancel,
// sbatch) run as argument vectors, never through a shell: the resource options of a trial, the check that
// a request can ever be granted, finding, signalling and cancelling a trial's job, and why a job failed in
// Slurm's words.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "search/StudyConfig.h"

namespace bs::search {

struct CommandResult {
  int exit_code = -1;  // 128+N when killed by signal N; 127 when the program was not found
  std::string out, err;
};
// Runs argv (argv[0] looked up on PATH) with stdin from /dev/null and captures its output; SIGKILLs it
// after timeout_s (exit_code 137).
CommandResult run_command(const std::vector<std::string>& argv, double timeout_s = 30);

// The allocation the controller runs in (it was started by sbatch/salloc): trials are then job steps.
struct SlurmAllocation {
  bool inside = false;
  std::string job_id;    // SLURM_JOB_ID
  int cpus_on_node = 0;  // SLURM_CPUS_ON_NODE
  int nodes = 1;         // SLURM_JOB_NUM_NODES
};
SlurmAllocation current_slurm_allocation();

// launcher.job_name with {study} and {trial} (the trial number, 4 digits) filled in.
std::string slurm_job_name(const std::string& pattern, const std::string& study, int64_t trial);

// CPU threads of each rank: launcher.cpus_per_trial / ranks when given; else the CPUs there are (the
// allocation's under srun inside one, else `controller_cores`) shared by parallel x ranks processes.
int cpus_per_rank(const LauncherConfig& launcher, int parallel, int controller_cores);

// srun's options for one trial, without the program: --job-name, --ntasks, --cpus-per-task, --nodes,
// --ntasks-per-node, --partition, --time, --mpi, the GPUs, --kill-on-bad-exit, then launcher.extra_args.
std::vector<std::string> srun_options(const LauncherConfig& launcher, int cpus_per_rank, const std::string& job_name,
                                      const std::vector<std::string>& gpus);

// Before the first trial: throws ConfigError (exit 2) naming the launcher keys when Slurm could never run
// one trial as configured (`srun --test-only` outside an allocation; the allocation's CPUs inside one), or
// when srun is missing. `source`: the study file.
void check_slurm_request(const LauncherConfig& launcher, int cpus_per_rank, const std::string& source);

struct SlurmJob {
  std::string id;          // the job id ("12")
  std::string state;       // PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, FAILED, ...
  std::string reason;      // Slurm's reason (Resources, TimeLimit, NonZeroExitCode, ...)
  std::string time_limit;  // as Slurm prints it
};
// The newest of this user's jobs named `name` (squeue), any state Slurm still remembers.
std::optional<SlurmJob> slurm_find_job(const std::string& name);
// A job by id (scontrol show job); nullopt once Slurm has forgotten it.
std::optional<SlurmJob> slurm_job(const std::string& id);
// scancel --signal=<sig> (to the job's steps: the trial's processes get it, srun stays) / scancel.
// `id`: "12" or a step "12.3". False when scancel refused (e.g. the job has ended).
bool slurm_signal(const std::string& id, const std::string& sig);
bool slurm_cancel(const std::string& id);
// scancel every job of this user named `name`.
bool slurm_cancel_by_name(const std::string& name);

struct SlurmFailure {
  std::string reason;     // e.g. "slurm: job 12 TIMEOUT (time limit 1:00): *** STEP 12.0 ... DUE TO TIME LIMIT ***"
  bool retryable = true;  // TIMEOUT, OUT_OF_MEMORY, a cancel by someone and launch errors fail the same way again
};
// Why a srun trial ended badly, in Slurm's words: the job's state when Slurm still knows it (`job`), and
// the lines slurmstepd, srun and OpenMPI wrote to the trial's stderr (`stderr_text`). Nullopt when Slurm
// said nothing (the trainer's own error is then the reason).
std::optional<SlurmFailure> slurm_failure(const std::optional<SlurmJob>& job, const std::string& stderr_text);

}  // namespace bs::search
