// Before a controller writes to an existing study.db: bertsweep's own tables (bs_study, bs_trials) and
// Optuna's study in the same file must describe the same study. Optuna numbers trials per study, so a study
// renamed or recreated on Optuna's side would hand out numbers that bertsweep already holds finished
// results for; refusing here, before anything is written, is what keeps those results.
#pragma once
#include <string>

namespace bs::search {

struct StudyConfig;

// Reads `db_path` read-only (it stays byte-identical) and throws StudyError (exit 7) naming what disagrees,
// or ConfigError (exit 2) when the stored study has another search. No file yet: nothing to check.
// Allowed differences are the ones a controller killed between its two writes leaves (bertsweep writes its
// row first, then tells Optuna): an Optuna trial still RUNNING whose row is finished, an Optuna trial
// RUNNING/WAITING/FAIL without a row, a RUNNING row whose Optuna trial ended.
void check_stored_study_agrees(const std::string& db_path, const StudyConfig& config, const std::string& dir);

// The way back from a damaged study file, for error messages: the backups and SQLite's own recovery.
std::string damaged_study_help(const std::string& db_path);

}  // namespace bs::search
