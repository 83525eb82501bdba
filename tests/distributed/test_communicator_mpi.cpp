// The MPI communicator in 2 real ranks: allreduce results, non-blocking operations completing in any wait
// order, barrier/broadcast/allgather, config-mismatch detection, and a hung or dead peer ending the job
// instead of hanging it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "MpiTestUtil.h"
#include "distributed/Communicator.h"

namespace {

bs::DistributedConfig mpi_config(double timeout_s = 20) {
  bs::DistributedConfig c;
  c.backend = "mpi";
  c.timeout_s = timeout_s;
  return c;
}

TEST(CommunicatorMpi, AllreduceSumsAndAveragesOverRanks) {
  BS_RUN_IN_MPI_RANKS();
  auto comm = bs::make_communicator(mpi_config());
  ASSERT_EQ(comm->backend(), "mpi");
  const int w = comm->world(), r = comm->rank();
  ASSERT_EQ(w, 2);
  auto local = [&](int rank) { return torch::arange(1000, torch::kDouble).mul(0.001 * (rank + 1)).add(rank); };
  torch::Tensor expect_sum = torch::zeros({1000}, torch::kDouble);
  for (int k = 0; k < w; ++k) expect_sum += local(k);

  torch::Tensor t = local(r).to(torch::kFloat);
  comm->allreduce(t, bs::ReduceOp::kSum);
  EXPECT_TRUE(torch::allclose(t.to(torch::kDouble), expect_sum, 1e-6, 1e-5));

  torch::Tensor a = local(r).clone();
  comm->allreduce(a, bs::ReduceOp::kAvg);
  EXPECT_TRUE(torch::allclose(a, expect_sum / w, 1e-12, 1e-12));

  EXPECT_DOUBLE_EQ(comm->allreduce(double(r) + 0.5, bs::ReduceOp::kSum), 0.5 + 1.5);
  EXPECT_DOUBLE_EQ(comm->allreduce(double(r) * 3, bs::ReduceOp::kMax), 3.0);
  torch::Tensor i = torch::full({3}, int64_t(r + 1), torch::kLong);
  comm->allreduce(i, bs::ReduceOp::kSum);
  EXPECT_EQ(i[2].item<int64_t>(), 3);
}

// bf16 buckets (distributed.grad_dtype: compute): summed in fp32 per element and rounded to bf16, so the
// result equals the fp32 sum of the two bf16 inputs rounded once; average and max too.
TEST(CommunicatorMpi, Bfloat16AllreduceSumsInFp32AndRoundsOnce) {
  BS_RUN_IN_MPI_RANKS();
  auto comm = bs::make_communicator(mpi_config());
  const int r = comm->rank();
  auto local = [](int rank) { return torch::linspace(-3, 5, 4097, torch::kFloat).mul(rank + 1).add(0.001 * rank); };
  const auto a = local(0).to(torch::kBFloat16), b = local(1).to(torch::kBFloat16);
  const auto expect = (a.to(torch::kFloat) + b.to(torch::kFloat)).to(torch::kBFloat16);
  torch::Tensor t = (r == 0 ? a : b).clone();
  comm->allreduce(t, bs::ReduceOp::kSum);
  EXPECT_EQ(t.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(t, expect));
  torch::Tensor m = (r == 0 ? a : b).clone();
  comm->allreduce(m, bs::ReduceOp::kMax);
  EXPECT_TRUE(torch::equal(m, torch::max(a, b)));
  torch::Tensor avg = (r == 0 ? a : b).clone();
  comm->allreduce(avg, bs::ReduceOp::kAvg);
  EXPECT_TRUE(torch::allclose(avg.to(torch::kFloat), expect.to(torch::kFloat) / 2, 1e-2, 1e-2));
}

TEST(CommunicatorMpi, NonBlockingOperationsProceedAndCompleteInAnyWaitOrder) {
  BS_RUN_IN_MPI_RANKS();
  auto comm = bs::make_communicator(mpi_config());
  const int r = comm->rank();
  // Rank 1 joins late: rank 0's allreduce_async must return at once, not block until its peer arrives.
  if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<torch::Tensor> ts;
  std::vector<std::shared_ptr<bs::CommWork>> works;
  for (int k = 0; k < 6; ++k) {
    ts.push_back(torch::full({int64_t(1) << (8 + 2 * k)}, float(r + k), torch::kFloat));
    works.push_back(comm->allreduce_async(ts.back(), bs::ReduceOp::kSum));
  }
  if (r == 0) {
    EXPECT_FALSE(works[0]->done()) << "rank 0 cannot be done before rank 1 has joined";
  }
  for (int k = 5; k >= 0; --k) works[k]->wait();  // reverse order of issue
  for (int k = 0; k < 6; ++k) {
    EXPECT_TRUE(works[k]->done());
    EXPECT_FLOAT_EQ(ts[k].min().item<float>(), float(2 * k + 1));
    EXPECT_FLOAT_EQ(ts[k].max().item<float>(), float(2 * k + 1));
    EXPECT_LE(works[k]->enqueued_at(), works[k]->started_at());
    EXPECT_LE(works[k]->started_at(), works[k]->finished_at());
  }
}

TEST(CommunicatorMpi, BarrierBroadcastAllgather) {
  BS_RUN_IN_MPI_RANKS();
  auto comm = bs::make_communicator(mpi_config());
  const int r = comm->rank();
  comm->barrier();
  std::string mine = r == 1 ? std::string("from rank one\0with a zero byte", 30) : std::string("ignored");
  EXPECT_EQ(comm->broadcast(mine, 1), std::string("from rank one\0with a zero byte", 30));
  EXPECT_EQ(comm->broadcast(r == 0 ? "" : "x", 0), "");
  std::vector<double> all = comm->allgather({double(r), 10.0 * r + 0.25});
  EXPECT_EQ(all, (std::vector<double>{0.0, 0.25, 1.0, 10.25}));
}

TEST(CommunicatorMpi, ConfigMismatchIsDetectedOnEveryRank) {
  BS_RUN_IN_MPI_RANKS();
  auto comm = bs::make_communicator(mpi_config());
  EXPECT_NO_THROW(bs::check_same_config(*comm, "model: {hidden: 128}\n"));
  const std::string cfg = comm->rank() == 1 ? "model: {hidden: 256}\n" : "model: {hidden: 128}\n";
  try {
    bs::check_same_config(*comm, cfg);
    ADD_FAILURE() << "rank " << comm->rank() << " did not notice that rank 1's config differs";
  } catch (const bs::DistributedError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 1 "), std::string::npos) << e.what();
  }
}

TEST(CommunicatorMpi, AutoBackendPicksMpiUnderMpirun) {
  BS_RUN_IN_MPI_RANKS();
  bs::LaunchInfo info = bs::detect_launch();
  EXPECT_EQ(info.launcher, "mpirun");
  EXPECT_EQ(info.world, 2);
  bs::DistributedConfig c = mpi_config();
  c.backend = "auto";
  auto comm = bs::make_communicator(c);
  EXPECT_EQ(comm->backend(), "mpi");
  EXPECT_EQ(comm->rank(), info.rank);
}

// Outside mpirun, auto means a single process; unknown backends are config errors naming the key.
TEST(CommunicatorLocal, AutoIsNoneWhenStartedAlone) {
  if (bs::test::in_mpi_child()) {
    GTEST_SKIP();
  }
  bs::DistributedConfig c;
  c.backend = "auto";
  auto comm = bs::make_communicator(c);
  EXPECT_EQ(comm->backend(), "none");
  EXPECT_EQ(comm->world(), 1);
  torch::Tensor t = torch::ones({4});
  comm->allreduce(t, bs::ReduceOp::kAvg);
  EXPECT_FLOAT_EQ(t.sum().item<float>(), 4.0f);
  EXPECT_EQ(comm->allgather({1.5}), std::vector<double>{1.5});
  EXPECT_NO_THROW(bs::check_same_config(*comm, "x"));
  c.backend = "carrier-pigeon";
  try {
    bs::make_communicator(c);
    ADD_FAILURE() << "unknown backend accepted";
  } catch (const bs::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("distributed.backend"), std::string::npos);
  }
}

