#include "search/ConfirmRuns.h"

#include <signal.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>
#include <ostream>

#include "common/Errors.h"
#include "common/TrainConfig.h"
#include "search/StudyConfig.h"
#include "search/TrialPool.h"
#include "studies/ConfigExport.h"

namespace bs::search {
namespace fs = std::filesystem;

namespace {

// The stored study config (launcher, trial_timeout), so that a confirmation runs as the trials did; a study
// file whose config no longer reads (an older bertsweep) runs with the defaults: local, no timeout.
StudyConfig stored_study(const StudyStore& store, const std::string& name) {
  auto yaml = store.study_config(name);
  if (yaml) {
    try {
      return StudyConfig::from_yaml(YAML::Load(*yaml), "stored study " + name);
    } catch (const std::exception&) {
    }
  }
  StudyConfig c;
  c.name = name;
  return c;
}

struct Planned {
  ConfirmRun run;
  std::string config_text, config_path, run_dir, mllog_path;
};

// Refused before anything is written: result files of an earlier run stay as they were.
void refuse_existing_mllogs(const ConfirmRunOptions& o) {
  if (o.mllog_dir.empty()) return;
  for (const auto& s : o.sources)
    for (std::size_t k = 0; k < o.seeds.size(); ++k) {
      const std::string path = confirm_mllog_path(o.mllog_dir, s.optimizer, s.batch, k);
      if (fs::exists(path))
        throw StudyError("--mllog-dir: " + path + " exists already (from an earlier confirmation?); give an " +
                         "empty folder");
    }
}

// One run per (source, seed); `configs[i]` is source i's exported config. Nothing is written yet: a run's
// folder is made when it starts.
std::deque<Planned> plan_runs(const ConfirmRunOptions& o, const std::vector<std::string>& configs, int64_t session,
                              const fs::path& session_dir) {
  std::deque<Planned> queue;
  for (std::size_t i = 0; i < o.sources.size(); ++i) {
    const ConfirmSource& src = o.sources[i];
    for (std::size_t k = 0; k < o.seeds.size(); ++k) {
      const int64_t seed = o.seeds[k];
      Planned p;
      p.run.session = session;
      p.run.optimizer = src.optimizer;
      p.run.source_trial = src.trial.number;
      p.run.seed = seed;
      p.run.batch = src.batch;
      p.config_text = configs[i];
      p.run_dir =
          (session_dir / (p.run.optimizer + "-b" + std::to_string(p.run.batch) + "-seed" + std::to_string(seed)))
              .string();
      p.config_path = p.run_dir + "/config.yaml";
      std::vector<std::string> run_sets = {"seed=" + std::to_string(seed)};
      if (!o.mllog_dir.empty()) {
        p.mllog_path = confirm_mllog_path(o.mllog_dir, p.run.optimizer, p.run.batch, k);
        run_sets.push_back("log.mllog=" + p.mllog_path);
      }
      // What ran: the exported config with its seed (the same --set the trainer applies).
      p.run.config_yaml = TrainConfig::from_yaml(YAML::Load(p.config_text), p.config_path, run_sets).to_yaml_string();
      p.run.log_path = p.run_dir + "/stderr.log";
      queue.push_back(std::move(p));
    }
  }
  return queue;
}

std::string number_text(double v) {
  char buf[64];
  if (std::fabs(v) < 1e15 && v == std::floor(v)) std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string run_name(const ConfirmRun& r) {
  return r.optimizer + " batch " + std::to_string(r.batch) + " seed " + std::to_string(r.seed);
}

std::string run_line(const ConfirmRun& r) {
  return run_name(r) + ": " + describe_exit(r.exit_code) + (r.reason.empty() ? "" : " (" + r.reason + ")") + ", " +
         (r.reached && r.samples_to_target ? "target reached after " + number_text(*r.samples_to_target) + " samples"
                                           : std::string("target not reached"));
}

void take_event(ConfirmRun& run, const TrialEvent& ev, bool& done) {
  if (ev.kind == "eval") {
    run.final_mlm_accuracy = ev.maybe("mlm_accuracy");
  } else if (ev.kind == "done") {
    done = true;
    run.reached = ev.flag("reached");
    run.samples_to_target = ev.maybe("samples_to_target");
    run.seconds_to_target = ev.maybe("seconds_to_target");
    if (auto acc = ev.maybe("final_mlm_accuracy")) run.final_mlm_accuracy = acc;
  }
}

}  // namespace

std::string confirm_mllog_path(const std::string& mllog_dir, const std::string& optimizer, int64_t batch,
                               std::size_t index) {
  return (fs::absolute(mllog_dir) / (optimizer + "-b" + std::to_string(batch)) / "bert" /
          ("result_" + std::to_string(index) + ".txt"))
      .lexically_normal()
      .string();
}

namespace {

// One `study confirm` session: its planned runs, the pool that runs them and what was stored.
class ConfirmSession {
 public:
  ConfirmSession(const ConfirmRunOptions& o, std::ostream& progress)
      : o_(o), progress_(progress), parallel_(std::max(1, o.parallel)), prefix_("study confirm " + o.study + ": ") {}

