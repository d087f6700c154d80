#include "optim/clip.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "base/error.h"
#include "optim/test_util.h"

namespace foundry {
namespace {

using test::random_slab;
using test::tiny_moe_config;

// Sum of squares in double over the tensors only, the plain way.
double reference_norm(const std::vector<float>& grads, const ParamTable& table) {
  double sum = 0;
  for (const ParamInfo& info : table.params())
    for (int64_t i = info.offset; i < info.offset + info.numel; ++i)
      sum += double(grads[i]) * grads[i];
  return std::sqrt(sum);
}

TEST(ClipGradNorm, NormMatchesDoubleReferenceAndIgnoresPadding) {
  const ParamTable table(tiny_moe_config());
  const std::vector<float> grads = random_slab(table, 1, 0.3, /*padding_value=*/1e6f);
  const double expected = reference_norm(grads, table);
  EXPECT_NEAR(grad_norm(grads.data(), table), expected, 1e-12 * expected);
}

TEST(ClipGradNorm, ScalesToExactlyMaxNorm) {
  const ParamTable table(tiny_moe_config());
  const std::vector<float> original = random_slab(table, 2, 1.0);
  std::vector<float> grads = original;
  const double norm = reference_norm(original, table);
  const double max_norm = norm / 3.0;

  const double returned = clip_grad_norm(grads.data(), table, max_norm);
  EXPECT_NEAR(returned, norm, 1e-12 * norm) << "returns the norm before clipping";
  EXPECT_NEAR(grad_norm(grads.data(), table), max_norm, 1e-6 * max_norm);
  const float factor = static_cast<float>(max_norm / returned);
  for (const ParamInfo& info : table.params())
    for (int64_t i = info.offset; i < info.offset + info.numel; ++i)
      ASSERT_EQ(grads[i], original[i] * factor);
}

TEST(ClipGradNorm, NoOpAtOrBelowMaxNormAndWhenOff) {
  const ParamTable table(tiny_moe_config());
  const std::vector<float> original = random_slab(table, 3, 1.0);
  const double norm = reference_norm(original, table);
  for (double max_norm : {norm * 2, norm * (1 + 1e-9), 0.0}) {
    std::vector<float> grads = original;
    clip_grad_norm(grads.data(), table, max_norm);
    EXPECT_EQ(grads, original) << "max_norm " << max_norm;
  }
}

TEST(ClipGradNorm, NonFiniteNormIsReportedAndGradsUntouched) {
  const ParamTable table(tiny_moe_config());
  const std::vector<float> original = random_slab(table, 4, 1.0);
  const int64_t at = table.get("model.layers.1.self_attn.v_proj.weight").offset + 5;

  std::vector<float> grads = original;
  grads[at] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> with_nan = grads;
  EXPECT_TRUE(std::isnan(clip_grad_norm(grads.data(), table, 1.0)));
  for (size_t i = 0; i < grads.size(); ++i) {
    if (static_cast<int64_t>(i) == at) continue;
    ASSERT_EQ(grads[i], with_nan[i]);
  }
  EXPECT_TRUE(std::isnan(grads[at]));

  grads = original;
  grads[at] = -std::numeric_limits<float>::infinity();
  const std::vector<float> with_inf = grads;
  EXPECT_EQ(clip_grad_norm(grads.data(), table, 1.0), std::numeric_limits<double>::infinity());
  EXPECT_EQ(grads, with_inf);
}

TEST(ClipGradNorm, LargeFiniteGradientsDoNotOverflow) {
  const ParamTable table(tiny_moe_config());
  std::vector<float> grads(table.total_elements(), 0.0f);
  for (const ParamInfo& info : table.params())
    for (int64_t i = info.offset; i < info.offset + info.numel; ++i) grads[i] = 1e30f;
  const double norm = grad_norm(grads.data(), table);
  EXPECT_TRUE(std::isfinite(norm));
  EXPECT_NEAR(norm, 1e30 * std::sqrt(double(table.parameter_count())), 1e-6 * norm);
}

TEST(ClipGradNorm, BitwiseIdenticalWithOneOrTwoThreads) {
  const ParamTable table(tiny_moe_config());
  const int saved = omp_get_max_threads();
  std::vector<float> a = random_slab(table, 5, 1.0), b = a;
  omp_set_num_threads(1);
  const double norm_one = clip_grad_norm(a.data(), table, 0.5);
  omp_set_num_threads(2);
  const double norm_two = clip_grad_norm(b.data(), table, 0.5);
  omp_set_num_threads(saved);
  EXPECT_EQ(norm_one, norm_two);  // bitwise, not approximately
  EXPECT_EQ(a, b);
}

// Groups of eight equal chunks are read side by side, the rest one at a time: every chunk's
// sum has exactly the bits of sum_of_squares over it alone, whatever its group.
TEST(ClipGradNorm, ChunkSumsEqualEachChunkSummedAlone) {
  std::vector<float> x(40000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * static_cast<double>(i)) * 3.1f;
  std::vector<SlabChunk> chunks;
  for (int64_t c = 0; c < 16; ++c) chunks.push_back({c * 1003, 1001, false});  // two groups
  for (int64_t c = 0; c < 5; ++c) chunks.push_back({16100 + c * 30, 29 - c, false});  // mixed
  for (int64_t c = 0; c < 8; ++c) chunks.push_back({20000 + c * 2500, 2499 + (c == 7), false});
  std::vector<double> sums(chunks.size(), -1.0);
  chunk_sums_of_squares(chunks, [&](int64_t offset) { return x.data() + offset; }, sums.data());
  for (size_t c = 0; c < chunks.size(); ++c) {
    const double alone = sum_of_squares(x.data() + chunks[c].offset, chunks[c].size);
    EXPECT_EQ(std::bit_cast<uint64_t>(sums[c]), std::bit_cast<uint64_t>(alone)) << "chunk " << c;
    double plain = 0;
    for (int64_t i = 0; i < chunks[c].size; ++i)
      plain += double(x[chunks[c].offset + i]) * x[chunks[c].offset + i];
    EXPECT_NEAR(sums[c], plain, 1e-12 * plain) << "chunk " << c;
  }
}

TEST(ClipGradNorm, RejectsNegativeMaxNorm) {
  const ParamTable table(tiny_moe_config());
  std::vector<float> grads(table.total_elements(), 1.0f);
  EXPECT_THROW(clip_grad_norm(grads.data(), table, -1.0), Error);
}

}  // namespace
}  // namespace foundry
