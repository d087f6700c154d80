#include "bench/profile.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "base/io.h"

namespace foundry {
namespace {

json minimal_profile() {
  return json::parse(R"({
    "format": "foundry-hardware-profile", "version": 1, "name": "test",
    "device": {"kind": "cpu", "memory_bytes": 1000000000},
    "compute": {"bf16": {"measured_flops_per_s": 8e11}, "fp32": {"measured_flops_per_s": 4e11}},
    "memory": {"measured_bytes_per_s": 7e10},
    "gemm": {"points": [
      {"dtype": "bf16", "m": 2048, "n": 2048, "k": 2048, "flops_per_s": 8e11, "kind": "square"},
      {"dtype": "bf16", "m": 256, "n": 256, "k": 256, "flops_per_s": 2e11, "kind": "square"},
      {"dtype": "bf16", "m": 1024, "n": 1024, "k": 1024, "flops_per_s": 6e11, "kind": "square"},
      {"dtype": "bf16", "m": 1024, "n": 1024, "k": 1024, "flops_per_s": 6e11, "kind": "offsize"},
      {"dtype": "bf16", "m": 1024, "n": 1025, "k": 1024, "flops_per_s": 3e11, "kind": "offsize"},
      {"dtype": "bf16", "m": 1024, "n": 1026, "k": 1024, "flops_per_s": 4.5e11, "kind": "offsize"}
    ]},
    "collectives": [
      {"op": "all_reduce", "ranks": 2, "algorithm": "default", "fit": {"alpha_s": 1e-5, "beta_bytes_per_s": 2e9}},
      {"op": "all_reduce", "ranks": 4, "algorithm": "default", "fit": {"alpha_s": 2e-5, "beta_bytes_per_s": 1e9}}
    ]
  })");
}

TEST(Profile, BusBandwidthFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(busbw_factor("all_reduce", 4), 2.0 * 3 / 4);
  EXPECT_DOUBLE_EQ(busbw_factor("reduce_scatter", 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(busbw_factor("all_gather", 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor("all_to_all", 2), 0.5);
  EXPECT_DOUBLE_EQ(busbw_factor("broadcast", 16), 1.0);
  EXPECT_THROW(busbw_factor("gather", 2), Error);
}

TEST(Profile, GemmRateMatchesMeasuredPointsAndInterpolatesBetween) {
  const HardwareProfile p = parse_profile(minimal_profile(), "test.json");
  EXPECT_DOUBLE_EQ(p.gemm_rate(DType::bf16, 2048, 2048, 2048), 8e11);
  EXPECT_DOUBLE_EQ(p.gemm_rate(DType::bf16, 256, 256, 256), 2e11);
  const double mid = p.gemm_rate(DType::bf16, 1536, 1536, 1536);  // between 1024 and 2048
  EXPECT_GT(mid, 6e11 * 0.99);
  EXPECT_LT(mid, 8e11);
  // No fp32 points: the best fp32 rate applies.
  EXPECT_DOUBLE_EQ(p.gemm_rate(DType::f32, 512, 512, 512), 4e11);
}

// At one rank count a GPU profile answers with NCCL's fit (`bench comm --device cuda`), a CPU
// profile with the MPI library's default, whichever comes first in the file.
TEST(Profile, AtOneRankCountAGpuTakesNcclsFitAndACpuTheDefault) {
  json doc = minimal_profile();
  doc["collectives"].insert(doc["collectives"].begin(), json::parse(
      R"({"op": "all_reduce", "ranks": 2, "algorithm": "nccl", "fit": {"alpha_s": 3e-6, "beta_bytes_per_s": 9e10}})"));
  EXPECT_EQ(parse_profile(doc, "cpu.json").collective("all_reduce", 2).algorithm, "default");
  doc["device"]["kind"] = "gpu";
  EXPECT_EQ(parse_profile(doc, "gpu.json").collective("all_reduce", 2).algorithm, "nccl");
  // Below every measured count the nearest one above answers, by the same rule.
  doc["collectives"].push_back(json::parse(
      R"({"op": "all_reduce", "ranks": 2, "algorithm": "default", "fit": {"alpha_s": 1e-5, "beta_bytes_per_s": 2e9}})"));
  doc["collectives"].erase(doc["collectives"].begin() + 1);  // the first "default" at 2 ranks
  EXPECT_EQ(parse_profile(doc, "gpu.json").collective("all_reduce", 1).algorithm, "nccl");
  doc["device"]["kind"] = "cpu";
  EXPECT_EQ(parse_profile(doc, "cpu.json").collective("all_reduce", 1).algorithm, "default");
}

// Decode points (weights from memory) answer decode_gemm_rate and only it: the training
// rates keep coming from the other points.
TEST(Profile, DecodePointsAnswerOnlyTheDecodeRate) {
  json doc = minimal_profile();
  const HardwareProfile without = parse_profile(doc, "test.json");
  EXPECT_EQ(without.decode_gemm_rate(DType::bf16, 16, 2048, 512), 0.0);
  doc["gemm"]["points"].push_back(json::parse(
      R"({"dtype": "bf16", "m": 16, "n": 2048, "k": 512, "flops_per_s": 1e11, "kind": "decode"})"));
  doc["gemm"]["points"].push_back(json::parse(
      R"({"dtype": "bf16", "m": 64, "n": 2048, "k": 512, "flops_per_s": 3e11, "kind": "decode"})"));
  const HardwareProfile with = parse_profile(doc, "test.json");
  EXPECT_DOUBLE_EQ(with.decode_gemm_rate(DType::bf16, 16, 2048, 512), 1e11);
  EXPECT_DOUBLE_EQ(with.decode_gemm_rate(DType::bf16, 64, 2048, 512), 3e11);
  const double mid = with.decode_gemm_rate(DType::bf16, 32, 2048, 512);
  EXPECT_GT(mid, 1e11);
  EXPECT_LT(mid, 3e11);
  EXPECT_EQ(with.decode_gemm_rate(DType::f32, 16, 2048, 512), 0.0);  // none of the dtype
  for (int64_t m : {16, 64, 300})
    EXPECT_DOUBLE_EQ(with.gemm_rate(DType::bf16, m, 2048, 512),
                     without.gemm_rate(DType::bf16, m, 2048, 512));
}

TEST(Profile, AlignmentFactorsComeFromTheOffSizeScan) {
  const HardwareProfile p = parse_profile(minimal_profile(), "test.json");
  // n = 1024 (multiple of 64) is the reference; 1026 (multiple of 2) runs at 0.75, 1025 at 0.5.
  EXPECT_DOUBLE_EQ(p.alignment_factor(1024, 2048), 1.0);
  EXPECT_NEAR(p.alignment_factor(1026, 1024), 0.75, 1e-12);
  EXPECT_NEAR(p.alignment_factor(1024, 1025), 0.5, 1e-12);
  EXPECT_NEAR(p.gemm_rate(DType::bf16, 2048, 2047, 2048), 8e11 * 0.5, 8e11 * 0.5 * 1e-4);
}

TEST(Profile, SaturationModelReachesHalfRateAtItsHalfWork) {
  json doc = minimal_profile();
  doc["gemm"] = {{"efficiency_model", {{"kind", "saturation"}, {"half_efficiency_flops", 2e10}}},
                 {"alignment", json::array({{{"multiple", 64}, {"factor", 1.0}},
                                            {{"multiple", 1}, {"factor", 0.5}}})}};
  const HardwareProfile p = parse_profile(doc, "sat.json");
  // 2·m·n·k = 2e10 at m = n = k = 2154.4: pick a shape with exactly that work.
  const double rate = p.gemm_rate(DType::bf16, 1000, 1000, 10000);  // 2e10 FLOPs, aligned? no
  EXPECT_NEAR(rate, 8e11 * 0.5 * p.alignment_factor(1000, 10000), 1);
  EXPECT_NEAR(p.gemm_rate(DType::bf16, 1024, 1024, 9536), 8e11 * 2.0 * 1024 * 1024 * 9536 /
                                                              (2.0 * 1024 * 1024 * 9536 + 2e10), 1);
}

TEST(Profile, RooflineBoundsMemoryBoundShapes) {
  const HardwareProfile p = parse_profile(minimal_profile(), "test.json");
  // One row against a 4096 × 4096 bf16 matrix: 2·4096² FLOPs over ~2·4096² bytes.
  const double bytes = (4096.0 + 4096.0 * 4096.0) * 2 + 4096.0 * 4;
  EXPECT_NEAR(p.gemm_rate(DType::bf16, 1, 4096, 4096), 2.0 * 4096 * 4096 / bytes * 7e10, 1e3);
  EXPECT_DOUBLE_EQ(p.gemm_rate(DType::bf16, 2048, 2048, 2048), 8e11);  // compute-bound
}

TEST(Profile, CollectiveTimeUsesTheNearestRankCountAndBusBandwidth) {
  const HardwareProfile p = parse_profile(minimal_profile(), "test.json");
  EXPECT_DOUBLE_EQ(p.collective_time("all_reduce", 1, 1e6), 0.0);
  EXPECT_NEAR(p.collective_time("all_reduce", 2, 2e9), 1e-5 + 1.0, 1e-12);
  EXPECT_NEAR(p.collective_time("all_reduce", 4, 1e9), 2e-5 + 1.0, 1e-12);
  // 8 ranks from the 4-rank fit: busbw = 1e9 · 1.5 stays, algbw = busbw / 1.75.
  EXPECT_NEAR(p.collective_time("all_reduce", 8, 1e9), 2e-5 + 1e9 / (1.5e9 / 1.75), 1e-9);
  EXPECT_THROW(p.collective_time("all_to_all", 2, 1e6), Error);
}

TEST(Profile, BadProfilesAreRejectedWithTheKey) {
  json doc = minimal_profile();
  doc["format"] = "something-else";
  EXPECT_THROW(parse_profile(doc, "x.json"), Error);
  doc = minimal_profile();
  doc["memory"]["measured_bytes_per_s"] = "fast";
  try {
    parse_profile(doc, "x.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("measured_bytes_per_s"), std::string::npos) << e.what();
  }
  doc = minimal_profile();
  doc["collectives"][0]["op"] = "allreduce";
  EXPECT_THROW(parse_profile(doc, "x.json"), Error);
}

TEST(Profile, UnknownProfileNameListsTheAvailableOnes) {
  try {
    load_profile("no-such-profile");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-profile"), std::string::npos);
    EXPECT_NE(e.hint().find("mi300x"), std::string::npos) << e.hint();
  }
  EXPECT_THROW(load_profile("/nonexistent/dir/profile.json"), Error);
}

TEST(Profile, ReferenceProfilesLoad) {
  for (const char* name : {"mi300x", "h100"}) {
    const HardwareProfile p = load_profile(name);
    EXPECT_EQ(p.kind, "gpu") << name;
    EXPECT_GT(p.memory_bytes, int64_t{50} * 1000 * 1000 * 1000) << name;
    EXPECT_GT(p.max_gemm_rate(DType::bf16), 5e14) << name;
    EXPECT_GT(p.memory_bandwidth(), 2e12) << name;
    for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"})
      EXPECT_GT(p.collective_time(op, 1024, 1e9), 0) << name << " " << op;
  }
}

TEST(Profile, IsBenchOutputKnowsBenchOutputsButNotAHardwareProfile) {
  EXPECT_TRUE(is_bench_output("{\"provenance\": {}, \"gemm\": []}"));
  EXPECT_TRUE(is_bench_output("# date: 2026-11-30 10:00 UTC\n# command: foundry bench gemm\n"));
  EXPECT_FALSE(is_bench_output(
      "{\"format\": \"foundry-hardware-profile\", \"provenance\": {}, \"gemm\": {}}"));
  EXPECT_FALSE(is_bench_output("{\"model\": {}, \"train\": {}}"));
  EXPECT_FALSE(is_bench_output("date,kind\n"));
}

}  // namespace
}  // namespace foundry
