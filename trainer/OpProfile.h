// Where a step's time goes, per operator: self time (time in the op minus time in the ops it calls) of every
// ATen op, autograd node and bertsweep scope (RECORD_FUNCTION "bs::...") on the threads that run them, from
// LibTorch's RecordFunction callbacks. `log.op_profile: FILE` turns it on for the steps after the first
// progress window (warm-up excluded) and writes FILE as TSV: op, calls, self_seconds (an op run inside a
// bertsweep scope is named "scope/op"), plus one row
// "(outside any op)" for the rest of the profiled wall time. bench/op_profile.py groups the rows by operator
// class next to the torch.profiler table of the Python baseline.
#pragma once
#include <cstdint>
#include <string>

namespace bs {

class OpProfile {
 public:
  OpProfile();  // installs the callback; profiling starts at start()
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;
  void start();  // opens the profiled wall-clock window
  void stop();   // closes it (ops still running on other threads are not waited for)
  bool running() const;
  // Throws std::runtime_error naming the file when it cannot be written.
  void write_tsv(const std::string& path) const;

 private:
  uint64_t handle_ = 0;
};

}  // namespace bs