  ConfirmRunsResult run() {
    std::vector<std::string> configs = prepare();  // every refusal comes before the study file is written
    const std::vector<ConfirmRun> stored = ConfirmStore(result_.db, /*writable=*/false).runs();
    int64_t latest = 0;
    for (const auto& r : stored) latest = std::max(latest, r.session);
    result_.session = o_.resume && latest > 0 ? latest : latest + 1;
    const fs::path session_dir =
        fs::path(result_.db).parent_path() / "confirm" / ("session-" + std::to_string(result_.session));
    queue_ = plan_runs(o_, configs, result_.session, session_dir);
    if (o_.resume) drop_stored_runs(stored);
    total_ = queue_.size();
    ConfirmStore confirm(result_.db, /*writable=*/true);
    store_ = &confirm;
    announce();
    TrialPool pool(pool_options());
    StopSignals stop_signals;
    bool draining = false;
    for (;;) {
      draining = take_interrupt(pool) || draining;
      while (!draining && !queue_.empty() && static_cast<int>(active_.size()) < parallel_) launch_next(pool);
      if (active_.empty()) break;
      pool.step(
          [&](TrialPool::Run& r, const TrialEvent& ev) { take_event(active_.at(r.id).run, ev, active_.at(r.id).done); },
          [&](TrialPool::Run& r, int code) { finish(r, code); });
    }
    result_.drained = draining;
    if (draining)
      say("stopped after " + std::to_string(result_.runs.size()) + " of " + std::to_string(total_) +
          " run(s) were stored");
    return result_;
  }

 private:
  struct Active {
    ConfirmRun run;
    bool done = false;  // its done event arrived
  };

  // Reads the stored study and builds every run's config (checking its --set); returns the configs.
  std::vector<std::string> prepare() {
    if (o_.seeds.empty()) throw std::invalid_argument("study confirm: give at least one seed (--seeds N)");
    result_.db = existing_study_db(o_.dir, o_.study);
    {
      StudyStore store(result_.db, StudyStore::Mode::kReadOnly);
      study_ = stored_study(store, o_.study);
    }
    std::vector<std::string> configs;
    for (const auto& s : o_.sources) {
      configs.push_back(export_yaml(s.trial, o_.sets));
      TrainConfig::from_yaml(YAML::Load(configs.back()),
                             "study " + o_.study + " trial " + std::to_string(s.trial.number));
    }
    if (!o_.resume) refuse_existing_mllogs(o_);  // resumed: the session's own files, replaced if not stored
    // The GPUs and what Slurm can grant are checked, and the threads computed, as for the study's trials.
    resources_ = pool_resources(study_.launcher, parallel_, o_.cores, "stored study " + o_.study);
    return configs;
  }

  // Resume: takes out of the queue the runs the session has stored (kept in result_.earlier); throws when
  // one of them was another trial's or another config's, before anything is written.
  void drop_stored_runs(const std::vector<ConfirmRun>& stored) {
    std::map<std::tuple<std::string, int64_t, int64_t>, const ConfirmRun*> in_session;
    for (const auto& r : stored)
      if (r.session == result_.session) in_session[{r.optimizer, r.batch, r.seed}] = &r;
    std::deque<Planned> left;
    for (auto& p : queue_) {
      const auto it = in_session.find({p.run.optimizer, p.run.batch, p.run.seed});
      if (it == in_session.end()) {
        left.push_back(std::move(p));
        continue;
      }
      const ConfirmRun& done = *it->second;
      if (done.source_trial != p.run.source_trial || done.config_yaml != p.run.config_yaml)
        throw StudyError("study confirm --resume: session " + std::to_string(result_.session) + " ran " +
                         run_name(done) + " from trial " + std::to_string(done.source_trial) +
                         (done.source_trial != p.run.source_trial
                              ? ", now the best is trial " + std::to_string(p.run.source_trial)
                              : " with another config (other --set or --mllog-dir)") +
                         "; run without --resume to start session " + std::to_string(result_.session + 1));
      result_.earlier.push_back(done);
    }
    queue_ = std::move(left);
  }

