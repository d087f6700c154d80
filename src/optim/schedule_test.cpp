#include "optim/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "base/error.h"

namespace foundry {
namespace {

// A schedule of the named kind; an unknown name fails as the run config does.
LrSchedule make(const std::string& kind, int64_t warmup, int64_t total) {
  LrSchedule s;
  const std::optional<ScheduleKind> parsed = parse_schedule(kind);
  if (!parsed) fail(fmt::format("unknown learning-rate schedule '{}'", kind));
  s.kind = *parsed;
  s.lr = 1e-3;
  s.min_lr_ratio = 0.1;  // floor 1e-4
  s.warmup_steps = warmup;
  s.total_steps = total;
  s.decay_fraction = 0.2;
  return s;
}

constexpr double kTol = 1e-15;

TEST(Schedule, LinearWarmupFromZero) {
  for (const char* kind : {"cosine", "wsd", "constant"}) {
    const LrSchedule s = make(kind, 10, 110);
    EXPECT_NEAR(learning_rate(s, 1), 1e-4, kTol) << kind;   // lr / W
    EXPECT_NEAR(learning_rate(s, 5), 5e-4, kTol) << kind;
    EXPECT_NEAR(learning_rate(s, 10), 1e-3, kTol) << kind;  // end of warmup: peak
  }
}

TEST(Schedule, CosineKeyPoints) {
  const LrSchedule s = make("cosine", 10, 110);
  // Midpoint of the decay (step 60 = W + (S - W)/2): halfway between peak and floor.
  EXPECT_NEAR(learning_rate(s, 60), 1e-4 + 0.5 * (1e-3 - 1e-4), kTol);
  // A quarter in: floor + (peak - floor) * (1 + cos(pi/4)) / 2.
  EXPECT_NEAR(learning_rate(s, 35), 1e-4 + 0.9e-3 * (1 + std::sqrt(0.5)) / 2, kTol);
  EXPECT_NEAR(learning_rate(s, 110), 1e-4, kTol);  // last step: floor
  EXPECT_NEAR(learning_rate(s, 500), 1e-4, kTol);  // past the end: stays at the floor
  double previous = learning_rate(s, 10);
  for (int64_t step = 11; step <= 110; ++step) {
    const double lr = learning_rate(s, step);
    EXPECT_LT(lr, previous) << "step " << step;
    previous = lr;
  }
}

TEST(Schedule, WsdStableThenLinearDecay) {
  const LrSchedule s = make("wsd", 10, 100);  // D = 20: stable through step 80
  EXPECT_NEAR(learning_rate(s, 11), 1e-3, kTol);
  EXPECT_NEAR(learning_rate(s, 50), 1e-3, kTol);
  EXPECT_NEAR(learning_rate(s, 80), 1e-3, kTol);
  EXPECT_NEAR(learning_rate(s, 81), 1e-3 - 0.9e-3 / 20, kTol);  // first decay step
  EXPECT_NEAR(learning_rate(s, 90), 1e-3 - 0.9e-3 / 2, kTol);   // halfway down
  EXPECT_NEAR(learning_rate(s, 100), 1e-4, kTol);               // last step: floor
  EXPECT_NEAR(learning_rate(s, 150), 1e-4, kTol);
}

TEST(Schedule, ConstantAfterWarmup) {
  const LrSchedule s = make("constant", 4, 100);
  EXPECT_NEAR(learning_rate(s, 1), 2.5e-4, kTol);
  EXPECT_EQ(learning_rate(s, 5), 1e-3);
  EXPECT_EQ(learning_rate(s, 100), 1e-3);
}

TEST(Schedule, NoWarmup) {
  EXPECT_EQ(learning_rate(make("constant", 0, 100), 1), 1e-3);
  EXPECT_EQ(learning_rate(make("wsd", 0, 100), 1), 1e-3);
  // Cosine without warmup starts one step into the decay.
  EXPECT_NEAR(learning_rate(make("cosine", 0, 100), 1),
              1e-4 + 0.9e-3 * (1 + std::cos(std::numbers::pi / 100)) / 2, kTol);
  EXPECT_NEAR(learning_rate(make("cosine", 0, 100), 100), 1e-4, kTol);
}

TEST(Schedule, ParsesTheThreeKindsByName) {
  EXPECT_EQ(parse_schedule("cosine"), ScheduleKind::cosine);
  EXPECT_EQ(parse_schedule("wsd"), ScheduleKind::wsd);
  EXPECT_EQ(parse_schedule("constant"), ScheduleKind::constant);
  EXPECT_EQ(parse_schedule("linear"), std::nullopt);
  EXPECT_EQ(parse_schedule("Cosine"), std::nullopt);
  for (ScheduleKind k : {ScheduleKind::cosine, ScheduleKind::wsd, ScheduleKind::constant})
    EXPECT_EQ(parse_schedule(schedule_name(k)), k);
}

TEST(Schedule, RejectsBadInput) {
  EXPECT_THROW(learning_rate(make("cosine", 10, 100), 0), Error);
  EXPECT_THROW(learning_rate(make("linear", 10, 100), 50), Error);
}

}  // namespace
}  // namespace foundry