// Rank 1 hangs (sleeps far past the timeout): rank 0 must raise DistributedError after ~timeout_s, and the
// job must end (rank 0 leaves without MPI_Finalize, so mpirun tears the job down) instead of hanging.
TEST(CommunicatorMpi, HungPeerRaisesDistributedErrorAfterTimeout) {
  if (!bs::test::in_mpi_child()) {
    auto run = bs::test::run_current_test_under_mpirun(2, 60);
    EXPECT_NE(run.result.out.find("rank 0 detected the hung peer"), std::string::npos) << run.result.out << "\n"
                                                                                       << run.result.err;
    EXPECT_NE(run.result.exit_code, 137) << "the job hung until the test harness killed it";
    return;
  }
  auto comm = bs::make_communicator(mpi_config(/*timeout_s=*/2));
  if (comm->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(40));  // mpirun kills us long before
    _exit(0);
  }
  torch::Tensor t = torch::ones({16});
  auto t0 = std::chrono::steady_clock::now();
  try {
    comm->allreduce(t, bs::ReduceOp::kSum);
    FAIL() << "allreduce with a hung peer returned";
  } catch (const bs::DistributedError& e) {
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(std::string(e.what()).find("distributed.timeout_s"), std::string::npos) << e.what();
    EXPECT_GE(waited, 1.9);
    std::cout << "rank 0 detected the hung peer after " << waited << " s: " << e.what() << std::endl;
  }
  // Later operations fail at once instead of hanging.
  EXPECT_THROW(comm->barrier(), bs::DistributedError);
}

// Rank 1 dies during the job: rank 0 must not hang (mpirun ends the job, or the timeout fires).
TEST(CommunicatorMpi, DeadPeerEndsTheJob) {
  if (!bs::test::in_mpi_child()) {
    auto run = bs::test::run_current_test_under_mpirun(2, 60);
    EXPECT_NE(run.result.exit_code, 0) << "a job whose rank died must not report success";
    EXPECT_NE(run.result.exit_code, 137) << "the job hung until the test harness killed it";
    EXPECT_LT(run.seconds, 30.0);
    return;
  }
  auto comm = bs::make_communicator(mpi_config(/*timeout_s=*/5));
  comm->barrier();
  if (comm->rank() == 1) _exit(3);
  torch::Tensor t = torch::ones({16});
  try {
    comm->allreduce(t, bs::ReduceOp::kSum);
  } catch (const bs::DistributedError& e) {
    std::cout << "rank 0: " << e.what() << std::endl;
    _exit(5);  // what the CLI does: exit_code::kDistributed
  }
  _exit(0);
}

}  // namespace
