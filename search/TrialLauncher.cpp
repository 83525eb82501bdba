#include "search/TrialLauncher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "common/Errors.h"
#include "common/TrainConfig.h"
#include "search/Slurm.h"

extern char** environ;

namespace bs::search {

namespace fs = std::filesystem;

LaunchSpec trainer_launch(const LauncherConfig& launcher, const std::string& exe, const std::string& config_path,
                          int threads, const std::string& trial_dir, const std::vector<std::string>& gpus,
                          const std::string& job_name) {
  LaunchSpec s;
  s.stdout_path = trial_dir + "/stdout.log";
  s.stderr_path = trial_dir + "/stderr.log";
  s.events_on_stdout = launcher.kind != "local";
  std::string t = std::to_string(threads);
  s.env = {{"OMP_NUM_THREADS", t}, {"OPENBLAS_NUM_THREADS", t}, {"MKL_NUM_THREADS", t}};
  // A GPU trial sees only its own GPUs (each rank then takes local_rank % count of them). A CPU trial's
  // environment is left as the controller's.
  if (!gpus.empty()) s.env["CUDA_VISIBLE_DEVICES"] = join_gpu_ids(gpus);
  std::vector<std::string> train = {exe,         "train",    "--config",
                                    config_path, "--events", s.events_on_stdout ? "stdout" : "fd:3",
                                    "--quiet",   "--set",    "threads=" + t};
  if (!gpus.empty()) train.insert(train.end(), {"--set", "device=cuda"});
  if (launcher.kind == "mpirun") {
    s.argv = {"mpirun", "-np", std::to_string(launcher.ranks)};
    if (!launcher.hostfile.empty()) s.argv.insert(s.argv.end(), {"--hostfile", launcher.hostfile});
    if (geteuid() == 0) s.argv.push_back("--allow-run-as-root");
    // Export to every rank (on every host): the thread counts and CUDA_VISIBLE_DEVICES.
    for (const auto& kv : s.env) s.argv.insert(s.argv.end(), {"-x", kv.first});
  } else if (launcher.kind == "srun") {
    // srun forwards the whole environment (--export=ALL is its default), CUDA_VISIBLE_DEVICES included.
    s.argv = {"srun"};
    const auto opts = srun_options(launcher, threads, job_name.empty() ? "bertsweep" : job_name, gpus);
    s.argv.insert(s.argv.end(), opts.begin(), opts.end());
  }
  if (launcher.kind == "mpirun") s.argv.insert(s.argv.end(), launcher.extra_args.begin(), launcher.extra_args.end());
  s.argv.insert(s.argv.end(), train.begin(), train.end());
  return s;
}

std::string join_gpu_ids(const std::vector<std::string>& ids) {
  std::string out;
  for (const auto& id : ids) out += (out.empty() ? "" : ",") + id;
  return out;
}

std::vector<std::string> visible_gpus(const char* cuda_visible_devices, int device_count) {
  std::vector<std::string> out;
  if (!cuda_visible_devices) {
    for (int i = 0; i < device_count; ++i) out.push_back(std::to_string(i));
    return out;
  }
  std::string list = cuda_visible_devices;
  std::size_t start = 0;
  for (;;) {
    std::size_t comma = list.find(',', start);
    std::string id = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    id.erase(0, id.find_first_not_of(" \t"));
    id.erase(id.find_last_not_of(" \t") + 1);
    // CUDA ignores the rest of the list from an invalid entry on: empty, negative ("-1": none), repeated.
    if (id.empty() || id[0] == '-' || std::find(out.begin(), out.end(), id) != out.end()) break;
    out.push_back(id);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int count_nvidia_gpus() {
  std::error_code ec;
  int n = 0;
  for (fs::directory_iterator it("/proc/driver/nvidia/gpus", ec), end; !ec && it != end; it.increment(ec)) ++n;
  if (n > 0) return n;
  // Containers may hide /proc/driver/nvidia but expose the device nodes /dev/nvidia0, /dev/nvidia1, ...
  // (no subprocess: the launcher never runs a shell or a command it did not build).
  for (fs::directory_iterator it("/dev", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 6 && name.compare(0, 6, "nvidia") == 0 &&
        name.find_first_not_of("0123456789", 6) == std::string::npos)
      ++n;
  }
  return n;
}

std::vector<std::string> launcher_gpus(const LauncherConfig& launcher) {
  if (!launcher.gpus.empty()) return launcher.gpus;
  if (launcher.gpus_per_trial <= 0) return {};
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible_gpus(env, env ? 0 : count_nvidia_gpus());
}

void check_gpu_fit(const LauncherConfig& launcher, int parallel, const std::vector<std::string>& gpus,
                   const std::string& source) {
  const int per_trial = launcher.gpus_per_trial;
  if (per_trial <= 0) return;
  const int64_t need = static_cast<int64_t>(parallel) * per_trial;
  if (need <= static_cast<int64_t>(gpus.size())) return;
  std::string found;
  if (!launcher.gpus.empty()) {
    found = "launcher.gpus lists " + std::to_string(gpus.size()) + " (" + join_gpu_ids(gpus) + ")";
  } else {
    const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
    found = gpus.empty() ? std::string("no GPU is visible")
                         : std::to_string(gpus.size()) + " GPU(s) are visible (" + join_gpu_ids(gpus) + ")";
    found += env ? " in CUDA_VISIBLE_DEVICES='" + std::string(env) + "'"
                 : std::string(
                       " (no CUDA_VISIBLE_DEVICES; GPUs counted from /proc/driver/nvidia/gpus and "
                       "/dev/nvidiaN)");
  }
  throw ConfigError(source + ": parallel (" + std::to_string(parallel) + ") x launcher.gpus_per_trial (" +
                    std::to_string(per_trial) + ") needs " + std::to_string(need) + " GPUs but " + found +
                    "; lower parallel or launcher.gpus_per_trial, list the GPUs in launcher.gpus, or set "
                    "launcher.gpus_per_trial: 0 for CPU trials");
}

GpuSlots::GpuSlots(std::vector<std::string> gpus, int per_trial)
    : gpus_(std::move(gpus)), per_trial_(std::max(0, per_trial)) {
  taken_.assign(per_trial_ > 0 ? gpus_.size() / per_trial_ : 0, false);
}

int GpuSlots::capacity() const { return static_cast<int>(taken_.size()); }

int GpuSlots::in_use() const { return static_cast<int>(std::count(taken_.begin(), taken_.end(), true)); }

std::vector<std::string> GpuSlots::acquire() {
  if (per_trial_ == 0) return {};
  for (std::size_t b = 0; b < taken_.size(); ++b) {
    if (taken_[b]) continue;
    taken_[b] = true;
    return {gpus_.begin() + b * per_trial_, gpus_.begin() + (b + 1) * per_trial_};
  }
  throw std::runtime_error("GpuSlots: all " + std::to_string(taken_.size()) + " slot(s) of " +
                           std::to_string(per_trial_) + " GPU(s) are taken (GPUs " + join_gpu_ids(gpus_) + ")");
}

void GpuSlots::release(const std::vector<std::string>& ids) {
  if (per_trial_ == 0 && ids.empty()) return;
  for (std::size_t b = 0; b < taken_.size(); ++b) {
    if (!std::equal(ids.begin(), ids.end(), gpus_.begin() + b * per_trial_, gpus_.begin() + (b + 1) * per_trial_) ||
        ids.size() != static_cast<std::size_t>(per_trial_))
      continue;
    if (!taken_[b]) break;
    taken_[b] = false;
    return;
  }
  throw std::invalid_argument("GpuSlots: GPUs '" + join_gpu_ids(ids) + "' are not a slot in use");
}

std::string describe_exit(int code) {
  if (code > 128 && code < 128 + 65) {
    int sig = code - 128;
    const char* name = sigabbrev_np(sig);
    return "killed by signal " + std::to_string(sig) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  switch (code) {
    case exit_code::kOk: return "exit 0 (finished)";
    case exit_code::kInternal: return "exit 1 (internal error)";
    case exit_code::kUsage: return "exit 2 (config error)";
    case exit_code::kData: return "exit 3 (data error)";
    case exit_code::kNonFinite: return "exit 4 (NaN/inf loss)";
    case exit_code::kDistributed: return "exit 5 (distributed error)";
    case exit_code::kTerminated: return "exit 6 (terminated by signal)";
    case 127: return "exit 127 (command not found)";
    default: return "exit " + std::to_string(code);
  }
}

namespace {
std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// This environment with spec.env's variables replaced or added, as KEY=VALUE strings.
std::vector<std::string> child_environment(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (!overrides.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
  }
  for (const auto& kv : overrides) env.push_back(kv.first + "=" + kv.second);
  return env;
}

// The child's side of fork(): only async-signal-safe calls. stdin is /dev/null, stdout the log (or the event
// pipe), stderr the log, fd 3 the event pipe; an exec failure's errno goes back through exec_err_w.
[[noreturn]] void exec_child(pid_t parent, bool events_on_stdout, int events_w, int out_fd, int err_fd, int exec_err_w,
                             char** argv, char** envp) {
  setpgid(0, 0);                     // its own group: SIGTERM reaches mpirun and its ranks
  prctl(PR_SET_PDEATHSIG, SIGTERM);  // the controller died: stop rather than run orphaned
  if (getppid() != parent) _exit(126);
  // Move the fds we keep above 9 first so the dup2s below cannot clobber one another.
  int ev = fcntl(events_w, F_DUPFD_CLOEXEC, 10);
  int o = fcntl(out_fd, F_DUPFD_CLOEXEC, 10);
  int er = fcntl(err_fd, F_DUPFD_CLOEXEC, 10);
  int null_in = open("/dev/null", O_RDONLY);
  dup2(null_in, 0);
  dup2(events_on_stdout ? ev : o, 1);
  dup2(er, 2);
  if (!events_on_stdout) dup2(ev, 3);
  for (int fd = events_on_stdout ? 3 : 4; fd < 1024; ++fd)
    if (fd != exec_err_w) close(fd);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGPIPE, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  if (std::strchr(argv[0], '/')) execve(argv[0], argv, envp);
  else
    execvpe(argv[0], argv, envp);
  int err = errno;
  ssize_t ignored = write(exec_err_w, &err, sizeof err);
  (void)ignored;
  _exit(127);
}
}  // namespace

TrialProcess::TrialProcess(const LaunchSpec& spec) {
  if (spec.argv.empty()) throw std::invalid_argument("TrialProcess: empty argument vector");
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<std::string> args = spec.argv;
  std::vector<std::string> env = child_environment(spec.env);
  std::vector<char*> argv = c_strings(args), envp = c_strings(env);

  int out_fd = open(spec.stdout_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  int err_fd = open(spec.stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (out_fd < 0 || err_fd < 0) {
    if (out_fd >= 0) close(out_fd);
    if (err_fd >= 0) close(err_fd);
    throw std::runtime_error("cannot open trial logs " + spec.stdout_path + ": " + std::strerror(errno));
  }
  int events[2], exec_err[2];
  if (pipe2(events, O_CLOEXEC) != 0 || pipe2(exec_err, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid_ == 0)
    exec_child(parent, spec.events_on_stdout, events[1], out_fd, err_fd, exec_err[1], argv.data(), envp.data());
  setpgid(pid_, pid_);  // also from the parent: no race with an early signal_group()
  close(events[1]);
  close(exec_err[1]);
  close(err_fd);
  int err = 0;
  ssize_t n;
  do n = read(exec_err[0], &err, sizeof err);
  while (n < 0 && errno == EINTR);
  close(exec_err[0]);
  if (n == sizeof err) {
    close(events[0]);
    close(out_fd);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    throw std::runtime_error("cannot start " + spec.argv[0] + ": " + std::strerror(err));
  }
  event_fd_ = events[0];
  fcntl(event_fd_, F_SETFL, fcntl(event_fd_, F_GETFL) | O_NONBLOCK);
  copy_stdout_ = spec.events_on_stdout;
  if (copy_stdout_) stdout_copy_fd_ = out_fd;
  else
    close(out_fd);
}

TrialProcess::~TrialProcess() {
  if (pid_ > 0 && !exit_code_) {
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (event_fd_ >= 0) close(event_fd_);
  if (stdout_copy_fd_ >= 0) close(stdout_copy_fd_);
}

std::vector<std::string> TrialProcess::read_lines() {
  std::vector<std::string> lines;
  if (event_fd_ < 0) return lines;
  char buf[16384];
  for (;;) {
    ssize_t n = read(event_fd_, buf, sizeof buf);
    if (n > 0) {
      partial_.append(buf, n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {  // every writer closed its end
      if (!partial_.empty() && partial_.back() != '\n') partial_ += '\n';
      close(event_fd_);
      event_fd_ = -1;
    }
    break;  // EAGAIN: nothing more now
  }
  std::size_t start = 0;
  for (std::size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string line = partial_.substr(start, nl - start);
    if (copy_stdout_) {
      std::string copy = line + "\n";
      ssize_t ignored = write(stdout_copy_fd_, copy.data(), copy.size());
      (void)ignored;
      if (line.empty() || line[0] != '{') continue;  // ordinary output, not an event
    }
    lines.push_back(line);
  }
  partial_.erase(0, start);
  return lines;
}

std::optional<int> TrialProcess::poll_exit() {
  if (exit_code_ || pid_ <= 0) return exit_code_;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return exit_code_;
}

void TrialProcess::signal_group(int sig) {
  if (pid_ > 0 && !exit_code_) kill(-pid_, sig);
}

}  // namespace bs::search
