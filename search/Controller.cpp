#include "search/Controller.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>
#include <SQLiteCpp/SQLiteCpp.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "common/BuildInfo.h"
#include "common/Errors.h"
#include "common/TrainConfig.h"
#include "search/OptunaBridge.h"
#include "search/Slurm.h"
#include "search/StoredStudyCheck.h"
#include "search/TrialEvent.h"
#include "search/TrialLauncher.h"
#include "search/TrialPool.h"
#include "studies/StudyStore.h"

namespace bs::search {

namespace fs = std::filesystem;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

std::string last_line_of(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  if (last.size() > 300) last = last.substr(0, 300) + "...";
  return last;
}

std::string fmt(double v, int precision = 6) {
  std::ostringstream os;
  os << std::setprecision(precision) << v;
  return os.str();
}

// Is `pid` still a process launched for `trial_dir` (not a recycled pid)?
bool trial_process_alive(int64_t pid, const std::string& trial_dir) {
  if (pid <= 0 || kill(static_cast<pid_t>(pid), 0) != 0) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return !trial_dir.empty() && cmdline.find(trial_dir) != std::string::npos;
}

// Exit codes that would fail the same way again: retrying them wastes the budget.
bool retryable(const TrialRecord& r) {
  if (r.reason.rfind("queue timeout", 0) == 0) return false;
  return r.exit_code != exit_code::kUsage && r.exit_code != exit_code::kNonFinite && r.reason.rfind("config", 0) != 0;
}

struct RunningTrial {
  TrialRecord rec;
  TrainConfig config;  // rec.config_yaml is this, serialised
  std::map<std::string, ParamValue> params;
  TrialPool::Run* run = nullptr;  // its process, in pool_ (which owns it) until it has exited
  int64_t eval_every = 1;
  int64_t last_step = -1;
  bool prune_requested = false;
  std::optional<TrialEvent> done;
  double last_acc = 0;
  int64_t last_samples = 0;
  std::string label;
  bool no_retry = false;
};

// Ctrl-C / SIGTERM (StopSignals, TrialPool::take_interrupt): the first one drains (no new trials; running
// ones finish and are recorded). A second one stops the running trials the graceful way (SIGTERM, or
// scancel --signal=TERM under Slurm, killed after the grace period), records them and exits; a third one
// kills the controller at once.

class StudyRun {
 public:
  // `threads`: CPU threads per rank of each trial (cpus_per_rank).
  StudyRun(const StudyConfig& c, const ControllerOptions& o, const std::string& dir, std::vector<std::string> gpus,
           int threads)
      : c_(c), o_(o), dir_(dir), store_(dir + "/study.db"), threads_(threads), gpus_(gpus),
        pool_(pool_options(c, o, std::move(gpus), threads, [this](const std::string& s) { say(s); })) {
    pool_.on_slurm_id = [this](TrialPool::Run& run, const std::string& id) {
      // With the trial, like its GPUs: `study status` shows it and resume cancels the job by it.
      bridge_->set_user_attr(run.id, "bs_slurm_job", id);
    };
  }

