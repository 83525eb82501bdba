#include "TestUtil.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <stdexcept>

namespace bs::test {
namespace fs = std::filesystem;

double json_number(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\": ([-+0-9.eE]+)")))
    throw std::runtime_error("no number '" + key + "' in\n" + json);
  return std::strtod(m[1].str().c_str(), nullptr);
}

std::vector<double> json_numbers(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\": \\[([^\\]]*)\\]")))
    throw std::runtime_error("no array '" + key + "' in\n" + json);
  std::vector<double> out;
  std::istringstream in(m[1].str());
  for (std::string x; std::getline(in, x, ',');) out.push_back(std::strtod(x.c_str(), nullptr));
  return out;
}

std::string bertsweep_bin() {
  const char* b = std::getenv("BERTSWEEP_BIN");
  return b ? b : BERTSWEEP_TEST_BIN;
}

std::string source_dir() {
  const char* s = std::getenv("BERTSWEEP_SOURCE_DIR");
  return s ? s : BERTSWEEP_TEST_SOURCE_DIR;
}

static std::string work_root() {
  fs::path bin = fs::path(bertsweep_bin()).parent_path().parent_path();  // <build>/cli/bertsweep -> <build>
  fs::path root = bin / "testwork";
  fs::create_directories(root);
  return root.string();
}

std::string make_temp_dir(const std::string& prefix) {
  std::string templ = work_root() + "/" + prefix + ".XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed for " + templ);
  return buf.data();
}

RunResult run(const std::vector<std::string>& argv, double timeout_s) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    close(out_pipe[0]);
    close(err_pipe[0]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  RunResult r;
  auto start = std::chrono::steady_clock::now();
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  bool killed = false;
  while (open_fds > 0) {
    int n = poll(fds, 2, 200);
    if (n > 0) {
      for (int i = 0; i < 2; ++i) {
        if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
        char buf[8192];
        ssize_t k = read(fds[i].fd, buf, sizeof buf);
        if (k <= 0) {
          close(fds[i].fd);
          fds[i].fd = -1;
          --open_fds;
        } else {
          (i == 0 ? r.out : r.err).append(buf, k);
        }
      }
    }
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!killed && el > timeout_s) {
      kill(-pid, SIGKILL);
      killed = true;
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

namespace {
std::string prepared(const std::string& name, const std::vector<std::string>& flags) {
  fs::path dir = fs::path(work_root()) / name;
  std::string lock = work_root() + "/" + name + ".lock";
  int fd = open(lock.c_str(), O_CREAT | O_RDWR, 0644);
  flock(fd, LOCK_EX);
  if (!fs::exists(dir / "eval.hdf5")) {
    std::vector<std::string> a = {bertsweep_bin(), "data", "prepare"};
    a.insert(a.end(), flags.begin(), flags.end());
    a.insert(a.end(), {"--quiet", "--out", dir.string()});
    auto r = run(a, 1800);
    if (r.exit_code != 0) {
      flock(fd, LOCK_UN);
      close(fd);
      throw std::runtime_error("data prepare failed (" + std::to_string(r.exit_code) + "): " + r.err);
    }
  }
  flock(fd, LOCK_UN);
  close(fd);
  return dir.string();
}
}  // namespace

std::string brown_dataset() {
  // What configs/data/brown.yaml documents and scripts/demo makes as data/brown.
  return prepared("brown-full", {"--corpus", "brown", "--vocab-size", "8192", "--seq-len", "128"});
}

std::vector<std::string> tiny_prepare_args(const std::string& out, const std::string& seed) {
  // clang-format off
  return {bertsweep_bin(), "data", "prepare", "--corpus", "brown", "--vocab-size", "1500", "--seq-len", "64",
          "--max-docs", "25", "--dupe-factor", "2", "--eval-every", "5", "--seed", seed, "--quiet", "--out", out};
  // clang-format on
}

std::string small_brown_dataset() {
  return prepared("brown-small", {"--corpus", "brown", "--vocab-size", "4000", "--seq-len", "128", "--max-docs", "200",
                                  "--seed", "7"});
}

}  // namespace bs::test
