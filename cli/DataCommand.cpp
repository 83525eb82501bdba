#include <iostream>

#include "cli/Commands.h"
#include "common/ExitCodes.h"

namespace bs::cli {
int data_command(const Argv& args) {
  (void)args;
  std::cerr << "bertsweep data: not built yet in this version\n";
  return exit_code::kNotBuilt;
}
}  // namespace bs::cli
