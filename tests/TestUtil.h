// Helpers shared by the tests: paths to the built CLI and the source tree, temp dirs, running commands.
#pragma once
#include <string>
#include <vector>

namespace bs::test {
std::string bertsweep_bin();  // the built CLI (env BERTSWEEP_BIN overrides the built path)
std::string source_dir();     // the repository root
// A fresh empty directory under the build's temp area, removed by the caller when wanted.
std::string make_temp_dir(const std::string& prefix);
struct RunResult {
  int exit_code = -1;  // 128+signal when killed
  std::string out, err;
};
// Runs argv (no shell) and captures stdout/stderr; `timeout_s` kills it with SIGKILL when exceeded.
RunResult run(const std::vector<std::string>& argv, double timeout_s = 600);
// `bertsweep data prepare` of a tiny Brown dataset (25 documents, vocab 1500, seq 64) into `out` with `seed`.
std::vector<std::string> tiny_prepare_args(const std::string& out, const std::string& seed);
// A small prepared Brown dataset shared by tests (prepared once per build dir, reused): returns its dir.
std::string small_brown_dataset();
// The number after "key": in a flat JSON text (strtod of the exact digits written); throws when absent.
double json_number(const std::string& json, const std::string& key);
// The numbers of "key": [a, b, ...] in a JSON text; throws when absent.
std::vector<double> json_numbers(const std::string& json, const std::string& key);
// The whole Brown corpus as data/brown (8192-token vocab, seq 128): minutes to prepare, for long tests.
std::string brown_dataset();
}  // namespace bs::test