  int run() {
    // Refusals came before anything was written (Controller::run: check_stored_study_agrees, then the
    // backup); a continued study's row is only rewritten when its config changed.
    store_.save_study(c_.name, c_.to_yaml_string());  // at once: `study status` may already be reading
    bridge_ = std::make_unique<OptunaBridge>(store_.path(), c_);
    record_environment();
    recover_dead_controller();
    base_ = c_.base();
    // GPU trials keep the same CPU-thread share: the trainer's host side (data, launches) still uses them.
    say("study " + c_.name + ": " + std::to_string(c_.n_trials) + " trials, " + std::to_string(c_.parallel) +
        " in parallel, " + std::to_string(threads_) + " threads each" +
        (c_.launcher.ranks > 1 ? " of " + std::to_string(c_.launcher.ranks) + " ranks" : std::string()) +
        (slurm() ? (alloc_.inside ? ", as steps of Slurm job " + alloc_.job_id : std::string(", as Slurm jobs"))
                 : std::string()) +
        (c_.launcher.gpus_per_trial > 0
             ? " and " + std::to_string(c_.launcher.gpus_per_trial) + " of GPUs " + join_gpu_ids(gpus_)
             : std::string()) +
        ", objective " + c_.objectives[0] + " (" + c_.directions[0] + ")");
    StopSignals stop_signals;
    bool draining = false;
    for (;;) {
      switch (pool_.take_interrupt("interrupted: the controller was told to stop now (second signal)")) {
        case TrialPool::Interrupt::kStopNow: draining = true; break;
        case TrialPool::Interrupt::kDrain:
          draining = true;
          say(std::string(pool_.drain_signal() == SIGINT ? "interrupted" : "terminated") +
              ": no new trials; waiting for " + std::to_string(running_.size()) +
              " running trial(s) to finish (signal again to stop them now; " + "`bertsweep study resume " + c_.name +
              "` re-queues them)");
          break;
        case TrialPool::Interrupt::kNone: break;
      }
      while (!draining && static_cast<int>(running_.size()) < c_.parallel && budget_left()) launch_one();
      if (running_.empty()) break;
      pool_.step([this](TrialPool::Run& run, const TrialEvent& ev) { handle_line(*running_.at(run.id), ev.line); },
                 [this](TrialPool::Run& run, int code) {
                   finish(*running_.at(run.id), code);
                   running_.erase(run.id);
                 });
    }
    summary();
    if (draining) {
      say("stopped before the budget was spent; continue with `bertsweep study resume " + c_.name + "`");
      return exit_code::kTerminated;
    }
    int finished = 0, failed = 0;
    for (const auto& t : store_.trials()) {
      finished += t.state == trial_state::kComplete || t.state == trial_state::kPruned;
      failed += t.state == trial_state::kFail;
    }
    if (finished == 0 && failed > 0) {
      say("every trial failed (" + std::to_string(failed) + "): see the reasons with `bertsweep study status " +
          c_.name + "` and the logs under " + dir_ + "/trials/");
      return exit_code::kStudy;
    }
    return exit_code::kOk;
  }

 private:
  void say(const std::string& s) const {
    if (!o_.quiet) std::cerr << "[" << c_.name << "] " << s << "\n" << std::flush;
  }

  static PoolOptions pool_options(const StudyConfig& c, const ControllerOptions& o, std::vector<std::string> gpus,
                                  int threads, std::function<void(const std::string&)> say) {
    PoolOptions p;
    p.launcher = c.launcher;
    p.trainer_exe = o.trainer_exe;
    p.resources = {std::move(gpus), threads};
    p.trial_timeout = c.trial_timeout;
    p.kill_grace_s = o.kill_grace_s;
    p.say = std::move(say);
    return p;
  }

  void record_environment() {
    std::map<std::string, std::string> env = {
        {"host", hostname()},
        {"cores", std::to_string(std::thread::hardware_concurrency())},
        {"git_commit", BERTSWEEP_BUILD_GIT_COMMIT},
        {"torch_version", BERTSWEEP_TORCH_VERSION},
        {"optuna_version", ensure_python()},
        {"python", BERTSWEEP_PYTHON},
        {"python_version", python_version()},
        {"trainer", o_.trainer_exe},
        {"controller_pid", std::to_string(getpid())},
        {"started", fmt(now_s(), 15)},
        {"launcher", c_.launcher.kind},
        {"parallel", std::to_string(c_.parallel)},
    };
    if (c_.launcher.gpus_per_trial > 0) {
      env["gpus_per_trial"] = std::to_string(c_.launcher.gpus_per_trial);
      env["gpus"] = join_gpu_ids(gpus_);
    }
    store_.record_environment(env);
  }

  // Trials left RUNNING by a controller that died: kill leftovers, replay what our table already knows,
  // mark the rest failed ("controller died") and re-queue them when retry_failed allows.
  void recover_dead_controller() {
    for (const auto& info : bridge_->trials()) {
      if (info.state != trial_state::kRunning) continue;
      auto row = store_.trial(info.number);
      TrialRecord rec;
      if (row) rec = *row;
      else {
        rec.number = info.number;
        rec.params_json = params_to_json(info.params);
        rec.host = hostname();
      }
      if (row && rec.state != trial_state::kRunning) {  // ours was written, Optuna's tell was not
        if (rec.state == trial_state::kComplete) bridge_->tell_complete(rec.number, rec.values);
        else if (rec.state == trial_state::kPruned)
          bridge_->tell_pruned(rec.number);
        else
          bridge_->tell_fail(rec.number);
        continue;
      }
      if (slurm()) cancel_leftover_job(info.number, info.user_attrs);
      if (trial_process_alive(rec.pid, rec.trial_dir)) {
        kill(-static_cast<pid_t>(rec.pid), SIGKILL);
        say("trial " + std::to_string(rec.number) + ": killed its leftover process " + std::to_string(rec.pid));
      }
      rec.state = trial_state::kFail;
      rec.reason = "controller died";
      rec.end_time = now_s();
      auto it = info.user_attrs.find("bs_attempt");
      if (it != info.user_attrs.end()) rec.attempt = std::stoi(it->second);
      store_.update_trial(rec);
      bridge_->tell_fail(rec.number);
      maybe_retry(rec, info.params);
      say("trial " + std::to_string(rec.number) + ": was running when the controller died; marked failed" +
          (rec.retried ? " and re-queued" : ""));
    }
    // Rows still RUNNING whose Optuna trial already ended (e.g. told just before the controller died).
    for (auto rec : store_.trials_in_state(trial_state::kRunning)) {
      rec.state = trial_state::kFail;
      rec.reason = "controller died";
      rec.end_time = now_s();
      store_.update_trial(rec);
    }
  }

