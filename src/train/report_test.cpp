#include "train/report.h"

#include <gtest/gtest.h>

namespace foundry {
namespace {

TEST(Report, OpBreakdownGivesTheMeanPerStepAndTheShare) {
  OpTimes times;
  times.enabled = true;
  times.add("attention", 0.3);
  times.add("optimizer", 0.1);
  EXPECT_EQ(format_op_breakdown(times, 2),
            "\nper-operation time (mean per step over 2 steps):\n"
            "  attention                            150.00 ms   75.0%\n"
            "  optimizer                             50.00 ms   25.0%\n"
            "  total                                200.00 ms\n");
}

TEST(Report, MemoryLineNamesEveryRankUnderDataParallelism) {
  const double mib = 1 << 20;
  EXPECT_EQ(
      format_memory_line(2.5 * mib, "ZeRO-1", {{100 * mib, 60 * mib}, {90 * mib, 50 * mib}}, true),
      "memory per rank: optimizer state 2.5 MiB (ZeRO-1) | weight and gradient slabs rank 0 "
      "60 MiB, rank 1 50 MiB | peak RSS before the final checkpoint rank 0 100 MiB, rank 1 90 MiB");
  EXPECT_EQ(format_memory_line(1 * mib, "single process", {{10 * mib, 4 * mib}}, false),
            "memory per rank: optimizer state 1.0 MiB | weight and gradient slabs 4 MiB | peak RSS "
            "before the final checkpoint 10 MiB");
  EXPECT_EQ(gather_rank_memory(nullptr, {3, 4}).size(), 1u);
  EXPECT_GT(peak_rss_bytes(), 0);
}

TEST(Report, GradientCommTotalsAveragePerStep) {
  GradientCommTotals totals;
  EXPECT_EQ(totals.exposed_per_step(), 0);
  GradientReduceStats s;
  s.collectives = 3;
  s.started_in_backward = 2;
  s.elements_in_backward = 50;
  s.exposed_seconds = 0.004;
  s.in_backward_seconds = 0.010;
  totals.add(s);
  s.exposed_seconds = 0.002;
  totals.add(s);
  EXPECT_DOUBLE_EQ(totals.exposed_per_step(), 0.003);
  EXPECT_EQ(totals.describe(100),
            "gradient reduction per step (2 steps): 3.0 buckets, 2.0 started during backward "
            "carrying 50% of the slab; 10.0 ms starting and polling inside backward, 3.0 ms "
            "exposed after it");
}

}  // namespace
}  // namespace foundry
