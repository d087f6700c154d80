#include "infer/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/test_expect_error.h"

namespace foundry::infer {
namespace {

TEST(Sampling, GreedyTakesTheFirstLargestLogitAndDrawsNothing) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  Rng rng(1), untouched(1);
  SamplingOptions greedy{0.0, 0, 1.0};
  EXPECT_EQ(sample_token(logits.data(), 4, 0, greedy, rng), 1);
  EXPECT_EQ(rng.next_u64(), untouched.next_u64());
}

TEST(Sampling, DrawsInProportionToTheSoftmaxAtTheTemperature) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, -1.0f};
  const double temperature = 0.7;
  std::vector<double> expected(4);
  double total = 0;
  for (int i = 0; i < 4; ++i) total += expected[i] = std::exp(logits[i] / temperature);
  Rng rng(42);
  std::vector<int> counts(4, 0);
  const int draws = 40000;
  for (int i = 0; i < draws; ++i)
    ++counts[sample_token(logits.data(), 4, 0, {temperature, 0, 1.0}, rng)];
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(counts[i] / double(draws), expected[i] / total, 0.01) << "token " << i;
}

TEST(Sampling, TopKAndTopPKeepOnlyTheMostLikely) {
  const std::vector<float> logits = {0.0f, 3.0f, 2.9f, 1.0f, -2.0f};
  Rng rng(7);
  for (int i = 0; i < 500; ++i) {
    const int32_t k2 = sample_token(logits.data(), 5, 0, {1.0, 2, 1.0}, rng);
    EXPECT_TRUE(k2 == 1 || k2 == 2) << k2;
    // Tokens 1 and 2 hold ~0.47 of the mass each: p = 0.3 keeps token 1 alone.
    EXPECT_EQ(sample_token(logits.data(), 5, 0, {1.0, 0, 0.3}, rng), 1);
  }
}

TEST(Sampling, TheSameSeedDrawsTheSameTokens) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = std::sin(i * 1.3f);
  Rng a(9), b(9), c(10);
  std::vector<int32_t> x, y, z;
  for (int i = 0; i < 40; ++i) {
    x.push_back(sample_token(logits.data(), 50, i, {1.0, 0, 0.95}, a));
    y.push_back(sample_token(logits.data(), 50, i, {1.0, 0, 0.95}, b));
    z.push_back(sample_token(logits.data(), 50, i, {1.0, 0, 0.95}, c));
  }
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
}

TEST(Sampling, NonFiniteLogitsAreAnErrorNamingThePosition) {
  std::vector<float> logits = {0.0f, NAN, 1.0f};
  Rng rng(1);
  expect_error([&] { sample_token(logits.data(), 3, 17, {0.0, 0, 1.0}, rng); },
               "1 of the 3 logits at position 17 are not finite");
}

}  // namespace
}  // namespace foundry::infer