  // A dead controller's srun trial: its job may outlive srun (a SIGKILLed srun leaves the allocation), so
  // it is cancelled by the id stored with the trial, and by its per-trial name when the id never arrived.
  void cancel_leftover_job(int64_t number, const std::map<std::string, std::string>& attrs) {
    auto id = attrs.find("bs_slurm_job");
    if (id != attrs.end() && slurm_cancel(id->second))
      say("trial " + std::to_string(number) + ": cancelled its leftover Slurm job " + id->second);
    if (!alloc_.inside && c_.launcher.job_name.find("{trial}") != std::string::npos) {
      const std::string name = slurm_job_name(c_.launcher.job_name, c_.name, number);
      if (auto job = slurm_find_job(name); job && (job->state == "PENDING" || job->state == "RUNNING" ||
                                                   job->state == "SUSPENDED" || job->state == "COMPLETING")) {
        slurm_cancel(job->id);
        say("trial " + std::to_string(number) + ": cancelled its leftover Slurm job " + job->id + " (" + name + ")");
      }
    }
  }

  bool budget_left() {
    int total = 0, waiting = 0;
    for (const auto& kv : bridge_->count_by_state()) {
      total += kv.second;
      if (kv.first == "WAITING") waiting += kv.second;
    }
    int retried = 0;
    for (const auto& t : store_.trials()) retried += t.retried ? 1 : 0;
    return waiting > 0 || total - retried < c_.n_trials;
  }

  // Stratified studies: the least-tried cell (ties: declaration order); none when not stratified or when
  // a retry is waiting, which Optuna hands out first. Counted from Optuna's trials, so a resumed study
  // keeps the balance.
  std::optional<std::map<std::string, ParamValue>> next_stratum() {
    const auto cells = c_.strata();
    if (cells.empty()) return std::nullopt;
    std::vector<int> tried(cells.size(), 0);
    for (const auto& t : bridge_->trials()) {
      if (t.state == "WAITING") return std::nullopt;
      if (t.user_attrs.count("bs_retry_of")) continue;
      for (size_t i = 0; i < cells.size(); ++i) {
        bool match = true;
        for (const auto& kv : cells[i]) {
          auto it = t.params.find(kv.first);
          if (it == t.params.end() || to_string(it->second) != to_string(kv.second)) match = false;
        }
        if (match) ++tried[i];
      }
    }
    size_t pick = static_cast<size_t>(std::min_element(tried.begin(), tried.end()) - tried.begin());
    return cells[pick];
  }

  OptunaBridge::Asked ask_next() {
    auto cell = next_stratum();
    return cell ? bridge_->ask_in_cell(c_.space, base_, *cell) : bridge_->ask(c_.space, base_);
  }

  // With checkpoint.dir set, each trial checkpoints into its own folder in it (trial-NNNN: parallel trials
  // must never share one), and a retry continues from the failed attempt's last checkpoint (a copy, so
  // that the failed attempt's folder stays as it was) instead of from step 0. Returns the trainer's extra
  // arguments: {"--resume"} for such a retry.
  std::vector<std::string> own_checkpoint_dir(RunningTrial& r) {
    const std::string root = r.config.checkpoint.dir;
    if (root.empty()) return {};
    auto folder = [&](int64_t n) {
      char num[32];
      std::snprintf(num, sizeof num, "/trial-%04lld", static_cast<long long>(n));
      return root + num;
    };
    r.config.checkpoint.dir = folder(r.rec.number);
    if (r.rec.retry_of < 0 || !has_checkpoint(folder(r.rec.retry_of))) return {};
    std::error_code ec;
    fs::remove_all(r.config.checkpoint.dir, ec);
    fs::create_directories(r.config.checkpoint.dir);
    fs::copy(folder(r.rec.retry_of), r.config.checkpoint.dir, fs::copy_options::recursive);
    say("trial " + std::to_string(r.rec.number) + ": continues trial " + std::to_string(r.rec.retry_of) +
        " from its last checkpoint (" + folder(r.rec.retry_of) + ")");
    return {"--resume"};
  }

