// Every error a bertsweep command reports, and the exit code it ends with. This is the one mapping from an
// error to an exit code: the error type carries its code, every command prints it with describe(), and
// `bertsweep --help` and README's table are checked against kExitCodes (tests/common/test_errors.cpp).
// The controller reads a trainer's exit code to classify a trial (search/TrialLauncher.cpp).
#pragma once
#include <stdexcept>
#include <string>

namespace bs {

namespace exit_code {
constexpr int kOk = 0;           // finished (for train: target reached or budget spent, see the done event)
constexpr int kInternal = 1;     // a bug or an unexpected exception
constexpr int kUsage = 2;        // bad command line or config (message names the key and file)
constexpr int kData = 3;         // missing, truncated or mismatched data / vocab / checkpoint
constexpr int kNonFinite = 4;    // NaN or inf loss: the run stopped
constexpr int kDistributed = 5;  // a peer rank died or timed out, or ranks disagree on the config
constexpr int kTerminated = 6;   // SIGTERM/SIGINT: stopped cleanly (checkpoint written when configured)
constexpr int kStudy = 7;        // unknown or damaged study, no complete trial, every trial failed
}  // namespace exit_code

// The codes with their one-line meanings, in order: what --help prints and README's table states.
struct ExitCodeInfo {
  int code;
  const char* meaning;
};
inline constexpr ExitCodeInfo kExitCodes[] = {
    {exit_code::kOk, "ok"},
    {exit_code::kInternal, "internal error"},
    {exit_code::kUsage, "usage/config error"},
    {exit_code::kData, "data error"},
    {exit_code::kNonFinite, "NaN/inf loss"},
    {exit_code::kDistributed, "distributed error"},
    {exit_code::kTerminated, "stopped by SIGTERM/SIGINT"},
    {exit_code::kStudy, "study error"},
};

// "0 ok, 1 internal error, ..., 7 study error": for usage texts.
std::string exit_codes_summary();

// An error the user can act on: the message names the file, the key (or option) and the fix.
class Error : public std::runtime_error {
 public:
  Error(int exit_code, const char* kind, const std::string& message, bool see_help = false)
      : std::runtime_error(message), exit_code_(exit_code), kind_(kind), see_help_(see_help) {}
  int exit_code() const { return exit_code_; }
  // The words before the message ("config error"), or "" where the message says it all.
  const char* kind() const { return kind_; }
  // The fix is in the command's --help (a bad command line).
  bool see_help() const { return see_help_; }

 private:
  int exit_code_;
  const char* kind_;
  bool see_help_;
};

// A bad command line (option missing, not a number, unknown): exit 2, with a pointer to --help.
struct UsageError : Error {
  explicit UsageError(const std::string& m) : Error(exit_code::kUsage, "", m, /*see_help=*/true) {}
};
// A config problem: the message names the file, the key path, the line and what would fix it. Exit 2.
struct ConfigError : Error {
  explicit ConfigError(const std::string& m) : Error(exit_code::kUsage, "config error", m) {}
};
// Missing, truncated or mismatched data, vocab or checkpoint: the message names the file and the fix. Exit 3.
struct DataError : Error {
  explicit DataError(const std::string& m) : Error(exit_code::kData, "data error", m) {}
};
// The loss became NaN or inf: the run stops. Exit 4.
struct NonFiniteLoss : Error {
  explicit NonFiniteLoss(const std::string& m) : Error(exit_code::kNonFinite, "", m) {}
};
// A peer rank died or timed out, or the ranks disagree (config hash). Exit 5.
struct DistributedError : Error {
  explicit DistributedError(const std::string& m) : Error(exit_code::kDistributed, "distributed error", m) {}
};
// SIGTERM/SIGINT arrived: the run stopped at a step boundary. Exit 6.
struct Terminated : Error {
  explicit Terminated(const std::string& m) : Error(exit_code::kTerminated, "", m) {}
};
// A problem with a study (unknown study, no complete trial, a filter that matches nothing). Exit 7.
struct StudyError : Error {
  explicit StudyError(const std::string& m) : Error(exit_code::kStudy, "", m) {}
};

// The line a command prints for `e`: "<who>: <kind>: <message>", and for a usage error
// "<who>: <message> (see <who> --help)". `who` is e.g. "bertsweep train".
std::string describe(const Error& e, const std::string& who);

}  // namespace bs
