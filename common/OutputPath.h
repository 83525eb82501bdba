// Output paths checked before any work starts, so that a typo costs nothing and is a ConfigError (exit 2)
// naming the option or key and the path, not a `filesystem error:` after a whole training run.
#pragma once
#include <string>

namespace bs {

// A file to be written (`--dump-params`, `log.mllog`, `--events`): its folder must exist and be writable,
// and the path must not be a folder. `what` names the option or key ("--dump-params", "log.mllog").
void check_output_file(const std::string& what, const std::string& path);
// A folder to be written into and created when missing (`checkpoint.dir`): not a file, and its nearest
// existing ancestor a writable folder (so that creating it can succeed).
void check_output_folder(const std::string& what, const std::string& path);

}  // namespace bs