  static bool has_checkpoint(const std::string& dir) {
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().filename().string().rfind("checkpoint-", 0) == 0) return true;
    return false;
  }

  void launch_one() {
    auto r = std::make_unique<RunningTrial>();
    OptunaBridge::Asked a = ask_next();
    // A number Optuna hands out again (its study changed under us) must not reach the trial's folder or row.
    if (auto stored = store_.trial(a.number))
      throw StudyError(store_.path() + ": Optuna gave out trial number " + std::to_string(a.number) +
                       ", which bs_trials already holds (" + stored->state + "); nothing of it was written. " +
                       damaged_study_help(store_.path()));
    TrialRecord& rec = r->rec;
    rec.number = a.number;
    rec.params_json = params_to_json(a.params);
    rec.host = hostname();
    rec.start_time = now_s();
    if (a.user_attrs.count("bs_attempt")) rec.attempt = std::stoi(a.user_attrs["bs_attempt"]);
    if (a.user_attrs.count("bs_retry_of")) rec.retry_of = std::stoll(a.user_attrs["bs_retry_of"]);
    r->params = a.params;
    char num[16];
    std::snprintf(num, sizeof num, "%04lld", static_cast<long long>(a.number));
    rec.trial_dir = fs::absolute(dir_ + "/trials/" + num).string();
    fs::create_directories(rec.trial_dir);
    std::vector<std::string> resume_args;
    try {
      r->config = c_.space.resolve(base_, a.params, "trial " + std::to_string(a.number));
      // The stored config is exactly what runs: the thread share is written into it, so an exported
      // config reproduces the trial (float reductions depend on the thread count).
      if (r->config.threads == 0) r->config.threads = threads_;
      resume_args = own_checkpoint_dir(*r);
      rec.config_yaml = r->config.to_yaml_string();  // serialised once: the trial's config.yaml and its row
    } catch (const ConfigError& e) {
      rec.state = trial_state::kFail;
      rec.reason = std::string("config: ") + e.what();
      rec.end_time = now_s();
      store_.insert_trial(rec);
      bridge_->tell_fail(rec.number);
      say("trial " + std::to_string(rec.number) + " FAIL before launch: " + rec.reason);
      return;
    }
    std::string config_path = rec.trial_dir + "/config.yaml";
    std::ofstream(config_path) << rec.config_yaml;
    const std::string job_name = slurm() ? slurm_job_name(c_.launcher.job_name, c_.name, a.number) : "";
    try {
      // Its GPU slot never runs out: parallel x gpus_per_trial <= GPUs was checked at start.
      r->run = &pool_.launch(
          {rec.number, "trial " + std::to_string(rec.number), config_path, rec.trial_dir, job_name, resume_args});
    } catch (const std::exception& e) {
      rec.state = trial_state::kFail;
      rec.reason = std::string("launch: ") + e.what();
      rec.end_time = now_s();
      store_.insert_trial(rec);
      bridge_->tell_fail(rec.number);
      throw;  // every later trial would fail the same way
    }
    const TrialPool::Run& run = *r->run;
    rec.pid = run.proc->pid();
    store_.insert_trial(rec);
    // The assignment goes with the trial as an Optuna user attribute ("0,1"): `study status` shows it,
    // and so do Optuna's own tools (user_attrs_bs_gpus in trials_dataframe()).
    if (!run.gpus.empty()) bridge_->set_user_attr(rec.number, "bs_gpus", join_gpu_ids(run.gpus));
    r->eval_every = std::max<int64_t>(1, r->config.target.eval_every_samples);
    r->label = "trial " + std::to_string(rec.number) + " (" + r->config.optimizer.name +
               " b=" + std::to_string(r->config.batch.global) + " lr=" + fmt(r->config.optimizer.lr, 3) + ")";
    r->run->label = r->label;  // in the pool's messages (timeouts)
    say(r->label + ": started, pid " + std::to_string(rec.pid) + (run.slurm ? ", Slurm job name " + run.job_name : "") +
        (run.gpus.empty() ? "" : ", GPUs " + join_gpu_ids(run.gpus)) +
        (rec.attempt > 1 ? ", retry of trial " + std::to_string(rec.retry_of) : ""));
    running_[rec.number] = std::move(r);
  }

