// `study export` and `study confirm`: parse options, call studies/ConfigExport; for confirm, the trials
// analysis/ConfirmSelection picks are run by search/ConfirmRuns and summarised by analysis again.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>

#include <yaml-cpp/yaml.h>

#include "analysis/ConfirmSelection.h"
#include "analysis/Report.h"
#include "analysis/StudyTables.h"
#include "cli/Args.h"
#include "cli/Commands.h"
#include "common/Errors.h"
#include "common/TrainConfig.h"
#include "search/ConfirmRuns.h"
#include "studies/ConfigExport.h"
#include "studies/StudyStore.h"

namespace bs::cli {
namespace fs = std::filesystem;

namespace {

const char* kExportHelp = R"(usage: bertsweep study export NAME [--best] [--where k=v[,k=v...]]... [--top K] [--trial N]
                              [--format yaml|mlperf-json|nvidia-config] [--out FILE] [--set key.path=value]...
                              [--scale-lr linear|sqrt|none] [--nodes N] [--gpus-per-node G] [--dir studies/]

Writes the best trial's resolved training config: as YAML that `bertsweep train --config FILE` runs unchanged
(the stored config with numbers in their shortest exact form; with --set it is re-read, overridden and written
back, e.g. for the production scale: --set data.dir=/data/bert --set batch.micro=32), as MLPerf-style
hyperparameter JSON (global_batch_size, opt_base_learning_rate, opt_lamb_beta_1, gradient_accumulation_steps,
per_device_batch_size, the model shape, precision, MLPerf BERT's eval settings, the trial's seed and
provenance), or as the shell variables NVIDIA's MLPerf BERT run_and_time.sh reads from a config_<SYSTEM>.sh
(BATCHSIZE per GPU, GRADIENT_STEPS, LR, MAX_STEPS, WARMUP_STEPS, OPT_LAMB_BETA_1/2, WEIGHT_DECAY_RATE,
EVAL_ITER_START_SAMPLES, EVAL_ITER_SAMPLES, DGXNNODES, DGXNGPU, SEED, ...). All formats hold the same values.

  --best           choose by rank (the default): COMPLETE trials that reached the target first, then by the
                   study's objective and direction (as stored in the study; samples_to_target ascending by default)
  --where k=v,...  only trials whose resolved config has these values; short keys: optimizer (optimizer.name),
                   batch (batch.global), lr (optimizer.lr), sampler (data.sampler), schedule (schedule.name),
                   clip (clip.mode); any training key path works (optimizer.beta2=0.999). Numbers compare by value.
  --top K          export the K best: FILE gets a -1, -2, ... suffix before its extension (best.yaml ->
                   best-1.yaml, best-2.yaml, ...); fewer files when fewer trials match
  --trial N        export trial N instead of the best (it must be COMPLETE)
  --format F       yaml (default), mlperf-json or nvidia-config
  --out FILE       where to write (default: standard output; "-" too)
  --set k=v        override a training key of the exported config (repeatable)
  --scale-lr M     linear, sqrt or none (default): rescale the trial's learning rate to the production batch
                   given with --set batch.global=N (lr * N/B, or lr * sqrt(N/B), B the trial's batch)
  --nodes N        nodes of the production run (default 1)
  --gpus-per-node G  GPUs per node (default 1); N*G must divide the global batch (exit 2 otherwise)
  --dir DIR        where studies live (default studies/)

exit codes: 0 ok, 2 usage/config error, 7 unknown study, no COMPLETE trial, or --where matches nothing
)";

const char* kConfirmHelp = R"(usage: bertsweep study confirm NAME [--seeds N|S1,S2,...] [--per-batch] [--parallel K]
                               [--include-unreached] [--set key.path=value]... [--mllog-dir DIR]
                               [--resume] [--dir studies/] [--quiet]

Re-runs the best config of each optimizer of the study (the `study export --best --where optimizer=X` config)
with several seeds: `bertsweep train --config <cfg> --set seed=S --events fd:3 --quiet`, under the study's
launcher (ranks, cpus_per_trial, mpirun/srun, GPUs), K at a time (threads per rank as `study run` computes
them for parallel K). Each run is stored in the study file (table bs_confirm,
written only by this command; runs under studies/NAME/confirm/session-N/), and the mean +- std of samples to
target per optimizer (and batch) is printed; `bertsweep report` includes the latest session of each pair and,
with several batch sizes per optimizer, plots samples to target vs batch size with error bars.

