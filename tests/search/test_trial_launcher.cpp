// Launching trial processes for real: argument vectors, events on fd 3 or stdout, logs, exit codes and
// signals, stopping a process group.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "TestUtil.h"
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
  std::vector<std::string> want = {"/x/bertsweep", "train", "--config", "/s/t/0001/config.yaml", "--events",
                                   "fd:3",         "--quiet", "--set",  "threads=3"};
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
  EXPECT_EQ(s.argv[1], "--ntasks=2");
  EXPECT_EQ(s.argv[2], "--cpus-per-task=8");
}

TEST(TrialLauncher, EventsOnFd3LogsAndEnvironment) {
  std::string dir = bs::test::make_temp_dir("launch");
  auto spec = shell("echo '{\"event\":\"eval\",\"samples\":64,\"mlm_accuracy\":0.5}' >&3; echo out-$OMP_NUM_THREADS; "
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
