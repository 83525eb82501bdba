// bertsweep train: parse options, load the config, run the trainer, map failures to exit codes.
#include <iostream>

#include "cli/Args.h"
#include "cli/Commands.h"
#include "common/Errors.h"
#include "common/OutputPath.h"
#include "common/TrainConfig.h"
#include "distributed/Communicator.h"
#include "dataset/ShardIO.h"
#include "trainer/Trainer.h"

namespace bs::cli {

namespace {
const char* kHelp = R"(usage: bertsweep train --config FILE [--set key.path=value]... [options]

Trains BERT (MLM + NSP) until eval masked-LM accuracy reaches target.mlm_accuracy or target.max_samples
are spent. Works alone or as every rank under mpirun/srun (distributed.backend: auto picks MPI there).

options:
  --config FILE        training config (YAML; see configs/train/). Required.
  --set key.path=val   override one key (repeatable), e.g. --set optimizer.lr=0.002
  --events SPEC        trial-protocol JSON lines: stdout | fd:N | FILE (default: none)
  --resume             continue from the checkpoint set in checkpoint.dir (same metrics as an uninterrupted run)
  --print-config       print the resolved config (after --set) and exit
  --dump-params FILE   write the final parameters (float32, registration order) to FILE
  --quiet              no progress lines

keys: )";

const char* kExit = R"(
exit codes: 0 finished (target reached or budget spent: see the done event), 2 config error,
            3 data error, 4 NaN/inf loss, 5 distributed error, 6 stopped by SIGTERM/SIGINT
)";
}  // namespace

int train_command(const Argv& argv) {
  Args args(argv, {"resume", "quiet", "help", "print-config"});
  if (args.has("help")) {
    std::cout << kHelp;
    int col = 6;
    for (const auto& k : TrainConfig::keys()) {
      if (col + k.size() > 100) {
        std::cout << "\n      ";
        col = 6;
      }
      std::cout << k << " ";
      col += k.size() + 1;
    }
    std::cout << "\n" << kExit;
    return exit_code::kOk;
  }
  args.allow_only({"config", "set", "events", "resume", "quiet", "dump-params", "print-config", "help"});
  if (!args.positional().empty()) throw UsageError("unexpected argument '" + args.positional()[0] + "'");
  TrainConfig cfg = TrainConfig::load(args.require("config"), args.all("set"));
  if (args.has("print-config")) {
    std::cout << cfg.to_yaml_string();
    return exit_code::kOk;
  }
  TrainOptions opt;
  opt.events = args.get("events");
  opt.quiet = args.has("quiet");
  opt.resume = args.has("resume");
  opt.dump_params = args.get("dump-params");
  // Every output path before any work: a typo is exit 2 now, not a filesystem error after training.
  check_output_file("--dump-params", opt.dump_params);
  if (opt.events != "stdout" && opt.events.rfind("fd:", 0) != 0) check_output_file("--events", opt.events);
  check_output_file("log.mllog", cfg.log.mllog);
  check_output_file("log.op_profile", cfg.log.op_profile);
  check_output_folder("checkpoint.dir", cfg.checkpoint.dir);
  ensure_passive_openmp();  // from here on it computes; nothing is printed or written before this point
  install_stop_handlers();
  try {
    train(cfg, opt);
    return exit_code::kOk;
  } catch (const Error& e) {  // config, data, NaN loss, distributed, terminated: each has its exit code
    std::cerr << describe(e, "bertsweep train") << "\n";
    return e.exit_code();
  }
}

}  // namespace bs::cli
