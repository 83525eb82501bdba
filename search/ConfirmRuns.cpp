#include "search/ConfirmRuns.h"

#include <signal.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
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

ConfirmRunsResult run_confirmations(const ConfirmRunOptions& o, std::ostream& progress) {
  if (o.seeds.empty()) throw std::invalid_argument("study confirm: give at least one seed (--seeds N)");
  ConfirmRunsResult result;
  result.db = existing_study_db(o.dir, o.study);
  StudyConfig study;
  {
    StudyStore store(result.db, StudyStore::Mode::kReadOnly);
    study = stored_study(store, o.study);
  }
  // Every run's config is built (and its --set checked) before the study file is written to.
  std::vector<std::string> configs;
  for (const auto& s : o.sources) {
    configs.push_back(export_yaml(s.trial, o.sets));
    TrainConfig::from_yaml(YAML::Load(configs.back()), "study " + o.study + " trial " + std::to_string(s.trial.number));
  }
  refuse_existing_mllogs(o);
  const int parallel = std::max(1, o.parallel);
  // The GPUs and what Slurm can grant are checked, and the threads computed, as for the study's trials.
  PoolResources resources = pool_resources(study.launcher, parallel, o.cores, "stored study " + o.study);

  ConfirmStore confirm(result.db, /*writable=*/true);
  result.session = confirm.next_session();
  const fs::path session_dir =
      fs::path(result.db).parent_path() / "confirm" / ("session-" + std::to_string(result.session));
  std::deque<Planned> queue = plan_runs(o, configs, result.session, session_dir);
  const std::string prefix = "study confirm " + o.study + ": ";
  if (!o.quiet)
    progress << prefix << o.sources.size() << (o.per_batch ? " (optimizer, batch) pair(s) x " : " optimizer(s) x ")
             << o.seeds.size() << " seed(s), " << parallel << " at a time, " << resources.threads << " threads each"
             << (study.launcher.ranks > 1 ? " of " + std::to_string(study.launcher.ranks) + " ranks" : std::string())
             << " (session " << result.session << ")\n";

  PoolOptions po;
  po.launcher = study.launcher;
  po.trainer_exe = o.trainer_exe;
  po.resources = std::move(resources);
  po.trial_timeout = study.trial_timeout;
  po.kill_grace_s = o.kill_grace_s;
  po.noun = "run";
  po.self = "study confirm";
  if (!o.quiet) po.say = [&](const std::string& s) { progress << prefix << s << "\n" << std::flush; };
  TrialPool pool(std::move(po));

  struct Active {
    ConfirmRun run;
    bool done = false;  // its done event arrived
  };
  std::map<int64_t, Active> active;  // by run index
  const std::size_t total = queue.size();
  int64_t next_index = 0;
  std::size_t ended = 0;
  StopSignals stop_signals;
  bool draining = false;
  for (;;) {
    switch (pool.take_interrupt("interrupted: study confirm was told to stop now (second signal)")) {
      case TrialPool::Interrupt::kStopNow: draining = true; break;
      case TrialPool::Interrupt::kDrain:
        draining = true;
        if (!o.quiet)
          progress << prefix << (pool.drain_signal() == SIGINT ? "interrupted" : "terminated")
                   << ": no new runs; waiting for " << active.size() << " running run(s) to finish (signal again to "
                   << "stop them now); " << queue.size() << " run(s) not started are not stored\n"
                   << std::flush;
        break;
      case TrialPool::Interrupt::kNone: break;
    }
    while (!draining && !queue.empty() && static_cast<int>(active.size()) < parallel) {
      Planned& p = queue.front();
      fs::create_directories(p.run_dir);
      std::ofstream(p.config_path) << p.config_text;
      if (!p.mllog_path.empty()) fs::create_directories(fs::path(p.mllog_path).parent_path());
      std::vector<std::string> args = {"--set", "seed=" + std::to_string(p.run.seed)};
      if (!p.mllog_path.empty()) args.insert(args.end(), {"--set", "log.mllog=" + p.mllog_path});
      const int64_t index = next_index++;
      const std::string job_name = slurm_job_name(study.launcher.job_name, o.study + "-confirm", index);
      pool.launch({index, run_name(p.run), p.config_path, p.run_dir, job_name, args});
      active[index] = Active{p.run, false};
      queue.pop_front();
    }
    if (active.empty()) break;
    pool.step(
        [&](TrialPool::Run& r, const TrialEvent& ev) { take_event(active.at(r.id).run, ev, active.at(r.id).done); },
        [&](TrialPool::Run& r, int code) {
          Active a = std::move(active.at(r.id));
          active.erase(r.id);
          ++ended;
          ConfirmRun& run = a.run;
          run.exit_code = code;
          const bool finished = code == exit_code::kOk && a.done;
          if (!finished) run.reached = false;
          if (r.cause == StopCause::kInterrupted && !finished) {
            if (!o.quiet)
              progress << "  [" << ended << "/" << total << "] " << run_name(run) << ": " << r.reason
                       << "; not stored (" << describe_exit(code) << ")\n";
            return;
          }
          if (r.cause != StopCause::kNone && !finished) run.reason = r.reason;
          confirm.add(run);
          result.runs.push_back(run);
          if (!o.quiet) progress << "  [" << ended << "/" << total << "] " << run_line(run) << "\n";
        });
  }
  result.drained = draining;
  if (draining && !o.quiet)
    progress << prefix << "stopped after " << result.runs.size() << " of " << total << " run(s) were stored\n";
  return result;
}

}  // namespace bs::search
