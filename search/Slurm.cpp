#include "search/Slurm.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <sstream>

#include "common/Env.h"
#include "common/Errors.h"
#include "common/TrainConfig.h"

namespace bs::search {

CommandResult run_command(const std::vector<std::string>& argv, double timeout_s) {
  CommandResult r;
  if (argv.empty()) return r;
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return r;
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return r;
  }
  pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
    return r;
  }
  if (pid == 0) {
    int null_in = open("/dev/null", O_RDONLY);
    dup2(null_in, 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    execvp(cargv[0], cargv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool killed = false;
  int open_fds = 2;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  while (open_fds > 0) {
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0 && !killed) {
      kill(pid, SIGKILL);
      killed = true;
    }
    int n = poll(fds, 2, killed ? 1000 : static_cast<int>(std::min(left, 1.0) * 1000) + 1);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t got = read(fds[i].fd, buf, sizeof buf);
      if (got > 0) (i == 0 ? r.out : r.err).append(buf, got);
      else if (got == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

namespace {
// A count from Slurm's environment: a positive integer, else `fallback`.
int env_count(const char* name, int fallback) {
  const int64_t x = env_int(name, fallback);
  return x > 0 && x < (1 << 24) ? static_cast<int>(x) : fallback;
}

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t\r\n"));
  s.erase(s.find_last_not_of(" \t\r\n") + 1);
  return s;
}

// The lines of `text` that Slurm or MPI wrote about the launch (not the trainer's own output).
std::vector<std::string> slurm_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find("slurmstepd") != std::string::npos || line.rfind("srun: error:", 0) == 0 ||
        line.rfind("srun: fatal:", 0) == 0 || line.find("PMI") != std::string::npos)
      out.push_back(trim(line));
  }
  return out;
}

std::string first_matching(const std::vector<std::string>& lines, const std::string& needle) {
  for (const auto& l : lines)
    if (l.find(needle) != std::string::npos) return l;
  return "";
}

std::string shorten(std::string s) {
  if (s.size() > 240) s = s.substr(0, 240) + "...";
  return s;
}

std::string whoami() {
  const char* u = std::getenv("USER");
  if (u && *u) return u;
  return std::to_string(getuid());
}
}  // namespace

SlurmAllocation current_slurm_allocation() {
  SlurmAllocation a;
  const char* id = std::getenv("SLURM_JOB_ID");
  if (!id || !*id) return a;
  a.inside = true;
  a.job_id = id;
  a.cpus_on_node = env_count("SLURM_CPUS_ON_NODE", 0);
  a.nodes = env_count("SLURM_JOB_NUM_NODES", env_count("SLURM_NNODES", 1));
  return a;
}

std::string slurm_job_name(const std::string& pattern, const std::string& study, int64_t trial) {
  char num[24];
  std::snprintf(num, sizeof num, "%04lld", static_cast<long long>(trial));
  std::string out = pattern;
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"{study}", study}, {"{trial}", num}})
    for (std::size_t at; (at = out.find(key)) != std::string::npos;) out.replace(at, key.size(), value);
  return out;
}

int cpus_per_rank(const LauncherConfig& launcher, int parallel, int controller_cores) {
  const int ranks = std::max(1, launcher.ranks);
  if (launcher.cpus_per_trial > 0) return std::max(1, launcher.cpus_per_trial / ranks);
  if (launcher.kind != "srun") return std::max(1, controller_cores / std::max(1, parallel));  // as before: per process
  const SlurmAllocation a = current_slurm_allocation();
  const int cpus = a.inside && a.cpus_on_node > 0 ? a.cpus_on_node * a.nodes : controller_cores;
  return std::max(1, cpus / (std::max(1, parallel) * ranks));
}

