// The op timers: the host's wall clock by default, a device's clock when one is set, whose
// intervals are read only when the times are.
#include "base/timer.h"

#include <gtest/gtest.h>

#include <vector>

namespace foundry {
namespace {

// A clock whose marks are the ticks given to it, one second per tick.
class FakeClock final : public OpClock {
 public:
  double now = 0;
  std::vector<double> marks;
  int reads = 0, resets = 0;
  int64_t mark() override {
    marks.push_back(now);
    return static_cast<int64_t>(marks.size()) - 1;
  }
  double seconds(int64_t from, int64_t to) override {
    ++reads;
    return marks[to] - marks[from];
  }
  void reset() override {
    ++resets;
    marks.clear();
  }
};

TEST(OpTimes, OffCostsNothingAndRecordsNothing) {
  OpTimes times;
  FakeClock clock;
  times.set_clock(&clock);
  { ScopedOpTimer t(&times, "gemm"); }
  EXPECT_TRUE(clock.marks.empty());
  EXPECT_TRUE(times.seconds().empty());
}

TEST(OpTimes, ADeviceClockTimesNestedOpsAndIsReadWhenTheTimesAre) {
  OpTimes times;
  times.enabled = true;
  FakeClock clock;
  times.set_clock(&clock);
  {
    ScopedOpTimer outer(&times, "layer");
    clock.now = 1;
    {
      ScopedOpTimer inner(&times, "gemm");
      clock.now = 3.5;
    }
    clock.now = 4;
  }
  {
    ScopedOpTimer again(&times, "gemm");
    clock.now = 4.25;
  }
  EXPECT_EQ(clock.reads, 0) << "intervals must not be read while the device may still work";
  const auto& s = times.seconds();
  EXPECT_DOUBLE_EQ(s.at("layer"), 4.0);
  EXPECT_DOUBLE_EQ(s.at("gemm"), 2.75);
  EXPECT_EQ(clock.reads, 3);
  EXPECT_EQ(clock.resets, 1);
  times.clear();
  EXPECT_TRUE(times.seconds().empty());
}

TEST(OpTimes, WithoutAClockTheWallClockCounts) {
  OpTimes times;
  times.enabled = true;
  { ScopedOpTimer t(&times, "sleepless"); }
  ASSERT_EQ(times.seconds().count("sleepless"), 1u);
  EXPECT_GE(times.seconds().at("sleepless"), 0.0);
}

}  // namespace
}  // namespace foundry
