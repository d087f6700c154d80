#include "optim/adamw.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "base/error.h"
#include "optim/test_util.h"

namespace foundry {
namespace {

using test::padding_offsets;
using test::random_slab;
using test::tiny_moe_config;

// Textbook AdamW in double, element by element, over the tensors of the table.
struct ReferenceAdamW {
  AdamWOptions o;
  std::vector<double> m, v;

  void step(std::vector<double>& p, const std::vector<float>& g, const ParamTable& table,
            double lr, int64_t t, bool decay_embeddings) {
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    for (const ParamInfo& info : table.params()) {
      const bool decay = info.kind == ParamKind::embedding ? decay_embeddings
                         : info.kind == ParamKind::norm    ? false
                                                           : true;
      for (int64_t i = info.offset; i < info.offset + info.numel; ++i) {
        m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
        v[i] = o.beta2 * v[i] + (1 - o.beta2) * double(g[i]) * g[i];
        const double m_hat = m[i] / (1 - std::pow(o.beta1, t));
        const double v_hat = v[i] / (1 - std::pow(o.beta2, t));
        if (decay) p[i] -= lr * o.weight_decay * p[i];
        p[i] -= lr * m_hat / (std::sqrt(v_hat) + o.eps);
      }
    }
  }
};

// Largest error relative to max(|expected|, RMS of the expected tensor): elements that sit
// near zero through cancellation are judged against their tensor's scale, not against 0.
void expect_close_rel(const std::vector<float>& actual, const std::vector<double>& expected,
                      const ParamTable& table, double rel, const char* what) {
  double worst = 0;
  for (const ParamInfo& info : table.params()) {
    double sum_sq = 0;
    for (int64_t i = info.offset; i < info.offset + info.numel; ++i)
      sum_sq += expected[i] * expected[i];
    const double rms = std::sqrt(sum_sq / static_cast<double>(info.numel));
    for (int64_t i = info.offset; i < info.offset + info.numel; ++i) {
      const double err = std::abs(actual[i] - expected[i]) / std::max(std::abs(expected[i]), rms);
      worst = std::max(worst, err);
    }
  }
  EXPECT_LE(worst, rel) << what;
}

void run_against_reference(bool decay_embeddings) {
  const ParamTable table(tiny_moe_config());
  AdamWOptions options;
  options.weight_decay = 0.1;
  options.decay_embeddings = decay_embeddings;
  AdamW adamw(table, options);
  ReferenceAdamW ref{options, {}, {}};

  std::vector<float> params = random_slab(table, 1, 1.0);
  std::vector<double> ref_params(params.begin(), params.end());
  const double lrs[] = {1e-2, 3e-3, 1e-3, 5e-2, 2e-2, 1e-2};
  for (int64_t t = 1; t <= 6; ++t) {
    // Gradients of varying scale (incl. tiny ones where eps matters) and zero entries.
    std::vector<float> grads = random_slab(table, 100 + t, t % 2 ? 1.0 : 1e-3);
    for (size_t i = 0; i < grads.size(); i += 97) grads[i] = 0.0f;
    adamw.step(params.data(), grads.data(), lrs[t - 1], t);
    ref.step(ref_params, grads, table, lrs[t - 1], t, decay_embeddings);
  }
  expect_close_rel(params, ref_params, table, 1e-6, "params");
  const auto m = adamw.state("exp_avg");
  const auto v = adamw.state("exp_avg_sq");
  expect_close_rel(std::vector<float>(m.begin(), m.end()), ref.m, table, 1e-6, "exp_avg");
  expect_close_rel(std::vector<float>(v.begin(), v.end()), ref.v, table, 1e-6, "exp_avg_sq");
}

TEST(AdamW, MatchesScalarReferenceOverSeveralSteps) { run_against_reference(false); }

TEST(AdamW, MatchesScalarReferenceWithDecayedEmbeddings) { run_against_reference(true); }

// With zero gradients the moments stay zero and only decoupled weight decay moves a weight:
// decayed tensors scale by exactly (1 - lr*wd), the others do not change at all.
TEST(AdamW, WeightDecayOnlyOnDecayGroup) {
  const ParamTable table(tiny_moe_config());
  for (bool decay_embeddings : {false, true}) {
    AdamWOptions options;
    options.weight_decay = 0.5;
    options.decay_embeddings = decay_embeddings;
    AdamW adamw(table, options);
    const std::vector<float> before = random_slab(table, 7, 1.0);
    std::vector<float> params = before;
    const std::vector<float> zero_grads(table.total_elements(), 0.0f);
    const double lr = 0.1;
    adamw.step(params.data(), zero_grads.data(), lr, 1);
    const float keep = static_cast<float>(1.0 - lr * options.weight_decay);
    for (const ParamInfo& info : table.params()) {
      const bool expect_decay = info.kind == ParamKind::embedding ? decay_embeddings
                                : info.kind != ParamKind::norm;
      EXPECT_EQ(adamw.decays(info), expect_decay) << info.name;
      for (int64_t i = info.offset; i < info.offset + info.numel; ++i)
        ASSERT_EQ(params[i], expect_decay ? before[i] * keep : before[i]) << info.name;
    }
  }
}

// At step 1 the bias corrections turn m/sqrt(v) into g/|g|: each weight moves by lr against
// the sign of its gradient, whatever the gradient's scale.
TEST(AdamW, BiasCorrectionMakesFirstStepSignLike) {
  const ParamTable table(tiny_moe_config());
  AdamWOptions options;
  options.weight_decay = 0.0;
  options.eps = 0.0;
  AdamW adamw(table, options);
  const std::vector<float> before = random_slab(table, 3, 1.0);
  std::vector<float> params = before;
  const std::vector<float> grads = random_slab(table, 4, 1e-4);
  const double lr = 1e-2;
  adamw.step(params.data(), grads.data(), lr, 1);
  for (const ParamInfo& info : table.params())
    for (int64_t i = info.offset; i < info.offset + info.numel; ++i) {
      const double expected = before[i] - lr * (grads[i] > 0 ? 1 : -1);
      ASSERT_NEAR(params[i], expected, 1e-6 * std::max(1.0, std::abs(expected))) << info.name;
    }
}

TEST(AdamW, NeverTouchesAlignmentPadding) {
  const ParamTable table(tiny_moe_config());
  const std::vector<int64_t> gaps = padding_offsets(table);
  ASSERT_FALSE(gaps.empty()) << "the test config should leave padding in the slab";
  AdamW adamw(table, AdamWOptions{});
  std::vector<float> params = random_slab(table, 5, 1.0, /*padding_value=*/123.0f);
  const std::vector<float> grads = random_slab(table, 6, 1.0, /*padding_value=*/7.0f);
  for (int64_t t = 1; t <= 3; ++t) adamw.step(params.data(), grads.data(), 1e-2, t);
  for (int64_t i : gaps) {
    EXPECT_EQ(params[i], 123.0f) << "slab offset " << i;
    EXPECT_EQ(adamw.state("exp_avg")[i], 0.0f);
    EXPECT_EQ(adamw.state("exp_avg_sq")[i], 0.0f);
  }
}

std::vector<float> run_steps(const ParamTable& table, int threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  AdamW adamw(table, AdamWOptions{});
  std::vector<float> params = random_slab(table, 11, 0.5);
  for (int64_t t = 1; t <= 4; ++t) {
    const std::vector<float> grads = random_slab(table, 20 + t, 1.0);
    adamw.step(params.data(), grads.data(), 1e-3, t);
  }
  omp_set_num_threads(saved);
  return params;
}

TEST(AdamW, BitwiseIdenticalWithOneOrTwoThreads) {
  const ParamTable table(tiny_moe_config());
  const std::vector<float> one = run_steps(table, 1);
  const std::vector<float> two = run_steps(table, 2);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) ASSERT_EQ(one[i], two[i]) << "element " << i;
}

// Saving the moments and loading them into a fresh optimizer continues the run exactly.
TEST(AdamW, StateRoundTripResumesBitwise) {
  const ParamTable table(tiny_moe_config());
  auto grads_at = [&](int64_t t) { return random_slab(table, 40 + t, 1.0); };
  AdamW straight(table, AdamWOptions{});
  std::vector<float> p_straight = random_slab(table, 9, 1.0);
  std::vector<float> p_resumed = p_straight;
  for (int64_t t = 1; t <= 5; ++t)
    straight.step(p_straight.data(), grads_at(t).data(), 1e-3, t);

  AdamW first(table, AdamWOptions{});
  for (int64_t t = 1; t <= 3; ++t) first.step(p_resumed.data(), grads_at(t).data(), 1e-3, t);
  AdamW second(table, AdamWOptions{});
  for (const std::string& name : AdamW::state_names()) {
    const auto src = first.state(name);
    auto dst = second.state(name);
    ASSERT_EQ(src.size(), static_cast<size_t>(table.total_elements()));
    std::copy(src.begin(), src.end(), dst.begin());
  }
  for (int64_t t = 4; t <= 5; ++t) second.step(p_resumed.data(), grads_at(t).data(), 1e-3, t);
  ASSERT_EQ(p_straight, p_resumed);
}

TEST(AdamW, RejectsBadInput) {
  const ParamTable table(tiny_moe_config());
  AdamW adamw(table, AdamWOptions{});
  std::vector<float> params(table.total_elements()), grads(table.total_elements());
  EXPECT_THROW(adamw.step(params.data(), grads.data(), 1e-3, 0), Error);
  EXPECT_THROW(adamw.state("momentum"), Error);
  AdamWOptions bad;
  bad.beta2 = 1.0;
  EXPECT_THROW(AdamW(table, bad), Error);
}

}  // namespace
}  // namespace foundry