  --seeds N        N seeds 1..N (default 5), or an explicit comma list of seeds
  --per-batch      confirm the best trial of every (optimizer, batch.global) pair instead of every optimizer
  --parallel K     runs at a time (default 1)
  --include-unreached  also re-run a best trial that never reached the target (skipped by default: it has
                   no samples to target to confirm, and each seed would spend target.max_samples)
  --set k=v        override a training key of every run (repeatable)
  --mllog-dir DIR  also write each run's MLLOG as DIR/<optimizer>-b<batch>/bert/result_N.txt (N = 0, 1, ...
                   over the seeds): the results/<system>/<benchmark>/ layout MLPerf's package and RCP checkers
                   read (e.g. python -m mlperf_logging.rcp_checker DIR/lamb-b32/bert); refused when a
                   result_N.txt it would write exists already (except with --resume)
  --resume         continue the latest session instead of starting a new one: run only the (pair, seed) runs
                   it has not stored (after a Ctrl-C, a lost machine or a session that ran out of time);
                   refused when it stored a run of another trial for a pair (the study's best changed) or
                   of another config (--set, --mllog-dir); with no session yet it starts session 1

Runs go through the controller's trial pool: the study's trial_timeout stops a run without an event for that
long (stored with its exit code and reason, as not reached), launcher.queue_timeout a Slurm job that does not
start. Ctrl-C (SIGINT/SIGTERM) drains: no new run starts, running ones finish and are stored; runs not
started are not stored. A second signal stops the running runs (SIGTERM, SIGKILL after 10 s; those cut short
are not stored), a third kills at once.

exit codes: 0 ok (at least one run of the session finished), 2 usage error, 7 unknown study / no COMPLETE trial / none reached
the target / every run failed, 6 stopped by SIGINT/SIGTERM (drained, as `study run`)
)";

Argv strip_subcommand(const Argv& args, const std::string& sub) {
  if (!args.empty() && args[0] == sub) return Argv(args.begin() + 1, args.end());
  return args;
}

std::string numbered(const std::string& out, int i) {
  fs::path p(out);
  return (p.parent_path() / (p.stem().string() + "-" + std::to_string(i) + p.extension().string())).string();
}

// `--out exports/x.yaml` may create exports/ (relative paths are made beneath the current folder), but an
// absolute path's folder must exist: a typo such as /nonexistent/dir/x would otherwise make folders at /.
void check_output_parent(const std::string& out) {
  const fs::path parent = fs::path(out).parent_path();
  std::error_code ec;
  if (parent.empty() || fs::is_directory(parent, ec)) return;
  if (fs::exists(parent, ec)) throw UsageError("--out " + out + ": " + parent.string() + " is not a folder");
  if (fs::path(out).is_absolute())
    throw UsageError("--out " + out + ": the folder " + parent.string() +
                     " does not exist (create it first, or give a path relative to the current folder)");
}

// Why nothing matched: the values the COMPLETE trials do have for each --where key.
std::string where_hint(const std::vector<TrialRecord>& trials, const TrialFilter& filter) {
  std::string hint;
  for (const auto& [key, wanted] : filter.terms()) {
    std::set<std::string> seen;
    for (const auto& t : trials)
      if (t.state == trial_state::kComplete && !t.config_yaml.empty()) seen.insert(t.config().text(key));
    std::string vals;
    for (const auto& v : seen) vals += (vals.empty() ? "" : ", ") + v;
    hint += (hint.empty() ? "" : "; ") + key + " of the COMPLETE trials: " + (vals.empty() ? "none" : vals);
  }
  return hint;
}

std::string describe_trial(const TrialRecord& t) {
  return "trial " + std::to_string(t.number) + " (" + analysis::trial_optimizer(t) + ", batch " +
         std::to_string(analysis::trial_batch(t)) + ", " +
         (t.reached && t.samples_to_target
              ? "target after " + analysis::format_number(*t.samples_to_target) + " samples"
              : std::string("target not reached")) +
         ")";
}

struct ExportOptions {
  std::string name, format, scale_lr, out, dir;
  ProductionLayout layout;
  long long top = 1;
  std::optional<long long> trial;  // --trial N instead of the best
  TrialFilter filter;
  std::vector<std::string> sets;
};

ExportOptions parse_export_options(const Args& a) {
  a.allow_only(
      {"best", "where", "top", "trial", "format", "out", "set", "dir", "scale-lr", "nodes", "gpus-per-node", "help"});
  if (a.positional().size() != 1) throw UsageError("give the study NAME (one)");
  ExportOptions o;
  o.name = a.positional()[0];
  o.format = a.get("format", "yaml");
  if (o.format != "yaml" && o.format != "mlperf-json" && o.format != "nvidia-config")
    throw UsageError("--format must be yaml, mlperf-json or nvidia-config, got '" + o.format + "'");
  o.scale_lr = a.get("scale-lr", "none");
  if (o.scale_lr != "linear" && o.scale_lr != "sqrt" && o.scale_lr != "none")
    throw UsageError("--scale-lr must be linear, sqrt or none, got '" + o.scale_lr + "'");
  o.layout.nodes = a.get_int("nodes", 1);
  o.layout.gpus_per_node = a.get_int("gpus-per-node", 1);
  if (o.layout.nodes < 1) throw UsageError("--nodes must be >= 1");
  if (o.layout.gpus_per_node < 1) throw UsageError("--gpus-per-node must be >= 1");
  o.top = a.get_int("top", 1);
  if (o.top < 1) throw UsageError("--top must be >= 1");
  o.out = a.get("out", "-");
  if (o.top > 1 && o.out == "-") throw UsageError("--top K needs --out FILE (files FILE-1, FILE-2, ... are written)");
  o.filter = TrialFilter::parse(a.all("where"));
  o.sets = a.all("set");
  if (o.out != "-") {
    refuse_output_in_study(o.out, "--out");  // the numbered files of --top lie in the same folder
    check_output_parent(o.out);
  }
  if (a.has("trial")) o.trial = a.get_int("trial", -1);
  o.dir = a.get("dir", "studies");
  return o;
}

// --trial N, or the best --top K complete trials that match --where.
std::vector<TrialRecord> trials_to_export(const ExportOptions& o, const StudyStore& store) {
  const auto objective = StudyObjective::of_study(store, o.name);
  const auto trials = store.trials();
  if (o.trial) {
    auto t = store.trial(*o.trial);
    if (!t) throw StudyError("study '" + o.name + "' has no trial " + std::to_string(*o.trial));
    if (t->state != trial_state::kComplete)
      throw StudyError("trial " + std::to_string(*o.trial) + " of study '" + o.name + "' is " + t->state +
                       ", not COMPLETE: only complete trials are exported");
    return {*t};
  }
  auto ranked = rank_trials(trials, objective);
  if (ranked.empty())
    throw StudyError("study '" + o.name + "' has no COMPLETE trial yet (" + std::to_string(trials.size()) +
                     " trials; see bertsweep study status " + o.name + ")");
  ranked = rank_trials(trials, objective, o.filter);
  if (ranked.empty())
    throw StudyError("no COMPLETE trial of study '" + o.name + "' matches --where " + o.filter.describe() + " (" +
                     where_hint(trials, o.filter) + ")");
  ranked.resize(std::min<std::size_t>(ranked.size(), static_cast<std::size_t>(o.top)));
  return ranked;
}

// One trial's exported text in o.format, with --set (and --scale-lr) applied.
std::string export_text(const ExportOptions& o, const TrialRecord& t) {
  const std::string source = "trial " + std::to_string(t.number);
  std::vector<std::string> trial_sets = o.sets;
  if (o.scale_lr != "none") {
    const std::string stored = o.dir + "/" + o.name + "/study.db " + source + " (bs_trials.config_yaml)";
    const TrainConfig trial = TrainConfig::from_yaml(yaml::load_stored(t.config_yaml, stored), source);
    const TrainConfig prod = TrainConfig::from_yaml(yaml::load_stored(t.config_yaml, stored), source, o.sets);
    const double lr = scaled_learning_rate(trial.optimizer.lr, trial.batch.global, prod.batch.global, o.scale_lr);
    trial_sets.push_back("optimizer.lr=" + shortest_number(lr));
    std::cerr << "bertsweep study export: --scale-lr " << o.scale_lr << ": lr " << shortest_number(trial.optimizer.lr)
              << " at batch " << trial.batch.global << " -> " << shortest_number(lr) << " at batch "
              << prod.batch.global << "\n";
  }
  std::string text = export_yaml(t, trial_sets);
  const TrainConfig config = TrainConfig::from_yaml(
      yaml::load_stored(text, o.dir + "/" + o.name + "/study.db " + source + " (bs_trials.config_yaml)"), source);
  const ProductionLayout& layout = o.layout;
  if (config.batch.global % layout.devices() != 0)
    throw UsageError("the global batch " + std::to_string(config.batch.global) + " of " + source +
                     " is not divisible by --nodes " + std::to_string(layout.nodes) + " x --gpus-per-node " +
                     std::to_string(layout.gpus_per_node) + " = " + std::to_string(layout.devices()) +
                     " devices; choose a layout that divides it, or --set batch.global=N with N a multiple of " +
                     std::to_string(layout.devices()));
  if (o.format == "mlperf-json") text = export_mlperf_json(config, t, o.name, layout);
  if (o.format == "nvidia-config") text = export_nvidia_config(config, t, o.name, layout);
  return text;
}

void write_export(const ExportOptions& o, const TrialRecord& t, const std::string& text, std::size_t index) {
  if (o.out == "-") {
    std::cout << text;
    std::cerr << "bertsweep study export: " << describe_trial(t) << "\n";
    return;
  }
  const std::string path = o.top > 1 ? numbered(o.out, static_cast<int>(index) + 1) : o.out;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw UsageError("--out " + path + " is a folder; give a file name");
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  if (!f) throw std::runtime_error(path + ": cannot write the exported config (check the folder is writable)");
  std::cerr << "bertsweep study export: " << describe_trial(t) << " -> " << path << "\n";
}

int export_study(const Args& a) {
  const ExportOptions o = parse_export_options(a);
  StudyStore store(existing_study_db(o.dir, o.name), StudyStore::Mode::kReadOnly);
  const std::vector<TrialRecord> chosen = trials_to_export(o, store);
  if (static_cast<long long>(chosen.size()) < o.top)
    std::cerr << "bertsweep study export: only " << chosen.size() << " trial(s) match; writing " << chosen.size()
              << " file(s)\n";
  if (o.scale_lr != "none")
    for (const auto& set : o.sets)
      if (set.rfind("optimizer.lr=", 0) == 0)
        throw UsageError("--scale-lr " + o.scale_lr +
                         " rescales the trial's learning rate; it cannot be combined with --set " + set +
                         " (drop one of them)");
  // Every text first: a layout that does not divide some trial's batch writes nothing.
  std::vector<std::string> texts;
  for (const TrialRecord& t : chosen) texts.push_back(export_text(o, t));
  for (std::size_t i = 0; i < chosen.size(); ++i) write_export(o, chosen[i], texts[i], i);
  return exit_code::kOk;
}

std::vector<int64_t> parse_seeds(const std::string& s) {
  std::vector<int64_t> seeds;
  try {
    if (s.find(',') == std::string::npos) {
      long long n = std::stoll(s);
      if (n < 1) throw UsageError("--seeds must be >= 1");
      for (long long i = 1; i <= n; ++i) seeds.push_back(i);
    } else {
      std::stringstream ss(s);
      for (std::string p; std::getline(ss, p, ',');)
        if (!p.empty()) seeds.push_back(std::stoll(p));
    }
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception&) {
    throw UsageError("--seeds must be a count (5) or a comma list of seeds (1,2,3), got '" + s + "'");
  }
  return seeds;
}

int confirm_study(const Args& a) {
  a.allow_only(
      {"seeds", "per-batch", "include-unreached", "parallel", "set", "dir", "quiet", "mllog-dir", "resume", "help"});
  if (a.positional().size() != 1) throw UsageError("give the study NAME (one)");
  search::ConfirmRunOptions o;
  o.study = a.positional()[0];
  o.dir = a.get("dir", "studies");
  o.seeds = parse_seeds(a.get("seeds", "5"));
  if (o.seeds.empty()) throw std::invalid_argument("study confirm: give at least one seed (--seeds N)");
  o.parallel = static_cast<int>(a.get_int("parallel", 1));
  if (o.parallel < 1) throw UsageError("--parallel must be >= 1");
  o.sets = a.all("set");
  for (const auto& set : o.sets) {  // before the study is read: a typo is a usage error whatever the study holds
    const std::string key = set.substr(0, set.find('='));
    if (set.find('=') == std::string::npos || !TrainConfig::is_key(key))
      throw UsageError("--set " + set + ": unknown training key '" + key + "' (see `bertsweep train --help`)");
  }
  o.quiet = a.has("quiet");
  o.mllog_dir = a.get("mllog-dir", "");
  if (a.has("mllog-dir") && o.mllog_dir.empty()) throw UsageError("--mllog-dir needs a folder");
  if (!o.mllog_dir.empty() && fs::exists(o.mllog_dir) && !fs::is_directory(o.mllog_dir))
    throw UsageError("--mllog-dir " + o.mllog_dir + " is not a folder");
  o.per_batch = a.has("per-batch");
  o.resume = a.has("resume");
  o.trainer_exe = self_exe();
  const analysis::ConfirmChoice choice{o.dir, o.study, o.per_batch, a.has("include-unreached"), o.quiet};
  for (const auto& t : analysis::trials_to_confirm(choice, std::cerr))
    o.sources.push_back({t, analysis::trial_optimizer(t), analysis::trial_batch(t)});
  const auto result = search::run_confirmations(o, std::cerr);
  std::cout << analysis::confirm_summary_text(analysis::confirm_session_summary(result.db, result.session));
  if (result.drained) {  // as `study run` after a drain
    std::cerr << "bertsweep study confirm: stopped by a signal; the runs that finished are stored (session "
              << result.session << ")\n";
    return exit_code::kTerminated;
  }
  for (const auto* runs : {&result.runs, &result.earlier})
    for (const auto& r : *runs)
      if (r.exit_code == 0) return exit_code::kOk;
  std::cerr << "bertsweep study confirm: every run failed; see the logs under " << o.dir << "/" << o.study
            << "/confirm/session-" << result.session << "/\n";
  return exit_code::kStudy;
}

template <class F>
int guarded(const std::string& sub, F&& f) {
  try {
    return f();
  } catch (const Error& e) {  // an unknown study or nothing to export (7), a bad option or config (2)
    std::cerr << describe(e, "bertsweep study " + sub) << "\n";
    return e.exit_code();
  } catch (const std::runtime_error& e) {  // a damaged study file, or a write that failed
    std::cerr << "bertsweep study " << sub << ": " << e.what() << "\n";
    return exit_code::kStudy;
  }
}

}  // namespace

int study_export_command(const Argv& args) {
  Args a(strip_subcommand(args, "export"), {"best", "help"});
  if (a.has("help")) {
    std::cout << kExportHelp;
    return exit_code::kOk;
  }
  return guarded("export", [&] { return export_study(a); });
}

int study_confirm_command(const Argv& args) {
  Args a(strip_subcommand(args, "confirm"), {"quiet", "per-batch", "include-unreached", "resume", "help"});
  if (a.has("help")) {
    std::cout << kConfirmHelp;
    return exit_code::kOk;
  }
  return guarded("confirm", [&] { return confirm_study(a); });
}

}  // namespace bs::cli