  void handle_line(RunningTrial& r, const std::string& line) {
    auto ev = parse_trial_event(line);
    if (!ev) return;  // TrialPool::step hands over parsed events only
    const int64_t n = r.rec.number;
    auto count = [&](const char* key) { return static_cast<int64_t>(ev->number(key)); };
    if (ev->kind == "eval") {
      const EvalPoint e{
          n, count("step"), count("samples"), ev->number("mlm_accuracy"), ev->number("loss"), ev->number("seconds")};
      store_.add_eval(e);
      r.last_acc = e.mlm_accuracy;
      r.last_samples = e.samples;
      say(r.label + ": " + std::to_string(e.samples) + " samples, accuracy " + fmt(e.mlm_accuracy, 4) + ", loss " +
          fmt(e.loss, 4) + ", " + fmt(e.seconds, 4) + " s");
      report_to_pruner(r, e);
    } else if (ev->kind == "throughput") {
      store_.add_throughput({n, count("step"), count("samples"), ev->number("samples_per_s"),
                             ev->number("tokens_per_s"), ev->number("padding_waste"), ev->number("imbalance"),
                             ev->number("overlap"), ev->number("step_seconds")});
    } else if (ev->kind == "start") {
      // (Its Slurm job or step id: TrialPool::step took it already, and pool_.on_slurm_id stored it.)
      // Its nodes, with the trial: `study status` shows them, a NODE_FAIL reason names one of them.
      auto nodes = ev->strings.find("slurm_nodes");
      if (nodes != ev->strings.end() && !nodes->second.empty())
        bridge_->set_user_attr(n, "bs_slurm_nodes", nodes->second);
      // What `device`/`precision: auto` resolved to on the trial's machine: the stored (and exported)
      // config then states exactly what ran.
      auto device = ev->strings.find("device"), precision = ev->strings.find("precision");
      if (device != ev->strings.end() && precision != ev->strings.end()) {
        try {
          TrainConfig ran = r.config;
          ran.set("device", device->second, "trial config");
          ran.set("precision", precision->second, "trial config");
          ran.validate("trial config");
          r.config = ran;
          r.rec.config_yaml = ran.to_yaml_string();
          store_.update_trial(r.rec);
        } catch (const ConfigError&) {  // an old or foreign trainer: keep the config as launched
        }
      }
    } else if (ev->kind == "rank_load") {
      store_.add_rank_load({n, count("step"), line});
    } else if (ev->kind == "done") {
      r.done = ev;
    }
  }

  // Pruners compare intermediate values at equal steps in the study's direction: the step is the
  // sample count rounded to the eval interval (batch sizes differ between trials), the value is the
  // accuracy when maximizing it, else the error (1 - accuracy) so that lower is better.
  void report_to_pruner(RunningTrial& r, const EvalPoint& e) {
    if (c_.multi_objective() || c_.pruner == "none" || r.prune_requested) return;
    int64_t step = static_cast<int64_t>(std::llround(double(e.samples) / r.eval_every)) * r.eval_every;
    if (step <= r.last_step) return;
    r.last_step = step;
    double v = c_.directions[0] == "maximize" ? e.mlm_accuracy : 1.0 - e.mlm_accuracy;
    bridge_->report(r.rec.number, v, step);
    if (bridge_->should_prune(r.rec.number)) {
      r.prune_requested = true;
      r.rec.reason = "pruned at " + std::to_string(e.samples) + " samples (accuracy " + fmt(e.mlm_accuracy, 4) + ")";
      pool_.stop(*r.run);
      say(r.label + ": " + r.rec.reason);
    }
  }

  bool slurm() const { return c_.launcher.kind == "srun"; }

  std::vector<double> objective_values(const RunningTrial& r) const {
    const TrialEvent& d = *r.done;
    std::vector<double> values;
    for (const auto& o : c_.objectives) {
      if (o == "samples_to_target")
        values.push_back(r.rec.reached ? d.number("samples_to_target")
                                       : 2.0 * static_cast<double>(r.config.target.max_samples));
      else if (o == "seconds_to_target")
        values.push_back(r.rec.reached ? d.number("seconds_to_target")
                                       : kUnreachedSecondsOffset + (r.rec.end_time - r.rec.start_time));
      else if (o == "final_mlm_accuracy")
        values.push_back(d.number("final_mlm_accuracy", r.last_acc));
      else
        values.push_back(r.config.number(o));
    }
    return values;
  }

