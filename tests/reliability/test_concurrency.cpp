// Load: two trials in parallel sending an eval event every step, while readers (`study status`, the way a
// user watches a study) open the same file again and again. No "database is locked", and every eval
// event the trials wrote is stored exactly once.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "ReliabilityUtil.h"

using namespace bs;

TEST(Concurrency, ParallelTrialsWithFrequentEventsStoreEveryEventOnce) {
  std::string dir = test::make_temp_dir("rel-load");
  std::string db = dir + "/load/study.db";
  // mpirun with one rank: the events come on the trial's stdout, and the controller keeps a copy of every
  // line in trials/NNNN/stdout.log, which is what the stored rows are counted against.
  auto argv =
      test::smoke_study(dir, "load",
                        {"n_trials=4", "parallel=2", "launcher.kind=mpirun", "launcher.ranks=1",
                         "base.target.mlm_accuracy=0.99", "base.target.max_samples=384",
                         "base.target.eval_every_samples=16", "base.data.eval_samples=16", "base.batch.micro=16"});
  pid_t ctl = test::spawn(argv, dir + "/controller.log");
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, read_failures{0};
  std::string failure;
  std::thread reader([&] {
    while (!stop) {
      if (std::ifstream(db)) {
        auto r = test::run({test::bertsweep_bin(), "study", "status", "load", "--dir", dir}, 60);
        ++reads;
        if (r.exit_code != 0) {
          ++read_failures;
          failure = r.err;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  int code = test::wait_exit(ctl, 400);
  stop = true;
  reader.join();
  std::string log = test::read_file(dir + "/controller.log");
  ASSERT_EQ(code, 0) << log;
  EXPECT_EQ(log.find("locked"), std::string::npos) << log;
  EXPECT_EQ(read_failures.load(), 0) << failure;
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(test::integrity(db), "ok");

  StudyStore store(db);
  auto trials = store.trials();
  ASSERT_EQ(trials.size(), 4u);
  for (const auto& t : trials) {
    EXPECT_EQ(t.state, trial_state::kComplete) << t.number << ": " << t.reason;
    int written = test::count_lines_with(t.trial_dir + "/stdout.log", "\"eval\"");
    EXPECT_GE(written, 384 / 32) << "trial " << t.number << ": fewer eval events than the budget implies";
    auto evals = store.evals(t.number);
    EXPECT_EQ(static_cast<int>(evals.size()), written) << "trial " << t.number;
    for (std::size_t i = 1; i < evals.size(); ++i)
      EXPECT_GT(evals[i].samples, evals[i - 1].samples) << "trial " << t.number << ": a duplicated or reordered eval";
  }
}