  void announce() {
    if (o_.quiet) return;
    progress_ << prefix_ << o_.sources.size() << (o_.per_batch ? " (optimizer, batch) pair(s) x " : " optimizer(s) x ")
              << o_.seeds.size() << " seed(s), " << parallel_ << " at a time, " << resources_.threads << " threads each"
              << (study_.launcher.ranks > 1 ? " of " + std::to_string(study_.launcher.ranks) + " ranks" : std::string())
              << " (session " << result_.session
              << (o_.resume ? " resumed: " + std::to_string(result_.earlier.size()) + " run(s) stored before, " +
                                  std::to_string(queue_.size()) + " to run"
                            : std::string())
              << ")\n";
  }

  PoolOptions pool_options() {
    PoolOptions po;
    po.launcher = study_.launcher;
    po.trainer_exe = o_.trainer_exe;
    po.resources = resources_;
    po.trial_timeout = study_.trial_timeout;
    po.kill_grace_s = o_.kill_grace_s;
    po.noun = "run";
    po.self = "study confirm";
    if (!o_.quiet) po.say = [this](const std::string& s) { say(s); };
    return po;
  }

  // True once a signal asked to drain (or to stop now: the pool has stopped the running runs then).
  bool take_interrupt(TrialPool& pool) {
    switch (pool.take_interrupt("interrupted: study confirm was told to stop now (second signal)")) {
      case TrialPool::Interrupt::kStopNow: return true;
      case TrialPool::Interrupt::kDrain:
        say(std::string(pool.drain_signal() == SIGINT ? "interrupted" : "terminated") + ": no new runs; waiting for " +
            std::to_string(active_.size()) + " running run(s) to finish (signal again to stop them now); " +
            std::to_string(queue_.size()) + " run(s) not started are not stored");
        return true;
      case TrialPool::Interrupt::kNone: return false;
    }
    return false;
  }

  // The run's folder and config are written only now: a run that never starts leaves nothing behind.
  void launch_next(TrialPool& pool) {
    Planned& p = queue_.front();
    // A folder left here was never stored (a run cut short, or a session that stored nothing): stale.
    fs::remove_all(p.run_dir);
    fs::create_directories(p.run_dir);
    if (o_.resume && !p.mllog_path.empty()) fs::remove(p.mllog_path);
    std::ofstream(p.config_path) << p.config_text;
    if (!p.mllog_path.empty()) fs::create_directories(fs::path(p.mllog_path).parent_path());
    std::vector<std::string> args = {"--set", "seed=" + std::to_string(p.run.seed)};
    if (!p.mllog_path.empty()) args.insert(args.end(), {"--set", "log.mllog=" + p.mllog_path});
    const int64_t index = next_index_++;
    const std::string job_name = slurm_job_name(study_.launcher.job_name, o_.study + "-confirm", index);
    pool.launch({index, run_name(p.run), p.config_path, p.run_dir, job_name, args});
    active_[index] = Active{p.run, false};
    queue_.pop_front();
  }

  // Stores the run, unless a second signal cut it short (its "not reached" would be untrue).
  void finish(TrialPool::Run& r, int code) {
    Active a = std::move(active_.at(r.id));
    active_.erase(r.id);
    ++ended_;
    ConfirmRun& run = a.run;
    run.exit_code = code;
    const bool finished = code == exit_code::kOk && a.done;
    if (!finished) run.reached = false;
    const std::string counter = "  [" + std::to_string(ended_) + "/" + std::to_string(total_) + "] ";
    if (r.cause == StopCause::kInterrupted && !finished) {
      if (!o_.quiet)
        progress_ << counter << run_name(run) << ": " << r.reason << "; not stored (" << describe_exit(code) << ")\n";
      return;
    }
    if (r.cause != StopCause::kNone && !finished) run.reason = r.reason;
    store_->add(run);
    result_.runs.push_back(run);
    if (!o_.quiet) progress_ << counter << run_line(run) << "\n";
  }

  void say(const std::string& s) {
    if (!o_.quiet) progress_ << prefix_ << s << "\n" << std::flush;
  }

  const ConfirmRunOptions& o_;
  std::ostream& progress_;
  const int parallel_;
  const std::string prefix_;
  ConfirmRunsResult result_;
  StudyConfig study_;
  PoolResources resources_;
  ConfirmStore* store_ = nullptr;  // the session's, while run() runs
  std::deque<Planned> queue_;
  std::map<int64_t, Active> active_;  // by run index
  std::size_t total_ = 0, ended_ = 0;
  int64_t next_index_ = 0;
};

}  // namespace

ConfirmRunsResult run_confirmations(const ConfirmRunOptions& o, std::ostream& progress) {
  return ConfirmSession(o, progress).run();
}

}  // namespace bs::search
