#include "bench/latbw_fit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/error.h"

namespace foundry {
namespace {

// Sizes 8 B .. 64 MiB by factors of 2, as `bench comm` measures by default.
std::vector<double> default_sizes() {
  std::vector<double> sizes;
  for (double s = 8; s <= 64.0 * 1048576; s *= 2) sizes.push_back(s);
  return sizes;
}

std::vector<LatBwSample> synthetic(double alpha_s, double beta, double noise, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> jitter(-noise, noise);
  std::vector<LatBwSample> samples;
  for (double s : default_sizes())
    samples.push_back({s, (alpha_s + s / beta) * (1.0 + (noise > 0 ? jitter(rng) : 0.0))});
  return samples;
}

TEST(LatBwFit, RecoversExactParameters) {
  for (auto [alpha, beta] : {std::pair{12e-6, 4.1e9}, std::pair{1.5e-6, 45e9},
                             std::pair{250e-6, 0.3e9}}) {
    const LatBwFit fit = fit_latency_bandwidth(synthetic(alpha, beta, 0.0, 1));
    EXPECT_NEAR(fit.alpha_s, alpha, 1e-9 * alpha);
    EXPECT_NEAR(fit.beta_bytes_per_s, beta, 1e-9 * beta);
    EXPECT_LT(fit.max_rel_residual, 1e-9);
    EXPECT_EQ(fit.min_bytes, 8);
    EXPECT_EQ(fit.max_bytes, 64.0 * 1048576);
    EXPECT_EQ(fit.samples, 24);
  }
}

TEST(LatBwFit, RecoversParametersFromNoisyTimings) {
  // ±10 % uniform jitter on every sample, like a shared machine: α and β still come back
  // within a few percent, and the worst residual reflects the noise.
  const double alpha = 20e-6, beta = 5e9;
  for (unsigned seed = 1; seed <= 5; ++seed) {
    const LatBwFit fit = fit_latency_bandwidth(synthetic(alpha, beta, 0.10, seed));
    EXPECT_NEAR(fit.alpha_s, alpha, 0.05 * alpha) << "seed " << seed;
    EXPECT_NEAR(fit.beta_bytes_per_s, beta, 0.05 * beta) << "seed " << seed;
    EXPECT_GT(fit.max_rel_residual, 0.02);
    EXPECT_LT(fit.max_rel_residual, 0.20);
  }
}

TEST(LatBwFit, RelativeWeightingKeepsSmallSizesAccurate) {
  // One wild outlier at the largest size (+30 %) must not drag the latency: an unweighted
  // fit would move α by hundreds of microseconds here.
  std::vector<LatBwSample> samples = synthetic(10e-6, 5e9, 0.0, 1);
  samples.back().seconds *= 1.3;
  const LatBwFit fit = fit_latency_bandwidth(samples);
  EXPECT_NEAR(fit.alpha_s, 10e-6, 1e-6);
  EXPECT_NEAR(fit.predict(8), samples.front().seconds, 0.1 * samples.front().seconds);
}

TEST(LatBwFit, FlatTimesGiveLatencyOnly) {
  // Time that does not grow with size: no measurable bandwidth, β reported as 0.
  std::vector<LatBwSample> samples;
  for (double s : {8.0, 64.0, 512.0}) samples.push_back({s, 5e-6});
  const LatBwFit fit = fit_latency_bandwidth(samples);
  EXPECT_NEAR(fit.alpha_s, 5e-6, 1e-15);
  EXPECT_EQ(fit.beta_bytes_per_s, 0.0);
  EXPECT_NEAR(fit.predict(1e9), 5e-6, 1e-15);
}

TEST(LatBwFit, PureBandwidthGivesZeroLatency) {
  // Times exactly proportional to size with a slight downward bend would want α < 0; the
  // fit clamps α to 0 and fits β alone.
  std::vector<LatBwSample> samples;
  for (double s : default_sizes()) samples.push_back({s, s / 2e9 * (s < 100 ? 0.9 : 1.0)});
  const LatBwFit fit = fit_latency_bandwidth(samples);
  EXPECT_EQ(fit.alpha_s, 0.0);
  EXPECT_GT(fit.beta_bytes_per_s, 1.9e9);
  EXPECT_LT(fit.beta_bytes_per_s, 2.1e9);
}

TEST(LatBwFit, RejectsTooFewOrBadSamples) {
  const std::vector<LatBwSample> one = {{8, 1e-6}};
  EXPECT_THROW(fit_latency_bandwidth(one), Error);
  const std::vector<LatBwSample> same_size = {{8, 1e-6}, {8, 2e-6}};
  EXPECT_THROW(fit_latency_bandwidth(same_size), Error);
  const std::vector<LatBwSample> zero_time = {{8, 1e-6}, {16, 0}};
  EXPECT_THROW(fit_latency_bandwidth(zero_time), Error);
}

}  // namespace
}  // namespace foundry
