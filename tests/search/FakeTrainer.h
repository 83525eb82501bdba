// A stand-in for `bertsweep train` in the controller's and `study confirm`'s tests: a shell script that
// speaks the trial protocol (events on fd 3, the trainer's exit codes), chosen by model.layers, so that every
// way a run can end is exercised in seconds with real processes.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>

namespace bs::test {

// layers: 1 reaches the target at 1000 samples, 2 never reaches it, 3 NaN loss (exit 4),
// 4 segfaults, 5 goes silent (timeout), 6 reaches it at 500. SLOW=1 makes every eval take 0.4 s.
inline const char* kFakeTrainerScript = R"(#!/bin/sh
cfg=$3
layers=$(sed -n 's/^  layers: //p' "$cfg")
ev() { echo "$1" >&3; }
pause() { [ -n "$SLOW" ] && sleep 0.4; }
case $layers in
  3) ev '{"event":"eval","step":1,"samples":250,"mlm_accuracy":0.01,"loss":9,"seconds":0.1}'; echo "loss is nan" >&2; exit 4;;
  4) kill -SEGV $$;;
  5) sleep 30; exit 0;;
esac
for s in 250 500 750 1000; do
  pause
  acc=$(echo "$s $layers" | awk '{ if ($2 == 2) print 0.01; else print $1 / 10000 * (7 - $2) }')
  ev "{\"event\":\"eval\",\"step\":$s,\"samples\":$s,\"mlm_accuracy\":$acc,\"loss\":3,\"seconds\":0.2}"
  ev "{\"event\":\"throughput\",\"step\":$s,\"samples\":$s,\"samples_per_s\":100,\"tokens_per_s\":9000,\"padding_waste\":0.2,\"imbalance\":1.0,\"overlap\":0.5,\"step_seconds\":0.1}"
  if [ $layers = 6 ] && [ $s = 500 ]; then
    ev '{"event":"done","reached":true,"samples_to_target":500,"seconds_to_target":1.5,"steps":2,"final_mlm_accuracy":0.05}'; exit 0
  fi
done
if [ $layers = 2 ]; then
  ev '{"event":"done","reached":false,"samples_to_target":null,"seconds_to_target":null,"steps":4,"final_mlm_accuracy":0.01}'
else
  ev '{"event":"done","reached":true,"samples_to_target":1000,"seconds_to_target":3.0,"steps":4,"final_mlm_accuracy":0.06}'
fi
exit 0
)";

// Writes the script as DIR/trial.sh (executable) and returns its path.
inline std::string write_fake_trainer(const std::string& dir) {
  const std::string path = dir + "/trial.sh";
  std::ofstream(path) << kFakeTrainerScript;
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path;
}

}  // namespace bs::test
