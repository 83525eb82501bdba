// Helpers of the reliability tests: start a controller in the background, wait for a state of the study file,
// check the file's integrity, and fingerprint files to show that a refused command touched nothing.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <SQLiteCpp/SQLiteCpp.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "TestUtil.h"
#include "studies/StudyStore.h"

namespace bs::test {

// `study run` on configs/studies/smoke.yaml with the small dataset and extra --set overrides.
inline std::vector<std::string> smoke_study(const std::string& dir, const std::string& name,
                                            const std::vector<std::string>& sets) {
  std::vector<std::string> a = {bertsweep_bin(),
                                "study",
                                "run",
                                "--config",
                                source_dir() + "/configs/studies/smoke.yaml",
                                "--set",
                                "base.data.dir=" + small_brown_dataset(),
                                "--name",
                                name,
                                "--dir",
                                dir,
                                "--quiet",
                                "--set",
                                "pruner=none"};
  for (const auto& s : sets) a.insert(a.end(), {"--set", s});
  return a;
}

// Starts argv in the background (stdout/stderr to `log`); returns its pid.
inline pid_t spawn(const std::vector<std::string>& argv, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::fopen(log.c_str(), "w");
    if (f) {
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
    }
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  return pid;
}

// Waits for pid to end (SIGKILL after timeout_s); returns its exit code, 128+N when killed by signal N.
inline int wait_exit(pid_t pid, double timeout_s) {
  auto start = std::chrono::steady_clock::now();
  int status = 0;
  for (;;) {
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Polls `pred` (errors while the file is being created count as false) every 100 ms.
inline bool wait_for(const std::function<bool()>& pred, double timeout_s) {
  auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < timeout_s) {
    try {
      if (pred()) return true;
    } catch (...) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

inline std::string integrity(const std::string& db) {
  SQLite::Database d(db, SQLite::OPEN_READONLY);
  return d.execAndGet("PRAGMA integrity_check").getString();
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every file of a folder, names and bytes: equal fingerprints mean nothing was written there.
inline std::string folder_fingerprint(const std::string& dir) {
  std::string fp;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) {
      std::string body = read_file(e.path().string());
      fp += e.path().string() + ":" + std::to_string(body.size()) + ":" +
            std::to_string(std::hash<std::string>{}(body)) + "\n";
    }
  return fp;
}

inline int count_lines_with(const std::string& path, const std::string& needle) {
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(needle) != std::string::npos;
  return n;
}

}  // namespace bs::test