  // `r.run` has exited with `code` (its GPU slot is free again) and is still in the pool until this returns.
  void finish(RunningTrial& r, int code) {
    TrialRecord& rec = r.rec;
    const TrialPool::Run& run = *r.run;
    if (run.cause != StopCause::kNone) rec.reason = run.reason;  // the pool stopped it (timeout, signal)
    const bool timed_out = run.cause == StopCause::kTimeout || run.cause == StopCause::kQueueTimeout;
    rec.end_time = now_s();
    rec.exit_code = code;
    if (r.done) {
      rec.reached = r.done->flag("reached");
      if (rec.reached) {
        rec.samples_to_target = r.done->maybe("samples_to_target");
        rec.seconds_to_target = r.done->maybe("seconds_to_target");
      }
      rec.final_mlm_accuracy = r.done->maybe("final_mlm_accuracy");
    }
    if (r.prune_requested) {
      rec.state = trial_state::kPruned;
      store_.update_trial(rec);
      bridge_->tell_pruned(rec.number);
    } else if (!timed_out && code == exit_code::kOk && r.done) {  // done before a stop
      rec.state = trial_state::kComplete;
      rec.reason.clear();
      rec.values = objective_values(r);
      store_.update_trial(rec);
      bridge_->tell_complete(rec.number, rec.values);
    } else {
      rec.state = trial_state::kFail;
      if (run.cause == StopCause::kNone) {
        rec.reason = code == exit_code::kOk ? "exit 0 without a done event" : describe_exit(code);
        std::string last = last_line_of(rec.trial_dir + "/stderr.log");
        if (!last.empty() && code != exit_code::kOk) rec.reason += ": " + last;
        // srun may exit 0 when a node failed under the step (its tasks there never reported): Slurm knows.
        if (run.slurm) slurm_reason(r);
      }
      store_.update_trial(rec);
      bridge_->tell_fail(rec.number);
      if (!r.no_retry) maybe_retry(rec, r.params);
    }
    std::string what = rec.state;
    if (rec.state == trial_state::kComplete)
      what += " value " + fmt(rec.values[0], 8) + (rec.reached ? " (target reached)" : " (target not reached)");
    else
      what += ": " + rec.reason;
    say(r.label + ": " + what + progress());
  }

  // A srun trial's failure in Slurm's words (job state, slurmstepd's and srun's lines) instead of the last
  // stderr line; a time limit, an OOM kill, a cancel or a launch error is not retried.
  void slurm_reason(RunningTrial& r) {
    TrialPool::Run& run = *r.run;
    std::optional<SlurmJob> job;
    if (!alloc_.inside) {
      pool_.find_slurm_job(run);
      if (!run.slurm_id.empty()) job = slurm_job(run.slurm_id);
    }
    auto f = slurm_failure(job, file_tail(r.rec.trial_dir + "/stderr.log"));
    if (!f) return;
    std::string reason = f->reason;
    if (!job && !run.slurm_id.empty())
      reason += " [" + std::string(alloc_.inside ? "step " : "job ") + run.slurm_id + "]";
    r.rec.reason = reason + " (" + describe_exit(r.rec.exit_code) + ")";
    r.no_retry = !f->retryable;
  }

  static std::string file_tail(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    in.seekg(std::max<std::streamoff>(0, size - 65536));
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  void maybe_retry(TrialRecord& rec, const std::map<std::string, ParamValue>& params) {
    if (rec.attempt > c_.retry_failed || !retryable(rec)) return;
    bridge_->enqueue(params,
                     {{"bs_retry_of", std::to_string(rec.number)}, {"bs_attempt", std::to_string(rec.attempt + 1)}});
    store_.mark_retried(rec.number);
    rec.retried = true;
  }

  std::string progress() const {
    auto counts = bridge_->count_by_state();
    std::string s = " | " + std::to_string(counts["COMPLETE"]) + " complete, " + std::to_string(counts["PRUNED"]) +
                    " pruned, " + std::to_string(counts["FAIL"]) + " failed";
    if (!c_.multi_objective())
      if (auto best = bridge_->best_trial_number())
        if (auto t = store_.trial(*best); t && !t->values.empty())
          s += "; best trial " + std::to_string(*best) + " = " + fmt(t->values[0], 8);
    return s;
  }

  void summary() const { say("done" + progress()); }

  const StudyConfig& c_;
  const ControllerOptions& o_;
  std::string dir_;
  StudyStore store_;
  std::unique_ptr<OptunaBridge> bridge_;
  TrainConfig base_;
  int threads_;
  std::vector<std::string> gpus_;                             // every GPU trials may get (empty: CPU trials)
  TrialPool pool_;                                            // the trials' processes: launch, limits, stops, Ctrl-C
  const SlurmAllocation& alloc_ = pool_.allocation();         // trials are steps of it when inside
  std::map<int64_t, std::unique_ptr<RunningTrial>> running_;  // by trial number
};

}  // namespace

