#include "search/TrialPool.h"

#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <sstream>
#include <thread>

namespace bs::search {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string fmt(double v) {
  std::ostringstream os;
  os << std::setprecision(6) << v;
  return os.str();
}

// Set by the handler, read by TrialPool::take_interrupt: the first signal (drain) and the second (stop now).
volatile sig_atomic_t g_stop_signal = 0, g_stop_now = 0;
extern "C" void on_stop_signal(int sig) {
  if (g_stop_now) {
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  if (g_stop_signal) g_stop_now = sig;
  else
    g_stop_signal = sig;
}

}  // namespace

int threads_per_rank(const LauncherConfig& launcher, int parallel, int cores) {
  if (cores <= 0) cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return cpus_per_rank(launcher, parallel, cores);
}

PoolResources pool_resources(const LauncherConfig& launcher, int parallel, int cores, const std::string& source) {
  PoolResources r;
  // GPUs are a fact of this machine (like its cores), so they are checked for every start alike.
  r.gpus = launcher_gpus(launcher);
  check_gpu_fit(launcher, parallel, r.gpus, source);
  r.threads = threads_per_rank(launcher, parallel, cores);
  // So is what Slurm can grant: an impossible request is a config error now, not a run queued forever.
  if (launcher.kind == "srun") check_slurm_request(launcher, r.threads, source);
  return r;
}

struct StopSignals::Saved {
  struct sigaction old_int {
  }, old_term{};
};

StopSignals::StopSignals() : saved_(std::make_unique<Saved>()) {
  g_stop_signal = 0;
  g_stop_now = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &saved_->old_int);
  sigaction(SIGTERM, &sa, &saved_->old_term);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &saved_->old_int, nullptr);
  sigaction(SIGTERM, &saved_->old_term, nullptr);
}

TrialPool::Run::~Run() {
  if (slurm && !slurm_id.empty() && proc && !proc->exit_code()) slurm_cancel(slurm_id);
}

TrialPool::TrialPool(PoolOptions options)
    : options_(std::move(options)), slots_(options_.resources.gpus, options_.launcher.gpus_per_trial) {}

TrialPool::~TrialPool() = default;

void TrialPool::say(const std::string& s) const {
  if (options_.say) options_.say(s);
}

TrialPool::Run& TrialPool::launch(const Request& q) {
  auto r = std::make_unique<Run>();
  r->id = q.id;
  r->label = q.label;
  r->gpus = slots_.acquire();  // never runs out when parallel x gpus_per_trial fit (pool_resources)
  r->slurm = slurm();
  if (r->slurm) r->job_name = q.job_name;
  LaunchSpec spec = trainer_launch(options_.launcher, options_.trainer_exe, q.config_path, threads(), q.run_dir,
                                   r->gpus, r->job_name);
  spec.argv.insert(spec.argv.end(), q.extra_args.begin(), q.extra_args.end());
  try {
    r->proc = std::make_unique<TrialProcess>(spec);
  } catch (...) {
    slots_.release(r->gpus);
    throw;
  }
  r->last_event = r->launched = now_s();
  runs_.push_back(std::move(r));
  return *runs_.back();
}

TrialPool::Interrupt TrialPool::take_interrupt(const std::string& stop_reason) {
  if (g_stop_now && !stop_now_seen_) {
    stop_now_seen_ = drain_seen_ = true;
    say("stopping " + std::to_string(runs_.size()) + " running " + options_.noun + "(s) now" +
        (slurm() ? " (scancel --signal=TERM" : " (SIGTERM") + ", killed after " + fmt(options_.kill_grace_s) +
        " s; signal a third time to kill " + options_.self + " at once)");
    for (auto& r : runs_) {
      if (r->term_sent > 0) continue;  // already stopping (pruned, timed out): keeps its own reason
      r->cause = StopCause::kInterrupted;
      r->reason = stop_reason;
      stop(*r);
    }
    return Interrupt::kStopNow;
  }
  if (g_stop_signal && !drain_seen_) {
    drain_seen_ = true;
    return Interrupt::kDrain;
  }
  return Interrupt::kNone;
}

