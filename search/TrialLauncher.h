// Launching a trial: the trainer's argument vector (local, mpirun, srun), the child process in its own
// process group with its events on a pipe, and classifying how it ended. Never a shell string.
#pragma once
#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "search/StudyConfig.h"

namespace bs::search {

struct LaunchSpec {
  std::vector<std::string> argv;           // argv[0]: absolute path, or a name looked up on PATH
  std::map<std::string, std::string> env;  // added to (or replacing in) the controller's environment
  std::string stdout_path, stderr_path;    // appended to
  // Where the child writes its event lines: fd 3 (a pipe), or its stdout (then stdout goes through the
  // same pipe and the controller copies every line to stdout_path).
  bool events_on_stdout = false;
};

// The trainer command of one trial: `<exe> train --config CFG --events fd:3|stdout --quiet
// --set threads=N`, under mpirun/srun when so configured (their ranks do not inherit fd 3, so events
// come on stdout there). Threads also go into OMP_NUM_THREADS / OPENBLAS_NUM_THREADS.
// `gpus`: the GPU ids given to this trial (GpuSlots::acquire); when any, the trial gets
// CUDA_VISIBLE_DEVICES=<ids> (exported by mpirun -x; srun forwards the environment and is asked for the
// GPUs with --gpus-per-task or --gres) and `--set device=cuda`. Without any, the environment is left alone.
// Under srun, `threads` is also --cpus-per-task and `job_name` the job's name (srun_options() in Slurm.h).
LaunchSpec trainer_launch(const LauncherConfig& launcher, const std::string& exe, const std::string& config_path,
                          int threads, const std::string& trial_dir, const std::vector<std::string>& gpus = {},
                          const std::string& job_name = "");

// The GPUs the controller can hand out when launcher.gpus is not given. `cuda_visible_devices`: the
// controller's CUDA_VISIBLE_DEVICES (nullptr: unset), whose entries are kept as written (indices or
// GPU-/MIG- UUIDs; like CUDA, reading stops at the first empty, negative or repeated entry, so "" or "-1"
// means none); when unset, the ids 0..device_count-1.
std::vector<std::string> visible_gpus(const char* cuda_visible_devices, int device_count);
// GPUs of this machine: entries of /proc/driver/nvidia/gpus/, else the /dev/nvidiaN device nodes; 0 without
// the driver.
int count_nvidia_gpus();
// The GPUs of `launcher`: its `gpus` list, else visible_gpus(getenv("CUDA_VISIBLE_DEVICES"), count_nvidia_gpus())
// (the machine is only asked when trials get GPUs).
std::vector<std::string> launcher_gpus(const LauncherConfig& launcher);
// Throws ConfigError (exit 2) before any trial starts when `parallel` trials of `launcher.gpus_per_trial`
// GPUs each do not fit on `gpus`, naming the keys and the GPUs found. `source`: the study file.
void check_gpu_fit(const LauncherConfig& launcher, int parallel, const std::vector<std::string>& gpus,
                   const std::string& source);

// Disjoint GPU sets for the running trials: the GPUs are cut into blocks of `per_trial` consecutive ids
// (so a 2-GPU trial gets a pair like 0,1 or 2,3; ids left over are not used) and acquire() hands out
// the lowest free block. With per_trial 0 every acquire() returns no GPU (CPU trials).
class GpuSlots {
 public:
  GpuSlots(std::vector<std::string> gpus, int per_trial);
  int capacity() const;  // trials that can hold GPUs at once
  int in_use() const;    // blocks handed out
  // Throws std::runtime_error when every block is taken.
  std::vector<std::string> acquire();
  // Gives back what acquire() returned; throws std::invalid_argument for ids that are not a held block.
  void release(const std::vector<std::string>& ids);

 private:
  std::vector<std::string> gpus_;
  int per_trial_;
  std::vector<bool> taken_;  // per block
};

// "0,1": the form of CUDA_VISIBLE_DEVICES and of the trial's stored assignment.
std::string join_gpu_ids(const std::vector<std::string>& ids);

// How a finished process ended, for humans: "exit 3 (data error)", "killed by signal 9 (SIGKILL)".
std::string describe_exit(int exit_code);

class TrialProcess {
 public:
  // Forks and execs; throws with the reason (e.g. "execvp mpirun: No such file or directory").
  explicit TrialProcess(const LaunchSpec& spec);
  ~TrialProcess();  // kills the process group if still running
  TrialProcess(const TrialProcess&) = delete;
  TrialProcess& operator=(const TrialProcess&) = delete;

  pid_t pid() const { return pid_; }
  int event_fd() const { return event_fd_; }  // -1 once its end was read

  // Reads what is available on the event pipe (never blocks); returns the complete lines.
  std::vector<std::string> read_lines();
  bool events_closed() const { return event_fd_ < 0; }

  // Reaps the process when it has ended: its exit code, 128+N when killed by signal N.
  std::optional<int> poll_exit();
  std::optional<int> exit_code() const { return exit_code_; }

  void signal_group(int sig);  // to the whole process group (mpirun and its ranks too)

 private:
  pid_t pid_ = -1;
  int event_fd_ = -1;
  std::string partial_;
  std::optional<int> exit_code_;
  bool copy_stdout_ = false;
  int stdout_copy_fd_ = -1;
};

}  // namespace bs::search
