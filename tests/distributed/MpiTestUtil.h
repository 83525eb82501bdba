// Real MPI ranks inside GoogleTest: when ctest runs a *_mpi test executable (no MPI environment), each test
// re-launches the executable under `mpirun -np 2` with BS_MPI_CHILD=1 and --gtest_filter=<that test>; the
// children run the test body for real, and the parent checks how the job ended.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "TestUtil.h"

namespace bs::test {

inline bool in_mpi_child() { return std::getenv("BS_MPI_CHILD") != nullptr; }

inline std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : std::string();
}

inline std::string current_test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->test_suite_name()) + "." + info->name();
}

struct MpiRun {
  RunResult result;
  double seconds = 0;
};

// Runs the current test in `np` real MPI ranks (OMP_NUM_THREADS=1 each).
inline MpiRun run_current_test_under_mpirun(int np = 2, double timeout_s = 60) {
  auto t0 = std::chrono::steady_clock::now();
  MpiRun r;
  r.result = run(
      {"/usr/bin/mpirun", "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(np), "-x", "BS_MPI_CHILD=1",
       "-x", "OMP_NUM_THREADS=1", "-x", "OPENBLAS_NUM_THREADS=1", self_exe(), "--gtest_filter=" + current_test_name()},
      timeout_s);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace bs::test

// First line of an MPI test body: in the parent, run the body in 2 ranks and require that every rank passed.
#define BS_RUN_IN_MPI_RANKS()                                                                     \
  do {                                                                                            \
    if (!::bs::test::in_mpi_child()) {                                                            \
      auto mpi_run = ::bs::test::run_current_test_under_mpirun();                                 \
      EXPECT_EQ(mpi_run.result.exit_code, 0) << mpi_run.result.out << "\n" << mpi_run.result.err; \
      return;                                                                                     \
    }                                                                                             \
  } while (0)
