// bertsweep study run|resume|status: parse options, then hand over to the search controller.
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "cli/Args.h"
#include "cli/Commands.h"
#include "common/ExitCodes.h"
#include "common/TrainConfig.h"
#include "search/Controller.h"
#include "search/StudyConfig.h"

namespace bs::cli {

namespace {

const char* kHelp = R"(usage:
  bertsweep study run     --config FILE [--name NAME] [--dir studies/] [--set key=value]... [--quiet]
  bertsweep study resume  NAME [--dir studies/] [--quiet]
  bertsweep study status  NAME [--dir studies/]

run      creates the study <dir>/<NAME>/ (study.db: Optuna's tables + bertsweep's bs_* tables;
         trials/NNNN/: config.yaml, stdout.log, stderr.log) or continues it when the same search was
         started before. --set overrides a study key (n_trials=20, parallel=2) or, as base.<key.path>,
         a key of the base training config (base.data.dir=/data/brown).
resume   continues a study after its controller stopped or was killed: trials left running are marked
         failed (reason "controller died") or re-queued (retry_failed), then it runs to n_trials.
status   the trials, best first, and the count per state.

Ctrl-C (or SIGTERM) during run/resume: no new trials start and the running ones finish and are recorded
(exit 6); a second Ctrl-C stops them at once (resume re-queues them).

Study config keys: name, objective (samples_to_target | seconds_to_target | final_mlm_accuracy, or a
list for multi-objective), direction, sampler (tpe|cmaes|random|grid|qmc), pruner (median|
successive_halving|hyperband|none), n_trials, parallel, seed, retry_failed, trial_timeout, base or
base_config, space, derived, stratify (choice parameters whose every combination gets an equal share of
the trials), launcher {kind: local|mpirun|srun, ranks, hostfile, extra_args, gpus_per_trial, gpus}.
See configs/studies/.
GPU trials: launcher.gpus_per_trial N (default 0: CPU trials) gives each running trial its own N GPUs
(CUDA_VISIBLE_DEVICES, exported with mpirun -x; srun also gets --gpus-per-task or --gres) and
`--set device=cuda`; launcher.gpus [0, 1, ...] lists the GPU ids to use (default: those in the
controller's CUDA_VISIBLE_DEVICES, else every GPU of the machine; under srun, ids of the allocation).
parallel x gpus_per_trial above the GPUs is a config error (exit 2) before any trial starts. `status`
shows each trial's GPUs.
A trial that misses the target scores 2 * target.max_samples (samples_to_target) or
1e7 + seconds run (seconds_to_target), so it never ranks above one that reached it.
)";

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot read /proc/self/exe: " + ec.message());
  return p.string();
}

int run_study(search::StudyConfig config, const Args& a) {
  search::ControllerOptions o;
  o.dir = a.get("dir", "studies");
  o.quiet = a.has("quiet");
  o.trainer_exe = self_exe();
  return search::Controller(std::move(config), o).run();
}

}  // namespace

int study_command(const Argv& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kHelp;
    return args.empty() ? exit_code::kUsage : exit_code::kOk;
  }
  const std::string sub = args[0];
  // export/confirm parse their own options (cli/ExportCommand.cpp: --best is a flag there).
  if (sub == "export") return study_export_command(Argv(args.begin() + 1, args.end()));
  if (sub == "confirm") return study_confirm_command(Argv(args.begin() + 1, args.end()));
  Args a(Argv(args.begin() + 1, args.end()), {"quiet", "help"});
  if (a.has("help")) {
    std::cout << kHelp;
    return exit_code::kOk;
  }
  try {
    if (sub == "run") {
      a.allow_only({"config", "name", "dir", "set", "quiet", "help"});
      if (!a.positional().empty()) throw UsageError("unexpected argument '" + a.positional()[0] + "'");
      std::vector<std::string> sets = a.all("set");
      if (a.has("name")) sets.push_back("name=" + a.get("name"));
      return run_study(search::StudyConfig::load(a.require("config"), sets), a);
    }
    if (sub == "resume" || sub == "status") {
      a.allow_only(sub == "resume" ? std::vector<std::string>{"dir", "quiet", "help"}
                                   : std::vector<std::string>{"dir", "help"});
      if (a.positional().size() != 1) throw UsageError("give the study NAME (one)");
      const std::string name = a.positional()[0];
      const std::string dir = a.get("dir", "studies");
      if (sub == "status") {
        std::cout << search::study_status_text(dir, name);
        return exit_code::kOk;
      }
      return run_study(search::load_stored_study(dir, name), a);
    }
    if (sub == "export" || sub == "confirm") {
      std::cerr << "bertsweep study " << sub << ": not built yet in this version\n";
      return exit_code::kNotBuilt;
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const UsageError&) {
    throw;
  } catch (const std::runtime_error& e) {
    std::cerr << "bertsweep study " << sub << ": " << e.what() << "\n";
    return exit_code::kStudy;
  }
  throw UsageError("unknown study subcommand '" + sub + "' (run, resume, status)");
}

}  // namespace bs::cli
