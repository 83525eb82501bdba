// The study controller: asks Optuna for trials, launches `bertsweep train` for each (up to `parallel` at
// once), streams their events into the study store and Optuna (pruning on the way), classifies how each
// ended, and resumes a study whose controller died. The only writer of the study file.
#pragma once
#include <string>

#include "search/StudyConfig.h"

namespace bs::search {

struct ControllerOptions {
  std::string dir = "studies";  // studies live in <dir>/<name>/ (study.db, trials/NNNN/)
  std::string trainer_exe;      // the bertsweep executable that runs `train`
  bool quiet = false;           // no progress on stderr
  int cores = 0;                // cores shared by the parallel trials; 0: all of this machine's
  double kill_grace_s = 10;     // SIGTERM, then SIGKILL after this long
};

// Penalties for a trial that did not reach its target, so that it never ranks above one that did:
// samples_to_target -> 2 * target.max_samples; seconds_to_target -> kUnreachedSecondsOffset + seconds run.
constexpr double kUnreachedSecondsOffset = 1e7;

class Controller {
 public:
  Controller(StudyConfig config, ControllerOptions options);

  // Creates the study or continues it (the stored search must equal this config's), marks trials of a
  // dead controller failed (or re-queues them), and runs until n_trials are done. Returns an exit code.
  int run();

  std::string study_dir() const;
  std::string db_path() const;

 private:
  StudyConfig config_;
  ControllerOptions options_;
};

// Paths of a study in `dir`; throws ConfigError for a name with path characters.
std::string study_dir(const std::string& dir, const std::string& name);
// The config stored with an existing study (for `study resume`); throws when there is no such study.
StudyConfig load_stored_study(const std::string& dir, const std::string& name);
// `study status`: the trial table (best first) and the count of trials per state.
std::string study_status_text(const std::string& dir, const std::string& name);

}  // namespace bs::search