std::vector<std::string> srun_options(const LauncherConfig& launcher, int cpus_per_rank, const std::string& job_name,
                                      const std::vector<std::string>& gpus) {
  const int ranks = std::max(1, launcher.ranks);
  std::vector<std::string> o = {"--job-name=" + job_name, "--ntasks=" + std::to_string(ranks),
                                "--cpus-per-task=" + std::to_string(cpus_per_rank)};
  if (launcher.nodes > 0) o.push_back("--nodes=" + std::to_string(launcher.nodes));
  if (launcher.ranks_per_node > 0) o.push_back("--ntasks-per-node=" + std::to_string(launcher.ranks_per_node));
  if (!launcher.partition.empty()) o.push_back("--partition=" + launcher.partition);
  if (!launcher.time_limit.empty()) o.push_back("--time=" + launcher.time_limit);
  // Several ranks find one another through Slurm's PMIx (OpenMPI direct-launched by srun needs it).
  const std::string mpi = !launcher.mpi.empty() ? launcher.mpi : ranks > 1 ? "pmix" : "";
  if (!mpi.empty()) o.push_back("--mpi=" + mpi);
  // GPUs per task when they split evenly between the ranks, else per node. Under Slurm the ids are those
  // of the allocation (Slurm may renumber them inside a task's cgroup).
  if (!gpus.empty()) {
    const int n = static_cast<int>(gpus.size());
    o.push_back(n % ranks == 0 ? "--gpus-per-task=" + std::to_string(n / ranks) : "--gres=gpu:" + std::to_string(n));
  }
  o.push_back("--kill-on-bad-exit=1");
  o.insert(o.end(), launcher.extra_args.begin(), launcher.extra_args.end());
  return o;
}

void check_slurm_request(const LauncherConfig& launcher, int cpus_per_rank, const std::string& source) {
  const int ranks = std::max(1, launcher.ranks);
  const std::string asked = std::to_string(ranks) + " rank(s) x " + std::to_string(cpus_per_rank) + " CPU(s)";
  const std::string keys =
      "launcher.ranks, cpus_per_trial, nodes, ranks_per_node, partition, time_limit, mpi "
      "or extra_args";
  const SlurmAllocation a = current_slurm_allocation();
  if (a.inside) {
    // Trials are steps of this allocation: they can never have more CPUs than it holds.
    if (a.cpus_on_node > 0 &&
        static_cast<int64_t>(ranks) * cpus_per_rank > static_cast<int64_t>(a.cpus_on_node) * a.nodes)
      throw ConfigError(source + ": a trial asks " + asked + " but this Slurm allocation (job " + a.job_id +
                        ") holds " + std::to_string(a.cpus_on_node * a.nodes) + " CPU(s) (SLURM_CPUS_ON_NODE=" +
                        std::to_string(a.cpus_on_node) + " x " + std::to_string(a.nodes) +
                        " node(s)); lower launcher.ranks or launcher.cpus_per_trial, or ask sbatch for more CPUs");
    return;
  }
  std::vector<std::string> argv = {"srun", "--test-only"};
  const auto opts = srun_options(launcher, cpus_per_rank, "bertsweep-test-only", {});
  argv.insert(argv.end(), opts.begin(), opts.end());
  argv.push_back("true");
  CommandResult r = run_command(argv, 60);
  if (r.exit_code == 127)
    throw ConfigError(source +
                      ": launcher.kind is srun but srun was not found on PATH (install Slurm's client, "
                      "Debian's slurm-client, or use launcher.kind: local or mpirun)");
  if (r.exit_code != 0) {
    std::string why;
    for (const auto& line : slurm_lines(r.err + "\n" + r.out)) why += (why.empty() ? "" : "; ") + line;
    if (why.empty()) why = trim(r.err.empty() ? r.out : r.err);
    std::istringstream in(r.err);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("allocation failure:", 0) == 0) why += "; " + trim(line);
    throw ConfigError(source + ": Slurm can never run a trial as configured (" + asked +
                      ": `srun --test-only` says: " + shorten(why) + "); fix " + keys);
  }
}

std::optional<SlurmJob> slurm_find_job(const std::string& name) {
  CommandResult r = run_command(
      {"squeue", "--noheader", "--states=all", "--user=" + whoami(), "--name=" + name, "--format=%i|%T|%r|%l"}, 20);
  if (r.exit_code != 0) return std::nullopt;
  std::optional<SlurmJob> newest;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f;
    std::istringstream fields(line);
    for (std::string x; std::getline(fields, x, '|');) f.push_back(trim(x));
    if (f.size() < 4 || f[0].empty()) continue;
    auto id_num = [](const std::string& s) { return std::strtoll(s.c_str(), nullptr, 10); };
    if (!newest || id_num(f[0]) > id_num(newest->id)) newest = SlurmJob{f[0], f[1], f[2], f[3]};
  }
  return newest;
}

