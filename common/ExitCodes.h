// Exit codes of every bertsweep command; the controller reads the trainer's to classify a trial.
#pragma once

namespace bs::exit_code {
constexpr int kOk = 0;             // finished (for train: target reached or budget spent, see the done event)
constexpr int kInternal = 1;       // a bug or an unexpected exception
constexpr int kUsage = 2;          // bad command line or config (message names the key and file)
constexpr int kData = 3;           // missing, truncated or mismatched data / vocab / checkpoint
constexpr int kNonFinite = 4;      // NaN or inf loss: the run stopped
constexpr int kDistributed = 5;    // a peer rank died or timed out, or ranks disagree on the config
constexpr int kTerminated = 6;     // SIGTERM/SIGINT: stopped cleanly (checkpoint written when configured)
constexpr int kStudy = 7;          // unknown study, no complete trial, --where matches nothing
constexpr int kNotBuilt = 64;      // a subcommand that this build does not provide yet
}  // namespace bs::exit_code
