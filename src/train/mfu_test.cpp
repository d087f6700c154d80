#include "train/mfu.h"

#include <gtest/gtest.h>

#include "base/config_reader.h"
#include "base/io.h"
#include "data/test_util.h"
#include "train/processes.h"
#include "train/run_config.h"

namespace foundry {
namespace {

TEST(MfuPeak, TheConfiguredPeakWinsThenTheProfileThenAMeasurement) {
  const Processes one(nullptr, 0);
  TrainConfig tc;
  tc.precision = DType::bf16;
  tc.peak_gflops = 250;
  const DevicePeak profile{400e9, "profile p.json, measured bf16 GEMM peak", true};
  MfuPeak p = choose_mfu_peak(tc, profile, one, false);
  EXPECT_DOUBLE_EQ(p.flops_per_s, 250e9);
  EXPECT_NE(p.source.find("train.peak_gflops"), std::string::npos) << p.source;

  tc.peak_gflops = 0;
  p = choose_mfu_peak(tc, profile, one, false);
  EXPECT_DOUBLE_EQ(p.flops_per_s, 400e9);  // one process: one host
  EXPECT_EQ(p.source, "profile p.json, measured bf16 GEMM peak × 1 host");

  tc.precision = DType::f32;
  p = choose_mfu_peak(tc, std::nullopt, one, false);
  EXPECT_GT(p.flops_per_s, 1e9);  // any CPU with oneDNN does more than 1 GFLOP/s in fp32
  EXPECT_NE(p.source.find("measured at start"), std::string::npos) << p.source;
  EXPECT_NE(p.source.find("fp32"), std::string::npos) << p.source;
}

// A resumed run divides by the peak its first attempt measured, when that attempt measured it
// the same way (precision, ranks); otherwise it measures again.
TEST(MfuPeak, AResumeReusesThePeakTheRunMeasuredTheSameWay) {
  const Processes one(nullptr, 0);
  const testing::TempDir dir;
  TrainConfig tc;
  tc.run_dir = dir.path();
  tc.precision = DType::f32;
  const std::string source = "measured at start: best fp32 GEMM of 5 bursts";
  write_file_atomic(
      dir.path() + "/metrics.jsonl",
      json({{"step", 1}, {"peak_gflops", 123456.0}, {"peak_source", source}}).dump() + "\n" +
          json({{"step", 2}, {"peak_gflops", 7.5}, {"peak_source", source}}).dump() + "\n");
  MfuPeak p = choose_mfu_peak(tc, std::nullopt, one, /*resuming=*/true);
  EXPECT_DOUBLE_EQ(p.flops_per_s, 7.5e9);  // the last line's
  EXPECT_EQ(p.source, source);
  // Not resuming, or measured in the other precision: a new measurement.
  EXPECT_NE(choose_mfu_peak(tc, std::nullopt, one, false).flops_per_s, 7.5e9);
  tc.precision = DType::bf16;
  p = choose_mfu_peak(tc, std::nullopt, one, true);
  EXPECT_NE(p.flops_per_s, 7.5e9);
  EXPECT_NE(p.source.find("bf16"), std::string::npos) << p.source;
}

TEST(MfuWatch, TheFirstStepAbove100PercentIsReportedOnce) {
  MfuWatch watch({100e9, "train.peak_gflops 100 per process"});
  EXPECT_DOUBLE_EQ(watch.mfu(50e9), 0.5);
  EXPECT_EQ(watch.check(1, 0.5), "");
  EXPECT_EQ(watch.check(2, 1.0), "");  // exactly the peak is possible
  const std::string w = watch.check(3, 1.07);
  EXPECT_NE(w.find("step 3"), std::string::npos) << w;
  EXPECT_NE(w.find("107.0%"), std::string::npos) << w;
  EXPECT_NE(w.find("train.peak_gflops 100 per process"), std::string::npos) << w;
  EXPECT_NE(w.find("train.hardware_profile"), std::string::npos) << w;
  EXPECT_EQ(watch.check(4, 1.2), "");  // once
}

}  // namespace
}  // namespace foundry