std::string study_dir(const std::string& dir, const std::string& name) {
  if (!is_valid_study_name(name))
    throw ConfigError("study name '" + name + "' may only contain letters, digits, '_', '.', '-'");
  return (fs::path(dir) / name).string();
}

Controller::Controller(StudyConfig config, ControllerOptions options)
    : config_(std::move(config)), options_(std::move(options)) {}

std::string Controller::study_dir() const { return search::study_dir(options_.dir, config_.name); }
std::string Controller::db_path() const { return study_dir() + "/study.db"; }

int Controller::run() {
  if (options_.trainer_exe.empty()) throw std::invalid_argument("Controller: trainer_exe is not set");
  // GPUs are a fact of this machine (like its cores), so they are checked here, for a new study and a
  // resumed one alike, before anything is written or any trial starts.
  // So is what Slurm can grant: an impossible request is a config error now, not a trial queued forever.
  PoolResources resources = pool_resources(config_.launcher, config_.parallel, options_.cores, config_.source);
  std::string dir = study_dir();
  fs::create_directories(dir + "/trials");
  // One controller per study: a second one would launch the same trials twice. The lock dies with us.
  std::string lock_path = dir + "/controller.lock";
  int fd = open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (fd >= 0) close(fd);
    throw std::runtime_error("study '" + config_.name + "' in " + options_.dir +
                             " is being run by another controller (lock " + lock_path + ")");
  }
  struct Unlock {
    int fd;
    ~Unlock() { close(fd); }
  } unlock{fd};
  // Nothing is written to an existing study file that disagrees with itself, and a copy is taken before
  // this session's first write (the way back from whatever happens next).
  const std::string db = dir + "/study.db";
  check_stored_study_agrees(db, config_, dir);
  if (fs::exists(db)) {
    const std::string bak = StudyStore::backup(db);
    if (!options_.quiet) std::cerr << "[" << config_.name << "] copied " << db << " to " << bak << " before writing\n";
  }
  StudyRun run(config_, options_, dir, std::move(resources.gpus), resources.threads);
  return run.run();
}

StudyConfig load_stored_study(const std::string& dir, const std::string& name) {
  std::string db = search::study_dir(dir, name) + "/study.db";
  if (!fs::exists(db))
    throw std::runtime_error("no study '" + name + "' in " + dir + " (" + db +
                             " not found; check --dir or start it with `bertsweep study run`)");
  StudyStore store(db, StudyStore::Mode::kReadOnly);
  auto text = store.study_config(name);
  if (!text) throw std::runtime_error(db + ": holds no bertsweep study named '" + name + "'");
  return StudyConfig::from_yaml(yaml::load_stored(*text, db + " (bs_study, study '" + name + "')"),
                                db + " (stored study config)");
}

namespace {
// A user attribute the controller sets on each trial (bs_gpus: its GPUs; bs_slurm_job: its Slurm job or
// step), read from Optuna's tables without starting Python; empty when no trial has it or the file's Optuna
// tables are not there yet.
std::map<int64_t, std::string> stored_trial_attr(const std::string& db_path, const std::string& study_name,
                                                 const std::string& key) {
  std::map<int64_t, std::string> out;
  try {
    auto db = StudyStore::open_read_only(db_path);
    SQLite::Statement q(*db,
                        "SELECT t.number, a.value_json FROM trial_user_attributes a "
                        "JOIN trials t ON t.trial_id = a.trial_id JOIN studies s ON s.study_id = t.study_id "
                        "WHERE a.key = ? AND s.study_name = ?");
    q.bind(1, key);
    q.bind(2, study_name);
    while (q.executeStep()) {
      std::string v = q.getColumn(1).getString();  // JSON text: "\"0,1\""
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      out[q.getColumn(0).getInt64()] = v;
    }
  } catch (const SQLite::Exception&) {
  }
  return out;
}
}  // namespace

