// Launching trial processes for real: argument vectors, events on fd 3 or stdout, logs, exit codes and
// signals, stopping a process group; GPU slots and the GPU launch arguments (env, mpirun/srun forwarding).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "TestUtil.h"
#include "common/TrainConfig.h"
#include "search/TrialEvent.h"
#include "search/TrialLauncher.h"

using namespace bs::search;

namespace {
LaunchSpec shell(const std::string& script, const std::string& dir, bool events_on_stdout = false) {
  LaunchSpec s;
  s.argv = {"/bin/sh", "-c", script};
  s.stdout_path = dir + "/stdout.log";
  s.stderr_path = dir + "/stderr.log";
  s.events_on_stdout = events_on_stdout;
  return s;
}
// Runs to the end, collecting the event lines.
int finish(TrialProcess& p, std::vector<std::string>& lines) {
  for (int i = 0; i < 3000; ++i) {
    for (auto& l : p.read_lines()) lines.push_back(l);
    if (auto c = p.poll_exit()) {
      for (auto& l : p.read_lines()) lines.push_back(l);
      return *c;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}
std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

TEST(TrialLauncher, TrainerCommandIsAnArgumentVector) {
  LauncherConfig local;
  auto s = trainer_launch(local, "/x/bertsweep", "/s/t/0001/config.yaml", 3, "/s/t/0001");
  std::vector<std::string> want = {"/x/bertsweep", "train", "--config", "/s/t/0001/config.yaml", "--events", "fd:3",
                                   "--quiet",      "--set", "threads=3"};
  EXPECT_EQ(s.argv, want);
  EXPECT_EQ(s.env.at("OMP_NUM_THREADS"), "3");
  EXPECT_EQ(s.env.at("OPENBLAS_NUM_THREADS"), "3");
  EXPECT_EQ(s.stderr_path, "/s/t/0001/stderr.log");
  LauncherConfig mpi;
  mpi.kind = "mpirun";
  mpi.ranks = 4;
  mpi.hostfile = "/etc/hosts.mpi";
  s = trainer_launch(mpi, "/x/bertsweep", "/c.yaml", 1, "/d");
  EXPECT_EQ(s.argv[0], "mpirun");
  EXPECT_EQ(s.argv[1], "-np");
  EXPECT_EQ(s.argv[2], "4");
  EXPECT_EQ(s.argv[4], "/etc/hosts.mpi");
  EXPECT_TRUE(s.events_on_stdout);
  EXPECT_NE(std::find(s.argv.begin(), s.argv.end(), "stdout"), s.argv.end());
  LauncherConfig srun;
  srun.kind = "srun";
  srun.ranks = 2;
  s = trainer_launch(srun, "/x/bertsweep", "/c.yaml", 8, "/d");
  EXPECT_EQ(s.argv[0], "srun");
  EXPECT_EQ(s.argv[1], "--job-name=bertsweep");  // the controller passes bs-<study>-<trial>
  EXPECT_EQ(s.argv[2], "--ntasks=2");
  EXPECT_EQ(s.argv[3], "--cpus-per-task=8");
  EXPECT_NE(std::find(s.argv.begin(), s.argv.end(), "--mpi=pmix"), s.argv.end());  // 2 ranks find each other
}

TEST(TrialLauncher, EventsOnFd3LogsAndEnvironment) {
  std::string dir = bs::test::make_temp_dir("launch");
  auto spec = shell(
      "echo '{\"event\":\"eval\",\"samples\":64,\"mlm_accuracy\":0.5}' >&3; echo out-$OMP_NUM_THREADS; "
      "echo err >&2; printf '{\"event\":\"done\",\"reached\":true}' >&3",
      dir);
  spec.env["OMP_NUM_THREADS"] = "5";
  TrialProcess p(spec);
  EXPECT_GT(p.pid(), 0);
  std::vector<std::string> lines;
  EXPECT_EQ(finish(p, lines), 0);
  ASSERT_EQ(lines.size(), 2u);  // the last line has no newline and still counts
  auto ev = parse_trial_event(lines[0]);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->kind, "eval");
  EXPECT_DOUBLE_EQ(ev->number("mlm_accuracy"), 0.5);
  EXPECT_TRUE(parse_trial_event(lines[1])->flag("reached"));
  EXPECT_EQ(slurp(dir + "/stdout.log"), "out-5\n");
  EXPECT_EQ(slurp(dir + "/stderr.log"), "err\n");
}

TEST(TrialLauncher, EventsOnStdoutAreSeparatedFromOutput) {
  std::string dir = bs::test::make_temp_dir("launch");
  TrialProcess p(shell("echo hello; echo '{\"event\":\"eval\",\"samples\":1}'; echo bye", dir, true));
  std::vector<std::string> lines;
  EXPECT_EQ(finish(p, lines), 0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(parse_trial_event(lines[0])->kind, "eval");
  EXPECT_EQ(slurp(dir + "/stdout.log"), "hello\n{\"event\":\"eval\",\"samples\":1}\nbye\n");
}

TEST(TrialLauncher, ExitCodesAndSignalsAreClassified) {
  std::string dir = bs::test::make_temp_dir("launch");
  std::vector<std::string> lines;
  TrialProcess crash(shell("exit 3", dir));
  EXPECT_EQ(finish(crash, lines), 3);
  EXPECT_EQ(describe_exit(3), "exit 3 (data error)");
  EXPECT_EQ(describe_exit(4), "exit 4 (NaN/inf loss)");
  TrialProcess segv(shell("kill -SEGV $$", dir));
  int code = finish(segv, lines);
  EXPECT_EQ(code, 128 + SIGSEGV);
  EXPECT_EQ(describe_exit(code), "killed by signal 11 (SIGSEGV)");
}

TEST(TrialLauncher, SigtermReachesTheWholeProcessGroup) {
  std::string dir = bs::test::make_temp_dir("launch");
  // The shell starts a grandchild; both must stop.
  TrialProcess p(shell("sleep 60 & echo $! > " + dir + "/child.pid; wait", dir));
  for (int i = 0; i < 500 && slurp(dir + "/child.pid").empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  pid_t child = std::stoi(slurp(dir + "/child.pid"));
  EXPECT_EQ(kill(child, 0), 0);
  p.signal_group(SIGTERM);
  std::vector<std::string> lines;
  EXPECT_EQ(finish(p, lines), 128 + SIGTERM);
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = kill(child, 0) != 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone);
}

TEST(TrialLauncher, MissingProgramIsAnError) {
  std::string dir = bs::test::make_temp_dir("launch");
  LaunchSpec s = shell("", dir);
  s.argv = {"/nonexistent/bertsweep", "train"};
  try {
    TrialProcess p(s);
    FAIL() << "started a missing program";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/bertsweep"), std::string::npos);
  }
}

TEST(TrialEvent, ParsesFlatObjectsAndRejectsOtherLines) {
  auto ev = parse_trial_event(
      R"({"event":"done","reached":false,"samples_to_target":null,"steps":12,"x":-1.5e-3,"r":[1,2,{"a":3}]})");
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->kind, "done");
  EXPECT_FALSE(ev->flag("reached"));
  EXPECT_FALSE(ev->maybe("samples_to_target").has_value());
  EXPECT_DOUBLE_EQ(ev->number("steps"), 12);
  EXPECT_DOUBLE_EQ(ev->number("x"), -1.5e-3);
  EXPECT_EQ(ev->strings.at("r"), "[1,2,{\"a\":3}]");
  EXPECT_FALSE(parse_trial_event("step 10 loss 3.2"));
  EXPECT_FALSE(parse_trial_event(R"({"samples":3})"));
  EXPECT_FALSE(parse_trial_event(R"({"event":"eval","samples":3)"));
}

// --- GPU trials: slots, discovery, and the launch arguments with 1 and 2 GPUs per trial ---

namespace {
bool disjoint(const std::vector<std::vector<std::string>>& sets) {
  std::set<std::string> seen;
  size_t n = 0;
  for (const auto& s : sets) {
    n += s.size();
    seen.insert(s.begin(), s.end());
  }
  return seen.size() == n;
}
// The arguments after `flag` (e.g. after "-x"), in order.
std::vector<std::string> after(const std::vector<std::string>& argv, const std::string& flag) {
  std::vector<std::string> out;
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == flag) out.push_back(argv[i + 1]);
  return out;
}
size_t index_of(const std::vector<std::string>& argv, const std::string& a) {
  return static_cast<size_t>(std::find(argv.begin(), argv.end(), a) - argv.begin());
}
const std::vector<std::string> kFourGpus = {"0", "1", "2", "3"};
}  // namespace

TEST(GpuSlots, OneGpuPerTrialWithParallel2And4) {
  GpuSlots slots(kFourGpus, 1);
  EXPECT_EQ(slots.capacity(), 4);
  // parallel 2: the two lowest GPUs, one each.
  auto a = slots.acquire(), b = slots.acquire();
  EXPECT_EQ(a, std::vector<std::string>{"0"});
  EXPECT_EQ(b, std::vector<std::string>{"1"});
  // parallel 4: every GPU, each once; a fifth trial does not fit.
  auto c = slots.acquire(), d = slots.acquire();
  EXPECT_EQ(c, std::vector<std::string>{"2"});
  EXPECT_EQ(d, std::vector<std::string>{"3"});
  EXPECT_TRUE(disjoint({a, b, c, d}));
  EXPECT_EQ(slots.in_use(), 4);
  EXPECT_THROW(slots.acquire(), std::runtime_error);
  // A finished trial's GPU goes to the next one (lowest free first).
  slots.release(b);
  EXPECT_EQ(slots.in_use(), 3);
  EXPECT_EQ(slots.acquire(), std::vector<std::string>{"1"});
  slots.release(d);
  slots.release(a);
  EXPECT_EQ(slots.acquire(), std::vector<std::string>{"0"});
  EXPECT_EQ(slots.acquire(), std::vector<std::string>{"3"});
  EXPECT_THROW(slots.release({"7"}), std::invalid_argument);  // never a slot
}

TEST(GpuSlots, TwoGpusPerTrialGetDisjointPairs) {
  GpuSlots slots(kFourGpus, 2);
  EXPECT_EQ(slots.capacity(), 2);  // parallel 2 fits, parallel 4 would not
  auto a = slots.acquire(), b = slots.acquire();
  EXPECT_EQ(a, (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(b, (std::vector<std::string>{"2", "3"}));
  EXPECT_TRUE(disjoint({a, b}));
  EXPECT_THROW(slots.acquire(), std::runtime_error);
  slots.release(a);
  EXPECT_THROW(slots.release(a), std::invalid_argument);           // released twice
  EXPECT_THROW(slots.release({"1", "2"}), std::invalid_argument);  // not a slot
  EXPECT_EQ(slots.acquire(), (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(slots.in_use(), 2);
  // UUIDs are ids like any other; a GPU left over after the pairs is not used.
  GpuSlots uuids({"GPU-a", "GPU-b", "GPU-c"}, 2);
  EXPECT_EQ(uuids.capacity(), 1);
  EXPECT_EQ(uuids.acquire(), (std::vector<std::string>{"GPU-a", "GPU-b"}));
  EXPECT_THROW(uuids.acquire(), std::runtime_error);
}

TEST(GpuSlots, CpuTrialsGetNoGpu) {
  GpuSlots slots(kFourGpus, 0);
  EXPECT_EQ(slots.capacity(), 0);
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(slots.acquire().empty());
  slots.release({});
}

TEST(GpuDiscovery, CudaVisibleDevicesEntriesAreKeptAsStrings) {
  using V = std::vector<std::string>;
  EXPECT_EQ(visible_gpus(nullptr, 3), (V{"0", "1", "2"}));  // unset: the machine's count
  EXPECT_EQ(visible_gpus(nullptr, 0), V{});                 // no driver
  EXPECT_EQ(visible_gpus("2,3", 8), (V{"2", "3"}));         // set: it wins over the count
  EXPECT_EQ(visible_gpus(" 1 , 0", 8), (V{"1", "0"}));
  EXPECT_EQ(visible_gpus("GPU-8f2c1e4a-0b1d-4c2e,MIG-1a2b", 0), (V{"GPU-8f2c1e4a-0b1d-4c2e", "MIG-1a2b"}));
  EXPECT_EQ(visible_gpus("", 4), V{});           // set but empty: none
  EXPECT_EQ(visible_gpus("-1", 4), V{});         // the usual way to hide every GPU
  EXPECT_EQ(visible_gpus("0,-1,1", 4), V{"0"});  // CUDA stops at the first invalid entry
  EXPECT_EQ(visible_gpus("0,0,1", 4), V{"0"});
  LauncherConfig l;
  l.gpus_per_trial = 1;
  l.gpus = {"5", "4"};
  EXPECT_EQ(launcher_gpus(l), (V{"5", "4"}));  // a listed set is used as listed
  l.gpus.clear();
  l.gpus_per_trial = 0;
  EXPECT_EQ(launcher_gpus(l), V{});  // CPU trials: the machine is not asked
  EXPECT_GE(count_nvidia_gpus(), 0);
}

TEST(GpuDiscovery, TooFewGpusIsAConfigErrorNamingTheKeysAndTheGpus) {
  LauncherConfig l;
  l.gpus_per_trial = 1;
  l.gpus = {"0", "1"};
  EXPECT_NO_THROW(check_gpu_fit(l, 2, l.gpus, "s.yaml"));
  try {
    check_gpu_fit(l, 3, l.gpus, "s.yaml");
    ADD_FAILURE() << "3 trials of 1 GPU fit on 2 GPUs";
  } catch (const bs::ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("s.yaml: parallel (3) x launcher.gpus_per_trial (1) needs 3 GPUs"), std::string::npos) << m;
    EXPECT_NE(m.find("launcher.gpus lists 2 (0,1)"), std::string::npos) << m;
  }
  l.gpus.clear();
  l.gpus_per_trial = 2;
  setenv("CUDA_VISIBLE_DEVICES", "3,1,2", 1);
  auto found = launcher_gpus(l);
  EXPECT_EQ(found, (std::vector<std::string>{"3", "1", "2"}));
  EXPECT_NO_THROW(check_gpu_fit(l, 1, found, "s.yaml"));
  try {
    check_gpu_fit(l, 2, found, "s.yaml");
    ADD_FAILURE() << "2 trials of 2 GPUs fit on 3 GPUs";
  } catch (const bs::ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("needs 4 GPUs but 3 GPU(s) are visible (3,1,2) in CUDA_VISIBLE_DEVICES='3,1,2'"),
              std::string::npos)
        << m;
  }
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  l.gpus_per_trial = 1;
  try {
    check_gpu_fit(l, 1, launcher_gpus(l), "s.yaml");
    ADD_FAILURE() << "a GPU trial without any GPU";
  } catch (const bs::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no GPU is visible"), std::string::npos) << e.what();
  }
  unsetenv("CUDA_VISIBLE_DEVICES");
  l.gpus_per_trial = 0;
  EXPECT_NO_THROW(check_gpu_fit(l, 16, {}, "s.yaml"));  // CPU trials need none
}

TEST(TrialLauncher, LocalGpuTrialGetsItsOwnCudaVisibleDevicesAndDeviceCuda) {
  LauncherConfig local;
  local.gpus_per_trial = 1;
  auto s = trainer_launch(local, "/x/bertsweep", "/c.yaml", 4, "/d", {"2"});
  EXPECT_EQ(s.env.at("CUDA_VISIBLE_DEVICES"), "2");
  EXPECT_EQ(s.env.at("OMP_NUM_THREADS"), "4");  // the CPU-thread share is kept
  std::vector<std::string> tail(s.argv.end() - 4, s.argv.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"--set", "threads=4", "--set", "device=cuda"}));
  local.gpus_per_trial = 2;
  s = trainer_launch(local, "/x/bertsweep", "/c.yaml", 4, "/d", {"2", "3"});
  EXPECT_EQ(s.env.at("CUDA_VISIBLE_DEVICES"), "2,3");
  EXPECT_EQ(s.argv.back(), "device=cuda");
  EXPECT_EQ(s.argv[0], "/x/bertsweep");
  // A CPU trial: the environment and arguments are as before.
  LauncherConfig cpu;
  s = trainer_launch(cpu, "/x/bertsweep", "/c.yaml", 4, "/d");
  EXPECT_EQ(s.env.count("CUDA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(index_of(s.argv, "device=cuda"), s.argv.size());
}

TEST(TrialLauncher, MpirunExportsCudaVisibleDevicesToEveryRank) {
  for (const auto& gpus : {std::vector<std::string>{"1"}, std::vector<std::string>{"2", "3"}}) {
    LauncherConfig mpi;
    mpi.kind = "mpirun";
    mpi.ranks = 2;
    mpi.gpus_per_trial = static_cast<int>(gpus.size());
    mpi.extra_args = {"--bind-to", "none"};
    auto s = trainer_launch(mpi, "/x/bertsweep", "/c.yaml", 2, "/d", gpus);
    EXPECT_EQ(s.env.at("CUDA_VISIBLE_DEVICES"), gpus.size() == 1 ? "1" : "2,3");
    auto exported = after(s.argv, "-x");
    EXPECT_NE(std::find(exported.begin(), exported.end(), "CUDA_VISIBLE_DEVICES"), exported.end());
    EXPECT_NE(std::find(exported.begin(), exported.end(), "OMP_NUM_THREADS"), exported.end());
    // mpirun's options come before the trainer; the trainer is told to use the GPU.
    EXPECT_LT(index_of(s.argv, "CUDA_VISIBLE_DEVICES"), index_of(s.argv, "/x/bertsweep"));
    EXPECT_LT(index_of(s.argv, "none"), index_of(s.argv, "/x/bertsweep"));
    EXPECT_EQ(s.argv.back(), "device=cuda");
    EXPECT_EQ(index_of(s.argv, "--gres=gpu:1"), s.argv.size());
  }
  LauncherConfig cpu;
  cpu.kind = "mpirun";
  auto s = trainer_launch(cpu, "/x/bertsweep", "/c.yaml", 2, "/d");
  auto exported = after(s.argv, "-x");
  EXPECT_EQ(std::find(exported.begin(), exported.end(), "CUDA_VISIBLE_DEVICES"), exported.end());
}

TEST(TrialLauncher, SrunAsksForTheGpusPerTaskOrPerNode) {
  struct Case {
    int ranks;
    std::vector<std::string> gpus;
    std::string want;
  };
  for (const auto& c : std::vector<Case>{{1, {"0"}, "--gpus-per-task=1"},
                                         {1, {"0", "1"}, "--gpus-per-task=2"},
                                         {2, {"0", "1"}, "--gpus-per-task=1"},
                                         {2, {"2"}, "--gres=gpu:1"},  // 1 GPU for 2 ranks: per node
                                         {4, {"0", "1"}, "--gres=gpu:2"}}) {
    LauncherConfig srun;
    srun.kind = "srun";
    srun.ranks = c.ranks;
    srun.gpus_per_trial = static_cast<int>(c.gpus.size());
    auto s = trainer_launch(srun, "/x/bertsweep", "/c.yaml", 3, "/d", c.gpus);
    SCOPED_TRACE(c.want + " ranks " + std::to_string(c.ranks));
    EXPECT_EQ(s.argv[0], "srun");
    size_t at = index_of(s.argv, c.want);
    ASSERT_LT(at, s.argv.size());
    EXPECT_LT(at, index_of(s.argv, "/x/bertsweep"));
    // srun exports the whole environment (--export=ALL by default): CUDA_VISIBLE_DEVICES is in it.
    EXPECT_EQ(s.env.at("CUDA_VISIBLE_DEVICES"), join_gpu_ids(c.gpus));
    EXPECT_EQ(after(s.argv, "-x").size(), 0u);
    EXPECT_EQ(s.argv.back(), "device=cuda");
  }
  LauncherConfig cpu;
  cpu.kind = "srun";
  auto s = trainer_launch(cpu, "/x/bertsweep", "/c.yaml", 3, "/d");
  for (const auto& a : s.argv) {
    EXPECT_EQ(a.find("--gpus"), std::string::npos) << a;
    EXPECT_EQ(a.find("--gres"), std::string::npos) << a;
  }
}

TEST(TrialLauncher, GpuTrialProcessSeesOnlyItsGpus) {
  std::string dir = bs::test::make_temp_dir("launch");
  std::string exe = dir + "/fake-trainer";
  std::ofstream(exe) << "#!/bin/sh\necho \"cvd=$CUDA_VISIBLE_DEVICES args=$*\"\n";
  ASSERT_EQ(chmod(exe.c_str(), 0755), 0);
  setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3", 1);  // the controller's: the trial must see its own instead
  LauncherConfig local;
  local.gpus_per_trial = 2;
  TrialProcess p(trainer_launch(local, exe, dir + "/c.yaml", 1, dir, {"2", "3"}));
  unsetenv("CUDA_VISIBLE_DEVICES");
  std::vector<std::string> lines;
  EXPECT_EQ(finish(p, lines), 0);
  std::string out = slurp(dir + "/stdout.log");
  EXPECT_EQ(out.rfind("cvd=2,3 args=train --config ", 0), 0u) << out;
  EXPECT_NE(out.find("--set threads=1 --set device=cuda\n"), std::string::npos) << out;
}
