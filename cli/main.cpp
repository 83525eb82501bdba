// bertsweep: the command line. Subcommands only parse and dispatch (cli/*Command.cpp).
#include <c10/util/Exception.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "cli/Args.h"
#include "cli/Commands.h"
#include "common/Errors.h"

namespace {
const char* kUsage = R"(bertsweep: find the fastest way to train BERT with large-batch optimizers

usage: bertsweep <command> [options]     (every command takes --help)

  data prepare   --corpus brown|DIR --vocab FILE|--vocab-size N --seq-len 128 --out DIR
  data inspect   DIR|FILE.hdf5                 shard layout and sequence-length histogram
  train          --config FILE [--set key.path=value]... [--events stdout|fd:N|FILE] [--resume]
  study run      --config FILE [--name NAME] [--dir studies/] [--set key=value]...
  study resume   NAME [--dir studies/]
  study status   NAME [--dir studies/]
  study submit   --config FILE [--name NAME] [--dir studies/] [--set key=value]... [--sbatch-args "..."]
  study export   NAME --best [--where k=v,...] [--top K] --format yaml|mlperf-json|nvidia-config --out FILE
                 [--scale-lr linear|sqrt|none] [--nodes N --gpus-per-node G]
  study confirm  NAME --seeds 5 [--mllog-dir DIR]
  report         NAME [NAME...] --out DIR

)";
}  // namespace

// libgomp reads OMP_WAIT_POLICY once, when it loads: before main. Its default lets idle OpenMP workers spin,
// and on few cores they steal the CPU from OpenBLAS's own threads (measured: 3.5x slower bert-tiny steps on
// 2 cores). So the process re-executes itself once with a passive wait policy unless the user chose one.
// A re-exec loads LibTorch and its ~300 libraries a second time (~0.8 s of CPU here), so it is done only
// where it can matter: not for --help, --version or an unknown command, and `train` does it only once its
// config has loaded (cli/TrainCommand.cpp): --print-config and config errors never compute.
// (Setting the variable from .preinit_array instead does not work: glibc's own initialiser resets environ.)
static char** g_argv = nullptr;

namespace bs::cli {
void ensure_passive_openmp() {
  if (!g_argv || std::getenv("OMP_WAIT_POLICY") || std::getenv("BERTSWEEP_NO_REEXEC")) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  setenv("BERTSWEEP_NO_REEXEC", "1", 1);
  execv("/proc/self/exe", g_argv);  // on failure, go on with the default policy
}

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot read /proc/self/exe: " + ec.message());
  // Rebuilt or upgraded while it runs: the kernel names the old file "<path> (deleted)"; trials and batch
  // jobs started from now on run the file now at that path.
  std::string s = p.string();
  const std::string deleted = " (deleted)";
  if (s.size() > deleted.size() && s.compare(s.size() - deleted.size(), deleted.size(), deleted) == 0 &&
      !std::filesystem::exists(s))
    s.resize(s.size() - deleted.size());
  return s;
}
}  // namespace bs::cli

int main(int argc, char** argv) {
  g_argv = argv;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kUsage << "\nexit codes: " << bs::exit_codes_summary() << "\n";
    return args.empty() ? bs::exit_code::kUsage : bs::exit_code::kOk;
  }
  if (args[0] == "--version") {
    std::cout << "bertsweep " << BERTSWEEP_GIT_COMMIT << "\n";
    return 0;
  }
  // `train` re-executes itself later, after its config has loaded.
  if (args[0] == "data" || args[0] == "study" || args[0] == "report") bs::cli::ensure_passive_openmp();
  const std::string cmd = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  try {
    if (cmd == "data") return bs::cli::data_command(rest);
    if (cmd == "train") return bs::cli::train_command(rest);
    if (cmd == "study") return bs::cli::study_command(rest);
    if (cmd == "report") return bs::cli::report_command(rest);
    std::cerr << "bertsweep: unknown command '" << cmd << "'\n\n"
              << kUsage << "\nexit codes: " << bs::exit_codes_summary() << "\n";
    return bs::exit_code::kUsage;
  } catch (const bs::Error& e) {
    std::cerr << bs::describe(e, "bertsweep " + cmd) << "\n";
    return e.exit_code();
  } catch (const c10::Error& e) {
    // LibTorch's messages carry a C++ backtrace: only for developers who ask for it.
    std::cerr << "bertsweep " << cmd
              << ": internal error: " << (std::getenv("BERTSWEEP_DEBUG") ? e.what() : e.what_without_backtrace())
              << (std::getenv("BERTSWEEP_DEBUG") ? "" : " (BERTSWEEP_DEBUG=1 shows the backtrace)") << "\n";
    return bs::exit_code::kInternal;
  } catch (const std::exception& e) {
    std::cerr << "bertsweep " << cmd << ": error: " << e.what() << "\n";
    return bs::exit_code::kInternal;
  }
}
