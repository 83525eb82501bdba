#include "analysis/ConfirmRunner.h"

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <list>
#include <memory>
#include <ostream>
#include <sstream>
#include <thread>

#include "analysis/Report.h"
#include "analysis/StudyTables.h"
#include "common/TrainConfig.h"
#include "search/StudyConfig.h"
#include "search/TrialEvent.h"
#include "search/TrialLauncher.h"
#include "studies/ConfigExport.h"
#include "studies/StudyStore.h"

namespace bs::analysis {
namespace fs = std::filesystem;

namespace {

// The launcher of the study (mpirun ranks...), so that a confirmation runs as the trials did.
search::LauncherConfig study_launcher(const StudyStore& store, const std::string& name) {
  auto yaml = store.study_config(name);
  if (!yaml) return {};
  try {
    return search::StudyConfig::from_yaml(YAML::Load(*yaml), "stored study " + name).launcher;
  } catch (const std::exception&) {
    return {};
  }
}

struct Pending {
  ConfirmRun run;
  std::string config_path, run_dir, mllog_path;
};

struct Active {
  ConfirmRun run;
  std::unique_ptr<search::TrialProcess> process;
};

void take_events(Active& a) {
  for (const auto& line : a.process->read_lines()) {
    auto ev = search::parse_trial_event(line);
    if (!ev) continue;
    if (ev->kind == "eval") {
      a.run.final_mlm_accuracy = ev->maybe("mlm_accuracy");
    } else if (ev->kind == "done") {
      a.run.reached = ev->flag("reached");
      a.run.samples_to_target = ev->maybe("samples_to_target");
      a.run.seconds_to_target = ev->maybe("seconds_to_target");
      if (auto acc = ev->maybe("final_mlm_accuracy")) a.run.final_mlm_accuracy = acc;
    }
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

// The best trial of each optimizer (or optimizer and batch) that has a samples-to-target to confirm. A best
// trial that never reached the target would only spend max_samples per seed; metric objectives without a
// target keep every trial.
std::vector<TrialRecord> trials_to_confirm(const ConfirmOptions& o, const StudyStore& store, const std::string& db,
                                           std::ostream& progress) {
  const auto objective = StudyObjective::of_study(store, o.study);
  const auto candidates = o.per_batch ? best_per_optimizer_and_batch(store.trials(), objective)
                                      : best_per_optimizer(store.trials(), objective);
  if (candidates.empty())
    throw StudyError("study '" + o.study + "' (" + db + ") has no COMPLETE trial to confirm yet " +
                     "(see bertsweep study status " + o.study + ")");
  std::vector<TrialRecord> best;
  for (const auto& t : candidates) {
    if (objective.metric == "final_mlm_accuracy" || t.reached || o.include_unreached) {
      best.push_back(t);
    } else if (!o.quiet) {
      progress << "study confirm " << o.study << ": skipping " << trial_optimizer(t)
               << (o.per_batch ? " batch " + std::to_string(trial_batch(t)) : std::string()) << ": its best trial "
               << t.number << " did not reach the target (--include-unreached runs it anyway)\n";
    }
  }
  if (best.empty())
    throw StudyError("study '" + o.study + "': no trial reached the target yet, so there is no samples-to-target " +
                     "to confirm (run more trials, or pass --include-unreached)");
  return best;
}

// Refused before anything is written: result files of an earlier run stay as they were.
void refuse_existing_mllogs(const ConfirmOptions& o, const std::vector<TrialRecord>& best) {
  if (o.mllog_dir.empty()) return;
  for (const auto& t : best)
    for (std::size_t k = 0; k < o.seeds.size(); ++k) {
      const std::string path = confirm_mllog_path(o.mllog_dir, trial_optimizer(t), trial_batch(t), k);
      if (fs::exists(path))
        throw StudyError("--mllog-dir: " + path + " exists already (from an earlier confirmation?); give an " +
                         "empty folder");
    }
}

// One run per (trial, seed), its folder and config.yaml written under session_dir.
std::deque<Pending> plan_runs(const ConfirmOptions& o, const std::vector<TrialRecord>& best,
                              const std::vector<std::string>& configs, int64_t session, const fs::path& session_dir) {
  std::deque<Pending> queue;
  for (std::size_t i = 0; i < best.size(); ++i) {
    const TrialRecord& t = best[i];
    const std::string& cfg = configs[i];
    for (std::size_t k = 0; k < o.seeds.size(); ++k) {
      const int64_t seed = o.seeds[k];
      Pending p;
      p.run.session = session;
      p.run.optimizer = trial_optimizer(t);
      p.run.source_trial = t.number;
      p.run.seed = seed;
      p.run.batch = trial_batch(t);
      p.run_dir =
          (session_dir / (p.run.optimizer + "-b" + std::to_string(p.run.batch) + "-seed" + std::to_string(seed)))
              .string();
      fs::create_directories(p.run_dir);
      p.config_path = p.run_dir + "/config.yaml";
      std::ofstream(p.config_path) << cfg;
      std::vector<std::string> run_sets = {"seed=" + std::to_string(seed)};
      if (!o.mllog_dir.empty()) {
        p.mllog_path = confirm_mllog_path(o.mllog_dir, p.run.optimizer, p.run.batch, k);
        fs::create_directories(fs::path(p.mllog_path).parent_path());
        run_sets.push_back("log.mllog=" + p.mllog_path);
      }
      // What ran: the exported config with its seed (the same --set the trainer applies).
      p.run.config_yaml = TrainConfig::from_yaml(YAML::Load(cfg), p.config_path, run_sets).to_yaml_string();
      p.run.log_path = p.run_dir + "/stderr.log";
      queue.push_back(std::move(p));
    }
  }
  return queue;
}

Active launch(const Pending& p, const search::LauncherConfig& launcher, const ConfirmOptions& o, int threads) {
  auto spec = search::trainer_launch(launcher, o.trainer_exe, p.config_path, threads, p.run_dir);
  spec.argv.insert(spec.argv.end(), {"--set", "seed=" + std::to_string(p.run.seed)});
  if (!p.mllog_path.empty()) spec.argv.insert(spec.argv.end(), {"--set", "log.mllog=" + p.mllog_path});
  return Active{p.run, std::make_unique<search::TrialProcess>(spec)};
}

std::string run_line(const ConfirmRun& r, int code) {
  return r.optimizer + " batch " + std::to_string(r.batch) + " seed " + std::to_string(r.seed) + ": " +
         search::describe_exit(code) + ", " +
         (r.reached && r.samples_to_target ? "target reached after " + format_number(*r.samples_to_target) + " samples"
                                           : std::string("target not reached"));
}

}  // namespace

ConfirmResult run_confirm(const ConfirmOptions& o, std::ostream& progress) {
  if (o.seeds.empty()) throw std::invalid_argument("study confirm: give at least one seed (--seeds N)");
  const std::string db = existing_study_db(o.dir, o.study);
  StudyStore store(db, StudyStore::Mode::kReadOnly);
  const std::vector<TrialRecord> best = trials_to_confirm(o, store, db, progress);
  const auto launcher = study_launcher(store, o.study);
  // Every run's config is built (and its --set checked) before the study file is written to.
  std::vector<std::string> configs;
  for (const auto& t : best) {
    configs.push_back(export_yaml(t, o.sets));
    TrainConfig::from_yaml(YAML::Load(configs.back()), "study " + o.study + " trial " + std::to_string(t.number));
  }
  refuse_existing_mllogs(o, best);

  ConfirmStore confirm(db, /*writable=*/true);
  ConfirmResult result;
  result.session = confirm.next_session();
  const fs::path session_dir = fs::path(db).parent_path() / "confirm" / ("session-" + std::to_string(result.session));
  std::deque<Pending> queue = plan_runs(o, best, configs, result.session, session_dir);
  const int parallel = std::max(1, o.parallel);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = std::max(1, cores / parallel);
  if (!o.quiet)
    progress << "study confirm " << o.study << ": " << best.size()
             << (o.per_batch ? " (optimizer, batch) pair(s) x " : " optimizer(s) x ") << o.seeds.size() << " seed(s), "
             << parallel << " at a time, " << threads << " threads each (session " << result.session << ")\n";

  std::list<Active> active;
  const std::size_t total = queue.size();
  while (!queue.empty() || !active.empty()) {
    while (!queue.empty() && static_cast<int>(active.size()) < parallel) {
      active.push_back(launch(queue.front(), launcher, o, threads));
      queue.pop_front();
    }
    for (auto it = active.begin(); it != active.end();) {
      take_events(*it);
      auto code = it->process->poll_exit();
      if (!code || !it->process->events_closed()) {
        ++it;
        continue;
      }
      it->run.exit_code = *code;
      if (*code != 0) it->run.reached = false;
      confirm.add(it->run);
      result.runs.push_back(it->run);
      if (!o.quiet) progress << "  [" << result.runs.size() << "/" << total << "] " << run_line(it->run, *code) << "\n";
      it = active.erase(it);
    }
    if (!active.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::vector<ConfirmRun> session_runs;
  for (const auto& r : confirm.runs())
    if (r.session == result.session) session_runs.push_back(r);
  result.summary = summarize_confirm(session_runs);
  return result;
}

std::string confirm_summary_text(const std::vector<ConfirmSummary>& summary) {
  std::ostringstream os;
  os << "optimizer    batch  trial  runs  reached  samples to target (mean +- std)\n";
  for (const auto& s : summary) {
    char head[160];
    std::snprintf(head, sizeof head, "%-12s %5lld  %5lld %5d %8d  ", s.optimizer.c_str(),
                  static_cast<long long>(s.batch), static_cast<long long>(s.source_trial), s.runs, s.reached);
    os << head
       << (s.samples.n ? format_number(s.samples.mean) + " +- " + format_number(s.samples.std) : std::string("-"))
       << "\n";
  }
  return os.str();
}

}  // namespace bs::analysis