int TrialPool::drain_signal() const { return g_stop_signal; }

void TrialPool::step(const EventFn& on_event, const ExitFn& on_exit) {
  std::vector<pollfd> fds;
  for (const auto& r : runs_)
    if (r->proc->event_fd() >= 0) fds.push_back({r->proc->event_fd(), POLLIN, 0});
  // A short timeout: exits are noticed by polling waitpid, timeouts by the clock.
  poll(fds.data(), fds.size(), 200);
  for (auto it = runs_.begin(); it != runs_.end();) {
    Run& r = **it;
    read_events(r, on_event);
    if (auto code = r.proc->poll_exit()) {
      read_events(r, on_event);
      slots_.release(r.gpus);
      r.gpus.clear();
      on_exit(r, *code);
      it = runs_.erase(it);
      continue;
    }
    enforce_limits(r);
    ++it;
  }
}

void TrialPool::read_events(Run& r, const EventFn& on_event) {
  for (const auto& line : r.proc->read_lines()) {
    auto ev = parse_trial_event(line);
    if (!ev) continue;  // a stray print is not a sign of life
    r.last_event = now_s();
    r.started = true;
    if (ev->kind == "start") {
      auto job = ev->strings.find("slurm_job_id"), step = ev->strings.find("slurm_step_id");
      if (r.slurm && job != ev->strings.end() && !job->second.empty())
        set_slurm_id(r, alloc_.inside && step != ev->strings.end() ? job->second + "." + step->second : job->second);
    }
    on_event(r, *ev);
  }
}

void TrialPool::set_slurm_id(Run& r, const std::string& id) {
  if (id.empty() || id == r.slurm_id) return;
  r.slurm_id = id;
  if (on_slurm_id) on_slurm_id(r, id);
}

void TrialPool::find_slurm_job(Run& r) {
  if (alloc_.inside || !r.slurm || !r.slurm_id.empty()) return;
  if (auto job = slurm_find_job(r.job_name)) set_slurm_id(r, job->id);
}

void TrialPool::stop(Run& r) {
  r.term_sent = now_s();
  if (r.slurm) {
    find_slurm_job(r);
    if (!r.slurm_id.empty()) {
      if (r.started ? slurm_signal(r.slurm_id, "TERM") : slurm_cancel(r.slurm_id)) return;
    }
  }
  r.proc->signal_group(SIGTERM);
}

void TrialPool::force_stop(Run& r) {
  if (r.slurm && !r.slurm_id.empty()) slurm_cancel(r.slurm_id);
  r.proc->signal_group(SIGKILL);
  r.killed = true;
}

void TrialPool::enforce_limits(Run& r) {
  const double t = now_s();
  if (r.slurm && !r.started) {
    // Queued (or starting): the trial timeout does not run yet; launcher.queue_timeout does.
    if (t >= r.next_slurm_poll) {
      find_slurm_job(r);
      r.next_slurm_poll = t + 2;
    }
    const double limit = options_.launcher.queue_timeout;
    if (limit > 0 && r.term_sent == 0 && t - r.launched > limit) {
      r.cause = StopCause::kQueueTimeout;
      std::string state;
      if (!alloc_.inside && !r.slurm_id.empty())
        if (auto job = slurm_job(r.slurm_id))
          state = " (Slurm job " + job->id + ": " + job->state + ", reason " + job->reason + ")";
      r.reason = "queue timeout: no event within launcher.queue_timeout = " + fmt(limit) + " s of launch" + state;
      say(r.label + ": " + r.reason + "; cancelling it");
      stop(r);
    }
  } else if (options_.trial_timeout > 0 && r.cause != StopCause::kTimeout && r.term_sent == 0 &&
             t - r.last_event > options_.trial_timeout) {
    r.cause = StopCause::kTimeout;
    r.reason = "timeout: no event for " + fmt(options_.trial_timeout) + " s";
    say(r.label + ": " + r.reason + "; stopping it");
    stop(r);
  }
  if (r.term_sent > 0 && !r.killed && t - r.term_sent > options_.kill_grace_s) force_stop(r);
}

}  // namespace bs::search