std::optional<SlurmJob> slurm_job(const std::string& id) {
  const std::string job = id.substr(0, id.find('.'));
  CommandResult r = run_command({"scontrol", "--oneliner", "show", "job", job}, 20);
  if (r.exit_code != 0) return std::nullopt;
  SlurmJob j;
  j.id = job;
  std::istringstream in(r.out);
  for (std::string kv; in >> kv;) {
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (k == "JobState") j.state = v;
    else if (k == "Reason")
      j.reason = v;
    else if (k == "TimeLimit")
      j.time_limit = v;
  }
  if (j.state.empty()) return std::nullopt;
  return j;
}

bool slurm_signal(const std::string& id, const std::string& sig) {
  return run_command({"scancel", "--quiet", "--signal=" + sig, id}, 20).exit_code == 0;
}

bool slurm_cancel(const std::string& id) { return run_command({"scancel", "--quiet", id}, 20).exit_code == 0; }

bool slurm_cancel_by_name(const std::string& name) {
  return run_command({"scancel", "--quiet", "--user=" + whoami(), "--name=" + name}, 20).exit_code == 0;
}

std::optional<SlurmFailure> slurm_failure(const std::optional<SlurmJob>& job, const std::string& stderr_text) {
  const auto lines = slurm_lines(stderr_text);
  std::string stepd = first_matching(lines, "***");  // slurmstepd-n: error: *** STEP 12.0 ON n CANCELLED AT ... ***
  if (!stepd.empty()) stepd = stepd.substr(stepd.find("***"));
  std::string state = job ? job->state : "";
  // Inside an allocation the job is the controller's: the step's fate is only in slurmstepd's line.
  if (state.empty() || state == "RUNNING" || state == "COMPLETING") {
    if (stepd.find("DUE TO TIME LIMIT") != std::string::npos) state = "TIMEOUT";
    else if (stepd.find("DUE TO PREEMPTION") != std::string::npos)
      state = "PREEMPTED";
    else if (stepd.find("CANCELLED") != std::string::npos && stepd.find("DUE TO NODE FAILURE") == std::string::npos)
      state = "CANCELLED";
    else if (first_matching(lines, "oom-kill").size() || first_matching(lines, "Out Of Memory").size())
      state = "OUT_OF_MEMORY";
    else
      state.clear();
  }
  // A node failed under the step: srun says so even where the job's record does not (yet), or srun
  // exited 0 because the failed node's tasks never reported.
  // srun names the node that failed ("srun: error: Node failure on n2"); slurmstepd's line names a node
  // that survived and cancelled its part.
  const std::string node_line = first_matching(lines, "Node failure on ");
  const bool node_failed = stepd.find("DUE TO NODE FAILURE") != std::string::npos || !node_line.empty();
  if (node_failed && (state.empty() || state == "FAILED" || state == "COMPLETED")) state = "NODE_FAIL";
  const std::string id = job ? "job " + job->id : "its job";
  if (!state.empty() && state != "FAILED" && state != "COMPLETED") {
    SlurmFailure f;
    f.reason = "slurm: " + id + " " + state;
    if (state == "TIMEOUT" && job && !job->time_limit.empty()) f.reason += " (time limit " + job->time_limit + ")";
    if (!node_line.empty()) f.reason += " (" + node_line.substr(node_line.find("Node failure on ")) + ")";
    if (!stepd.empty()) f.reason += ": " + stepd;
    // A time limit, an OOM kill or someone's scancel would end a retry the same way; a node failure or a
    // preemption would not.
    f.retryable = state == "NODE_FAIL" || state == "PREEMPTED" || state == "BOOT_FAIL" || state == "REQUEUED";
    f.reason = shorten(f.reason);
    return f;
  }
  // Launch errors: the job never ran the trainer, and would not on a retry either.
  for (const char* needle :
       {"Unable to allocate resources", "invalid partition", "Invalid partition", "not built with SLURM's PMI support",
        "PMIx", "PMI", "srun: fatal:", "Unable to create step", "Invalid generic resource", "Invalid account"}) {
    std::string l = first_matching(lines, needle);
    if (l.empty()) continue;
    return SlurmFailure{shorten("slurm: launch failed (" + id + "): " + l), false};
  }
  return std::nullopt;
}

}  // namespace bs::search