std::string study_status_text(const std::string& dir, const std::string& name) {
  StudyConfig c = load_stored_study(dir, name);
  StudyStore store(search::study_dir(dir, name) + "/study.db", StudyStore::Mode::kReadOnly);
  const auto gpus = stored_trial_attr(store.path(), name, "bs_gpus");
  const auto jobs = stored_trial_attr(store.path(), name, "bs_slurm_job");
  const auto nodes = stored_trial_attr(store.path(), name, "bs_slurm_nodes");
  auto trials = store.trials();
  bool maximize = c.directions[0] == "maximize";
  auto rank = [](const std::string& s) {
    return s == trial_state::kComplete ? 0 : s == trial_state::kRunning ? 1 : s == trial_state::kPruned ? 2 : 3;
  };
  std::stable_sort(trials.begin(), trials.end(), [&](const TrialRecord& a, const TrialRecord& b) {
    if (rank(a.state) != rank(b.state)) return rank(a.state) < rank(b.state);
    if (a.state == trial_state::kComplete && !a.values.empty() && !b.values.empty() && a.values[0] != b.values[0])
      return maximize ? a.values[0] > b.values[0] : a.values[0] < b.values[0];
    return a.number < b.number;
  });
  std::vector<std::string> keys = {"optimizer.name", "batch.global", "optimizer.lr"};
  for (const auto& p : c.space.params())
    if (std::find(keys.begin(), keys.end(), p.key) == keys.end()) keys.push_back(p.key);
  std::ostringstream os;
  os << "study " << name << " (" << store.path() << "): objective " << c.objectives[0] << " (" << c.directions[0]
     << "), sampler " << c.sampler << ", pruner " << c.pruner << ", " << c.n_trials << " trials\n";
  os << std::left << std::setw(6) << "#" << std::setw(10) << "state" << std::setw(14) << "value" << std::setw(8)
     << "reached";
  for (const auto& k : keys) os << " " << std::setw(std::max<int>(10, k.size())) << k;
  if (!gpus.empty()) os << " " << std::setw(8) << "gpus";
  if (!jobs.empty()) os << " " << std::setw(10) << "slurm_job";
  if (!nodes.empty()) os << " " << std::setw(10) << "nodes";
  os << "  reason\n";
  std::map<std::string, int> counts;
  for (const auto& t : trials) {
    ++counts[t.state];
    os << std::setw(6) << t.number << std::setw(10) << t.state << std::setw(14)
       << (t.values.empty() ? std::string("-") : fmt(t.values[0], 8)) << std::setw(8)
       << (t.state == trial_state::kComplete || t.state == trial_state::kPruned ? (t.reached ? "yes" : "no") : "-");
    const TrainConfig config = t.config();
    for (const auto& k : keys) {
      std::string v = t.config_yaml.empty() ? "" : config.text(k);
      if (k == "optimizer.lr" && !v.empty()) v = fmt(config.optimizer.lr, 4);
      os << " " << std::setw(std::max<int>(10, k.size())) << (v.empty() ? "-" : v);
    }
    if (!gpus.empty()) {
      auto g = gpus.find(t.number);
      os << " " << std::setw(8) << (g == gpus.end() ? std::string("-") : g->second);
    }
    if (!jobs.empty()) {
      auto j = jobs.find(t.number);
      os << " " << std::setw(10) << (j == jobs.end() ? std::string("-") : j->second);
    }
    if (!nodes.empty()) {
      auto h = nodes.find(t.number);
      os << " " << std::setw(10) << (h == nodes.end() ? std::string("-") : h->second);
    }
    os << "  " << (t.reason.size() > 60 ? t.reason.substr(0, 60) + "..." : t.reason) << "\n";
  }
  os << "trials: " << trials.size();
  std::string sep = " (";
  for (const auto& kv : counts) {
    os << sep << kv.first << " " << kv.second;
    sep = ", ";
  }
  os << (counts.empty() ? "" : ")") << "\n";
  if (!trials.empty() && trials[0].state == trial_state::kComplete)
    os << "best: trial " << trials[0].number << " value " << fmt(trials[0].values[0], 10)
       << (trials[0].reached ? " (target reached)" : " (target not reached)") << "\n";
  return os.str();
}

}  // namespace bs::search
