// One function per subcommand; each lives in cli/<Name>Command.cpp, parses its options and calls a library.
#pragma once
#include <string>
#include <vector>

namespace bs::cli {
using Argv = std::vector<std::string>;
int data_command(const Argv& args);    // data prepare|inspect
int train_command(const Argv& args);   // train
int study_command(const Argv& args);   // study run|resume|status|submit|export|confirm
int report_command(const Argv& args);  // report

// Re-executes the process once with OMP_WAIT_POLICY=passive unless the user chose a policy (cli/main.cpp):
// call it before any output or side effect, since the process starts again from main.
void ensure_passive_openmp();

// This executable's path: trials and confirm runs are `bertsweep train` of this very binary (cli/main.cpp).
std::string self_exe();
}  // namespace bs::cli

namespace bs::cli {
// `study export` and `study confirm` (cli/ExportCommand.cpp); `study_command` dispatches to them.
int study_export_command(const Argv& args);
int study_confirm_command(const Argv& args);
}  // namespace bs::cli
