#include <iostream>

#include "cli/Commands.h"
#include "common/ExitCodes.h"

namespace bs::cli {
int train_command(const Argv& args) {
  (void)args;
  std::cerr << "bertsweep train: not built yet in this version\n";
  return exit_code::kNotBuilt;
}
}  // namespace bs::cli
