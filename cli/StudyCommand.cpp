// bertsweep study run|resume|status: parse options, then hand over to the search controller.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>

#include "cli/Args.h"
#include "cli/Commands.h"
#include "common/Errors.h"
#include "common/TrainConfig.h"
#include "search/Controller.h"
#include "search/Slurm.h"
#include "search/StudyConfig.h"

namespace bs::cli {

namespace {

const char* kHelp = R"(usage:
  bertsweep study run     --config FILE [--name NAME] [--dir studies/] [--set key=value]... [--quiet]
  bertsweep study resume  NAME [--dir studies/] [--quiet]
  bertsweep study status  NAME [--dir studies/]
  bertsweep study submit  --config FILE [--name NAME] [--dir studies/] [--set key=value]...
                          [--sbatch-args "ARG ARG..."]

run      creates the study <dir>/<NAME>/ (study.db: Optuna's tables + bertsweep's bs_* tables;
         trials/NNNN/: config.yaml, stdout.log, stderr.log) or continues it when the same search was
         started before. --set overrides a study key (n_trials=20, parallel=2) or, as base.<key.path>,
         a key of the base training config (base.data.dir=/data/brown).
resume   continues a study after its controller stopped or was killed: trials left running are marked
         failed (reason "controller died") or re-queued (retry_failed), then it runs to n_trials.
status   the trials, best first, and the count per state (with each trial's GPUs and Slurm job).
submit   submits the controller itself as a Slurm batch job (sbatch) that runs `study run` with these
         options, and prints the job id; its log is <dir>/<NAME>/controller-<jobid>.log. Inside the job,
         srun trials are steps of its allocation. The job asks for parallel x ranks tasks of
         cpus_per_trial / ranks CPUs (1 without cpus_per_trial); --sbatch-args adds to or overrides that
         (e.g. "--time=12:00:00 --partition=long --cpus-per-task=4"). Submitting the same study again
         resumes it; while its controller job is queued or running, submit refuses (exit 2).

Ctrl-C (or SIGTERM) during run/resume: no new trials start and the running ones finish and are recorded
(exit 6); a second Ctrl-C stops them now the graceful way (SIGTERM, so they checkpoint; killed after
10 s) and records them failed ("interrupted"; re-queued per retry_failed); a third kills the controller.

Study config keys: name, objective (samples_to_target | seconds_to_target | final_mlm_accuracy, or a
list for multi-objective), direction, sampler (tpe|cmaes|random|grid|qmc), pruner (median|
successive_halving|hyperband|none), n_trials, parallel, seed, retry_failed, trial_timeout, base or
base_config, space, derived, stratify (choice parameters whose every combination gets an equal share of
the trials; with tpe/cmaes each such cell has its own sampler over its own trials, and the median pruner
compares a trial with its own cell), launcher {kind: local|mpirun|srun, ranks, hostfile, extra_args
(more mpirun/srun arguments, one list item each), gpus_per_trial, gpus, cpus_per_trial, and for srun: nodes,
ranks_per_node, partition, time_limit, mpi (default pmix when ranks > 1), job_name (default
bs-{study}-{trial}), queue_timeout}. See configs/studies/.
Slurm (launcher.kind: srun): each trial is a job (a step when the controller runs inside an allocation,
e.g. under `study submit`) named by job_name, with cpus_per_trial / ranks CPUs per rank (default: the
allocation's or this machine's CPUs / (parallel x ranks)). An impossible request is exit 2 before any
trial (`srun --test-only`). trial_timeout (any launcher: the longest a trial may go without an event,
counted from launch) starts for srun trials at their first event; queue_timeout (seconds, 0: none) runs
from launch to that first event. Prune, timeout and a second Ctrl-C stop a trial with
`scancel --signal=TERM` (it checkpoints), then cancel it after 10 s. Failure reasons are Slurm's
(TIMEOUT, CANCELLED, OUT_OF_MEMORY, launch errors; none of these is retried); resume cancels the jobs
a dead controller left. A study in which every trial failed exits 7.
GPU trials: launcher.gpus_per_trial N (default 0: CPU trials) gives each running trial its own N GPUs
(CUDA_VISIBLE_DEVICES, exported with mpirun -x; srun also gets --gpus-per-task or --gres) and
`--set device=cuda`; launcher.gpus [0, 1, ...] lists the GPU ids to use (default: those in the
controller's CUDA_VISIBLE_DEVICES, else every GPU of the machine; under srun, ids of the allocation).
parallel x gpus_per_trial above the GPUs is a config error (exit 2) before any trial starts. `status`
shows each trial's GPUs.
A trial that misses the target scores 2 * target.max_samples (samples_to_target) or
1e7 + seconds run (seconds_to_target), so it never ranks above one that reached it.
)";

int run_study(search::StudyConfig config, const Args& a) {
  search::ControllerOptions o;
  o.dir = a.get("dir", "studies");
  o.quiet = a.has("quiet");
  o.trainer_exe = self_exe();
  return search::Controller(std::move(config), o).run();
}

// One argument for /bin/sh: single-quoted, with ' written as '\''.
std::string sh_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// `study submit`: the controller as an sbatch job running `study run` with the same options.
int submit_study(const Args& a) {
  std::vector<std::string> sets = a.all("set");
  if (a.has("name")) sets.push_back("name=" + a.get("name"));
  const std::string config_path = std::filesystem::absolute(a.require("config")).string();
  const search::StudyConfig c = search::StudyConfig::load(config_path, sets);  // config errors: exit 2 now
  const std::string dir = std::filesystem::absolute(a.get("dir", "studies")).string();
  const std::string study_dir = search::study_dir(dir, c.name);
  const std::string job_name = "bs-" + c.name + "-controller";
  if (auto job = search::slurm_find_job(job_name);
      job && (job->state == "PENDING" || job->state == "RUNNING" || job->state == "SUSPENDED" ||
              job->state == "CONFIGURING" || job->state == "COMPLETING"))
    throw ConfigError("study '" + c.name + "' is already submitted: Slurm job " + job->id + " (" + job_name + ") is " +
                      job->state + "; follow it with `bertsweep study status " + c.name + " --dir " + dir +
                      "`, or `scancel " + job->id + "` first");
  std::vector<std::string> extra;
  {
    std::string all;
    for (const auto& v : a.all("sbatch-args")) all += v + " ";
    std::istringstream in(all);
    static const std::regex plain("[A-Za-z0-9_.,:=/+@%-]+");
    for (std::string arg; in >> arg;) {
      if (!std::regex_match(arg, plain) || arg.find("wrap") != std::string::npos)
        throw UsageError("--sbatch-args: '" + arg +
                         "' is not a plain sbatch option (characters [A-Za-z0-9_.,:=/+@%-], "
                         "no --wrap; separate options with spaces)");
      extra.push_back(arg);
    }
  }
  std::filesystem::create_directories(study_dir);
  // The batch script: exec of this very executable's `study run`, every argument quoted for sh.
  std::vector<std::string> run = {self_exe(), "study", "run", "--config", config_path, "--dir", dir};
  for (const auto& s : sets) run.insert(run.end(), {"--set", s});
  const std::string script = study_dir + "/submit.sh";
  {
    std::ofstream out(script);
    out << "#!/bin/sh\n# Written by `bertsweep study submit`: the controller of study " << c.name
        << ", run inside its Slurm job.\nexec";
    for (const auto& arg : run) out << " " << sh_quote(arg);
    out << "\n";
    if (!out) throw std::runtime_error("cannot write " + script);
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                           std::filesystem::perms::others_read);
  const int ranks = std::max(1, c.launcher.ranks);
  const int per_rank = c.launcher.cpus_per_trial > 0 ? c.launcher.cpus_per_trial / ranks : 1;
  std::vector<std::string> sbatch = {"sbatch",
                                     "--parsable",
                                     "--job-name=" + job_name,
                                     "--output=" + study_dir + "/controller-%j.log",
                                     "--ntasks=" + std::to_string(c.parallel * ranks),
                                     "--cpus-per-task=" + std::to_string(per_rank)};
  sbatch.insert(sbatch.end(), extra.begin(), extra.end());
  sbatch.push_back(script);
  search::CommandResult r = search::run_command(sbatch, 120);
  if (r.exit_code == 127)
    throw ConfigError("sbatch not found on PATH: `study submit` needs Slurm's client (Debian's slurm-client)");
  if (r.exit_code != 0) {
    std::string why = r.err.empty() ? r.out : r.err;
    while (!why.empty() && why.back() == '\n') why.pop_back();
    throw ConfigError("sbatch refused the controller job of study '" + c.name + "': " + why +
                      " (fix --sbatch-args or the study's launcher keys)");
  }
  std::string id = r.out.substr(0, r.out.find_first_of(";\n"));
  std::cout << id << "\n";
  std::cerr << "submitted study " << c.name << " as Slurm job " << id << " (" << job_name << "); its log: " << study_dir
            << "/controller-" << id << ".log; progress: `bertsweep study status " << c.name << " --dir " << dir
            << "`\n";
  return exit_code::kOk;
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
    if (sub == "submit") {
      a.allow_only({"config", "name", "dir", "set", "sbatch-args", "help"});
      if (!a.positional().empty()) throw UsageError("unexpected argument '" + a.positional()[0] + "'");
      return submit_study(a);
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
  } catch (const ConfigError&) {  // main prints these with their exit code
    throw;
  } catch (const UsageError&) {
    throw;
  } catch (const std::runtime_error& e) {  // StudyError, or a damaged study file: exit 7
    std::cerr << "bertsweep study " << sub << ": " << e.what() << "\n";
    return exit_code::kStudy;
  }
  throw UsageError("unknown study subcommand '" + sub + "' (run, resume, status, submit, export, confirm)");
}

}  // namespace bs::cli
