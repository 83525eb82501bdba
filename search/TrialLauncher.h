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
  std::vector<std::string> argv;              // argv[0]: absolute path, or a name looked up on PATH
  std::map<std::string, std::string> env;     // added to (or replacing in) the controller's environment
  std::string stdout_path, stderr_path;       // appended to
  // Where the child writes its event lines: fd 3 (a pipe), or its stdout (then stdout goes through the
  // same pipe and the controller copies every line to stdout_path).
  bool events_on_stdout = false;
};

// The trainer command of one trial: `<exe> train --config CFG --events fd:3|stdout --quiet
// --set threads=N`, under mpirun/srun when so configured (their ranks do not inherit fd 3, so events
// come on stdout there). Threads also go into OMP_NUM_THREADS / OPENBLAS_NUM_THREADS.
LaunchSpec trainer_launch(const LauncherConfig& launcher, const std::string& exe, const std::string& config_path,
                          int threads, const std::string& trial_dir);

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
