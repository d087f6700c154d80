#include "bench/decode_bench.h"

#include <gtest/gtest.h>

#include <string>

#include "base/io.h"
#include "base/test_expect_error.h"
#include "model/info.h"
#include "model/test_support.h"

namespace foundry {
namespace {

ModelConfig config_file(const std::string& name) {
  const std::string path = std::string(FOUNDRY_SOURCE_DIR) + "/configs/" + name;
  return parse_model_config(json::parse(read_text_file(path))["model"], path);
}

// vocab 50, C = 16, 2 layers, 4 / 2 heads of 4, 4 experts of F = 24, top-1.
ModelConfig tiny_moe() { return testing::small_moe_config(4, 1); }

TEST(DecodeBench, ParsesWidthsAndNamesTheBadOne) {
  const auto w = parse_widths("--widths", "8x1024x2,16x512x4");
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[1].experts, 16);
  EXPECT_EQ(w[1].ffn_dim, 512);
  EXPECT_EQ(w[1].top_k, 4);
  EXPECT_EQ(w[0].label(), "8x1024 top-2");
  expect_error([] { parse_widths("--widths", "8x1024"); }, "--widths '8x1024': '8x1024'");
  expect_error([] { parse_widths("--widths", "8x0x2"); }, "'8x0x2' is not EXPERTSxFFNxTOPK");
  expect_error([] { parse_widths("--widths", "2x64x4"); }, "top-k 4 exceeds 2 experts");
}

TEST(DecodeBench, FinerWidthsKeepTotalAndActiveParameters) {
  const ModelConfig c = config_file("moe-bench.json");  // 8 experts of 1024, top-2
  const auto w = finer_widths(c, 4);
  ASSERT_EQ(w.size(), 4u);
  const ParamCounts base = count_parameters(c);
  for (const MoeWidth& x : w) {
    const ParamCounts p = count_parameters(with_width(c, x));
    EXPECT_EQ(x.experts * x.ffn_dim, 8 * 1024);
    EXPECT_EQ(x.top_k * x.ffn_dim, 2 * 1024);
    // The router grows with the expert count; the experts stay the same size.
    EXPECT_NEAR(double(p.active_non_embedding), double(base.active_non_embedding),
                0.01 * double(base.active_non_embedding));
  }
  EXPECT_EQ(w.back().experts, 64);
  EXPECT_EQ(finer_widths(c, 1).size(), 1u);
}

TEST(DecodeBench, CcaCacheIsAnEighthOfFullWidthMultiHeadAttention) {
  const ModelConfig c = config_file("zaya1-base.json");  // d_model 2048, 8 / 2 heads of 128
  const KvCacheSizes s = kv_cache_sizes(c);
  EXPECT_EQ(s.per_token, 2 * 2 * 128);
  EXPECT_EQ(s.mha_full_width, 2 * 2048);
  EXPECT_EQ(s.mha_full_width, 8 * s.per_token);
  EXPECT_EQ(s.mha_same_heads, 4 * s.per_token);
  EXPECT_EQ(s.gqa_same_kv_heads, s.per_token);
  EXPECT_EQ(s.cca_state_per_sequence, (1024 + 256) * 2 + 128);
  const std::string table = format_kv_cache_sizes(c);
  EXPECT_NE(table.find("| CCA (K and V of the KV heads) | 512 | 1024 | 2048 | 1.0x |"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("| MHA, 16 heads of 128 (full width) | 4096 | 8192 | 16384 | 8.0x |"),
            std::string::npos)
      << table;
  EXPECT_EQ(kv_cache_sizes(tiny_moe()).cca_state_per_sequence, 0);
}

TEST(DecodeBench, RunsEveryWidthAndBatch) {
  DecodeBenchOptions o;
  o.model = tiny_moe();
  o.widths = {{4, 128, 1}, {8, 64, 2}};
  o.batches = {1, 3};
  o.context = 8;
  o.warmup = 1;
  o.steps = 3;
  o.warmup_s = 0;
  int64_t reported = 0;
  o.on_progress = [&](int64_t done, int64_t total, const std::string&) {
    EXPECT_EQ(total, 4);
    reported = done;
  };
  const DecodeBenchResult r = run_decode_bench(o);
  EXPECT_EQ(reported, 4);
  ASSERT_EQ(r.points.size(), 4u);
  for (const DecodePoint& p : r.points) {
    EXPECT_GT(p.median_s, 0);
    EXPECT_LE(p.min_s, p.median_s);
    EXPECT_LE(p.median_s, p.max_s);
    EXPECT_DOUBLE_EQ(p.tokens_per_s, double(p.batch) / p.median_s);
  }
  EXPECT_EQ(r.points[3].width.experts, 8);
  EXPECT_EQ(r.points[3].batch, 3);
  // No prediction: no prediction columns.
  EXPECT_EQ(format_decode_table(r).find("predicted"), std::string::npos);
}

TEST(DecodeBench, RejectsWhatCannotRun) {
  DecodeBenchOptions o;
  o.model = tiny_moe();
  o.batches = {};
  expect_error([&] { validate(o); }, "--batches is empty");
  o.batches = {1};
  o.steps = 0;
  expect_error([&] { validate(o); }, "--steps 0");
  o.steps = 1;
  o.widths = {{4, 100, 1}};  // not a multiple of anything is fine; top-k too large is not
  validate(o);
  o.widths = {{2, 64, 3}};
  expect_error([&] { validate(o); }, "2x64 top-3");
}

}  // namespace
}  // namespace foundry
