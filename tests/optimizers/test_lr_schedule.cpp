// Learning-rate schedules: values at warmup start/end and decay end, the MLPerf warmup offset, warmup as a
// fraction of the total steps, and config errors.
#include <gtest/gtest.h>

#include <cmath>

#include "optimizers/LrSchedule.h"

namespace {

bs::ScheduleConfig schedule(const std::string& name, int64_t warmup, double end_lr = 0.0, double power = 1.0) {
  bs::ScheduleConfig c;
  c.name = name;
  c.warmup_steps = warmup;
  c.end_lr = end_lr;
  c.power = power;
  return c;
}

constexpr double kBase = 2e-3;

TEST(LrSchedule, PolyWarmupThenMlperfDecay) {
  bs::optim::LrSchedule s(schedule("poly", 10), kBase, 100);
  EXPECT_EQ(s.warmup_steps(), 10);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);  // warmup start
  EXPECT_DOUBLE_EQ(s.lr_at(5), kBase * 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(9), kBase * 0.9);
  EXPECT_DOUBLE_EQ(s.lr_at(10), kBase * (1 - 10.0 / 100));  // warmup end: decay runs over the global step
  EXPECT_DOUBLE_EQ(s.lr_at(100), 0.0);                      // decay end
  EXPECT_DOUBLE_EQ(s.lr_at(250), 0.0);
}

TEST(LrSchedule, PolyPowerAndEndLr) {
  bs::optim::LrSchedule s(schedule("poly", 0, 1e-5, 2.0), kBase, 100);
  EXPECT_DOUBLE_EQ(s.lr_at(0), kBase);
  EXPECT_NEAR(s.lr_at(50), (kBase - 1e-5) * 0.25 + 1e-5, 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(100), 1e-5);
  EXPECT_DOUBLE_EQ(s.lr_at(1000), 1e-5);
}

TEST(LrSchedule, StartWarmupStepOffsetsTheWarmup) {
  auto c = schedule("poly", 10);
  c.start_warmup_step = -3;  // MLPerf: warmup already 3 steps in at step 0
  bs::optim::LrSchedule s(c, kBase, 100);
  EXPECT_DOUBLE_EQ(s.lr_at(0), kBase * 0.3);
  EXPECT_DOUBLE_EQ(s.lr_at(6), kBase * 0.9);
  EXPECT_DOUBLE_EQ(s.lr_at(7), kBase * (1 - 7.0 / 100));
  c.start_warmup_step = 4;  // nothing before the offset
  bs::optim::LrSchedule late(c, kBase, 100);
  EXPECT_DOUBLE_EQ(late.lr_at(2), 0.0);
  EXPECT_DOUBLE_EQ(late.lr_at(9), kBase * 0.5);
}

TEST(LrSchedule, WarmupFractionOfTotalSteps) {
  auto c = schedule("linear", -1);
  c.warmup_fraction = 0.1;
  bs::optim::LrSchedule s(c, kBase, 200);
  EXPECT_EQ(s.warmup_steps(), 20);
  EXPECT_DOUBLE_EQ(s.lr_at(10), kBase * 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(20), kBase);
}

TEST(LrSchedule, LinearDecaysFromWarmupEndToEndLr) {
  bs::optim::LrSchedule s(schedule("linear", 10, 1e-4), kBase, 110);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(10), kBase);
  EXPECT_NEAR(s.lr_at(60), (kBase + 1e-4) / 2, 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(110), 1e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(500), 1e-4);
}

TEST(LrSchedule, CosineDecaysFromWarmupEndToEndLr) {
  bs::optim::LrSchedule s(schedule("cosine", 10, 1e-4), kBase, 110);
  EXPECT_DOUBLE_EQ(s.lr_at(10), kBase);
  EXPECT_NEAR(s.lr_at(60), 1e-4 + (kBase - 1e-4) / 2, 1e-15);
  EXPECT_NEAR(s.lr_at(35), 1e-4 + (kBase - 1e-4) * 0.5 * (1 + std::cos(M_PI / 4)), 1e-15);
  EXPECT_NEAR(s.lr_at(110), 1e-4, 1e-15);
}

TEST(LrSchedule, InverseSqrtAfterWarmup) {
  bs::optim::LrSchedule s(schedule("inv_sqrt", 4), kBase, 0);
  EXPECT_DOUBLE_EQ(s.lr_at(2), kBase * 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(4), kBase);
  EXPECT_DOUBLE_EQ(s.lr_at(16), kBase / 2);
  EXPECT_DOUBLE_EQ(s.lr_at(100), kBase * std::sqrt(4.0 / 100));
}

TEST(LrSchedule, ConstantAfterWarmup) {
  bs::optim::LrSchedule s(schedule("constant", 4), kBase, 0);
  EXPECT_DOUBLE_EQ(s.lr_at(1), kBase / 4);
  EXPECT_DOUBLE_EQ(s.lr_at(4), kBase);
  EXPECT_DOUBLE_EQ(s.lr_at(100000), kBase);
  bs::optim::LrSchedule flat(schedule("constant", 0), kBase, 0);
  EXPECT_DOUBLE_EQ(flat.lr_at(0), kBase);
}

TEST(LrSchedule, DecayingScheduleWithoutTotalStepsIsAConfigError) {
  for (const std::string name : {"poly", "linear", "cosine"}) {
    try {
      bs::optim::LrSchedule s(schedule(name, 10), kBase, 0);
      FAIL() << name << ": no exception";
    } catch (const bs::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("schedule.total_steps"), std::string::npos) << e.what();
    }
  }
  auto c = schedule("constant", -1);
  c.warmup_fraction = 0.1;
  EXPECT_THROW(bs::optim::LrSchedule(c, kBase, 0), bs::ConfigError);
  EXPECT_THROW(bs::optim::LrSchedule(schedule("step", 0), kBase, 10), bs::ConfigError);
}

}  // namespace
