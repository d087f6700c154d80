// Router (softmax, top-k, aux loss) and MoE dispatch/combine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/ops.h"
#include "kernels/test_support.h"

namespace foundry::ops {
namespace {

using namespace foundry::testing;

std::vector<double> softmax_rows(const std::vector<double>& logits, int64_t n, int64_t e) {
  std::vector<double> p(n * e);
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < e; ++j) sum += std::exp(logits[i * e + j]);
    for (int64_t j = 0; j < e; ++j) p[i * e + j] = std::exp(logits[i * e + j]) / sum;
  }
  return p;
}

// Logits whose order within a token is a random permutation with gaps of ~1, so that small
// perturbations never change the top-k selection.
std::vector<double> separated_logits(int64_t n, int64_t e, uint64_t seed) {
  Rng rng(seed);
  std::vector<double> logits(n * e);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> rank(e);
    std::iota(rank.begin(), rank.end(), 0);
    for (int64_t j = e - 1; j > 0; --j) std::swap(rank[j], rank[rng.below(j + 1)]);
    for (int64_t j = 0; j < e; ++j) logits[i * e + j] = 0.9 * rank[j] + 0.1 * rng.normal();
  }
  return logits;
}

// ---- router ------------------------------------------------------------------------------

TEST(Router, ForwardGivesSoftmaxAndTopKInDescendingOrder) {
  const int64_t n = 6, e = 5, k = 3;
  const auto logits = random_normal(n * e, 1, 2.0);
  const auto expected_probs = softmax_rows(logits, n, e);
  for (bool renormalize : {false, true}) {
    const auto logits_f = cast_vector<float>(logits);
    std::vector<float> probs(n * e), w(n * k);
    std::vector<int32_t> idx(n * k);
    router_forward(probs.data(), idx.data(), w.data(), logits_f.data(), n, e, k, renormalize);
    EXPECT_LT(max_relative_error(probs, expected_probs), 1e-6);
    for (int64_t i = 0; i < n; ++i) {
      std::vector<int32_t> order(e);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return expected_probs[i * e + a] > expected_probs[i * e + b];
      });
      double selected = 0;
      for (int64_t j = 0; j < k; ++j) selected += expected_probs[i * e + order[j]];
      for (int64_t j = 0; j < k; ++j) {
        ASSERT_EQ(idx[i * k + j], order[j]) << "token " << i << " slot " << j;
        const double p = expected_probs[i * e + order[j]];
        EXPECT_NEAR(w[i * k + j], renormalize ? p / selected : p, 1e-6);
      }
    }
  }
}

TEST(Router, TiesGoToTheLowerExpertId) {
  const int64_t e = 4, k = 3;
  const std::vector<double> logits{1, 3, 3, 0,   // 1 and 2 tie at the top
                                   2, 2, 2, 2,   // all tie
                                   3, 1, 3, 3};  // 0, 2, 3 tie
  std::vector<double> probs(3 * e), w(3 * k);
  std::vector<int32_t> idx(3 * k);
  router_forward(probs.data(), idx.data(), w.data(), logits.data(), 3, e, k, true);
  EXPECT_EQ(idx, (std::vector<int32_t>{1, 2, 0, 0, 1, 2, 0, 2, 3}));
}

TEST(Router, AuxLossMatchesDefinition) {
  const int64_t n = 9, e = 4, k = 2;
  const auto logits = random_normal(n * e, 2);
  std::vector<double> probs(n * e), w(n * k);
  std::vector<int32_t> idx(n * k);
  router_forward(probs.data(), idx.data(), w.data(), logits.data(), n, e, k, true);
  double expected = 0;
  for (int64_t x = 0; x < e; ++x) {
    double f = 0, p = 0;
    for (int64_t a = 0; a < n * k; ++a) f += idx[a] == x ? 1.0 / (n * k) : 0.0;
    for (int64_t i = 0; i < n; ++i) p += probs[i * e + x] / n;
    expected += e * f * p;
  }
  EXPECT_NEAR(router_aux_loss(probs.data(), idx.data(), n, e, k), expected, 1e-14);

  // Perfect balance with uniform probabilities gives exactly 1.
  const std::vector<double> uniform(4 * e, 1.0 / e);
  const std::vector<int32_t> balanced{0, 1, 2, 3, 1, 0, 3, 2};
  EXPECT_NEAR(router_aux_loss(uniform.data(), balanced.data(), 4, e, k), 1.0, 1e-15);
}

struct GatingCase {
  bool renormalize;
  int64_t k;
  double aux_coef;
  double topk_grad_scale;  // 0 isolates the aux-loss gradient
};

class RouterBackward : public ::testing::TestWithParam<GatingCase> {};

TEST_P(RouterBackward, MatchesFiniteDifferences) {
  const GatingCase gc = GetParam();
  const int64_t n = 7, e = 5, k = gc.k;
  auto logits = separated_logits(n, e, 3);
  auto dtopk_w = random_normal(n * k, 4);
  for (auto& x : dtopk_w) x *= gc.topk_grad_scale;

  std::vector<double> probs(n * e), w(n * k);
  std::vector<int32_t> idx(n * k);
  router_forward(probs.data(), idx.data(), w.data(), logits.data(), n, e, k, gc.renormalize);
  const std::vector<int32_t> base_idx = idx;
  std::vector<double> f(e, 0.0);  // held fixed, as the backward pass assumes
  for (int32_t x : base_idx) f[x] += 1.0 / (n * k);

  // Objective from first principles: Σ dtopk_w·w(logits) + aux_coef·E·Σ_e f_e·mean_n p_e.
  auto objective = [&] {
    const auto p = softmax_rows(logits, n, e);
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      double selected = 0;
      for (int64_t j = 0; j < k; ++j) selected += p[i * e + base_idx[i * k + j]];
      for (int64_t j = 0; j < k; ++j) {
        const double pj = p[i * e + base_idx[i * k + j]];
        total += dtopk_w[i * k + j] * (gc.renormalize ? pj / selected : pj);
      }
    }
    for (int64_t x = 0; x < e; ++x)
      for (int64_t i = 0; i < n; ++i) total += gc.aux_coef * e * f[x] * p[i * e + x] / n;
    // The selection must not move under the perturbation.
    std::vector<double> pp(n * e), ww(n * k);
    std::vector<int32_t> ii(n * k);
    router_forward(pp.data(), ii.data(), ww.data(), logits.data(), n, e, k, gc.renormalize);
    EXPECT_EQ(ii, base_idx);
    return total;
  };
  const auto numeric = numeric_gradient(logits, objective);
  std::vector<double> dlogits(n * e, 99.0);
  router_backward(dlogits.data(), dtopk_w.data(), probs.data(), idx.data(), w.data(), n, e, k,
                  gc.renormalize, gc.aux_coef);
  EXPECT_LT(max_relative_error(dlogits, numeric), 1e-7);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RouterBackward,
    ::testing::Values(GatingCase{false, 1, 0.0, 1.0}, GatingCase{false, 2, 0.0, 1.0},
                      GatingCase{true, 1, 0.0, 1.0}, GatingCase{true, 2, 0.0, 1.0},
                      GatingCase{true, 2, 0.3, 0.0}, GatingCase{false, 2, 0.3, 0.0},
                      GatingCase{true, 2, 0.3, 1.0}, GatingCase{false, 1, 0.3, 1.0}));

// ---- dispatch plan -----------------------------------------------------------------------

TEST(MoeDispatchPlan, HandComputedCaseWithEmptyExperts) {
  const int64_t n = 5, e = 5, k = 2;
  const std::vector<int32_t> topk_idx{1, 3, 3, 1, 1, 4, 4, 3, 1, 3};  // experts 0, 2 unused
  std::vector<int64_t> offsets(e + 1);
  std::vector<int32_t> slot_token(n * k), assignment_slot(n * k);
  moe_dispatch_plan(offsets.data(), slot_token.data(), assignment_slot.data(), topk_idx.data(),
                    n, e, k);
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 0, 4, 4, 8, 10}));
  EXPECT_EQ(slot_token, (std::vector<int32_t>{0, 1, 2, 4, 0, 1, 3, 4, 2, 3}));
  EXPECT_EQ(assignment_slot, (std::vector<int32_t>{0, 4, 5, 1, 2, 8, 9, 6, 3, 7}));
}

TEST(MoeDispatchPlan, RandomCaseIsAStableSortByExpert) {
  const int64_t n = 50, e = 8, k = 2;
  Rng rng(5);
  std::vector<int32_t> topk_idx(n * k);
  for (int64_t i = 0; i < n; ++i) {  // distinct experts per token, never 0 or 6
    const int32_t choices[] = {1, 2, 3, 4, 5, 7};
    const int64_t a = rng.below(6), b = (a + 1 + rng.below(5)) % 6;
    topk_idx[i * k] = choices[a];
    topk_idx[i * k + 1] = choices[b];
  }
  std::vector<int64_t> offsets(e + 1);
  std::vector<int32_t> slot_token(n * k), assignment_slot(n * k);
  moe_dispatch_plan(offsets.data(), slot_token.data(), assignment_slot.data(), topk_idx.data(),
                    n, e, k);
  std::vector<int32_t> order(n * k);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return topk_idx[a] < topk_idx[b]; });
  for (int64_t row = 0; row < n * k; ++row) {
    ASSERT_EQ(slot_token[row], order[row] / k);
    ASSERT_EQ(assignment_slot[order[row]], row);
  }
  for (int64_t x = 0; x < e; ++x) {
    const auto count = std::count(topk_idx.begin(), topk_idx.end(), x);
    EXPECT_EQ(offsets[x + 1] - offsets[x], count);
    for (int64_t row = offsets[x]; row < offsets[x + 1]; ++row)
      EXPECT_EQ(topk_idx[order[row]], x);
  }
  EXPECT_EQ(offsets[0], 0);
  EXPECT_EQ(offsets[e], n * k);
}

// ---- gather / combine --------------------------------------------------------------------

struct Plan {
  std::vector<int64_t> offsets;
  std::vector<int32_t> slot_token, assignment_slot;
};

Plan make_plan(const std::vector<int32_t>& topk_idx, int64_t n, int64_t e, int64_t k) {
  Plan p{std::vector<int64_t>(e + 1), std::vector<int32_t>(n * k), std::vector<int32_t>(n * k)};
  moe_dispatch_plan(p.offsets.data(), p.slot_token.data(), p.assignment_slot.data(),
                    topk_idx.data(), n, e, k);
  return p;
}

const std::vector<int32_t> kTopk{2, 0, 0, 1, 2, 3, 1, 2, 0, 3, 2, 1};  // n = 6, k = 2, e = 4

TEST(MoeGatherCombine, ForwardMatchesReference) {
  const int64_t n = 6, e = 4, k = 2, c = 19;
  const Plan plan = make_plan(kTopk, n, e, k);
  const auto x = random_normal(n * c, 1), ys = random_normal(n * k * c, 2);
  const auto w = random_normal(n * k, 3), prior = random_normal(n * c, 4);
  std::vector<double> xs(n * k * c);
  moe_gather(xs.data(), x.data(), plan.slot_token.data(), n * k, c);
  for (int64_t row = 0; row < n * k; ++row)
    for (int64_t j = 0; j < c; ++j) ASSERT_EQ(xs[row * c + j], x[plan.slot_token[row] * c + j]);

  auto out = prior;
  moe_combine(out.data(), ys.data(), w.data(), plan.assignment_slot.data(), n, k, c);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j) {
      double expected = prior[i * c + j];
      for (int64_t slot = 0; slot < k; ++slot)
        expected += w[i * k + slot] * ys[plan.assignment_slot[i * k + slot] * c + j];
      ASSERT_NEAR(out[i * c + j], expected, 1e-14);
    }
}

TEST(MoeGatherCombine, CombineBackwardMatchesFiniteDifferences) {
  const int64_t n = 6, e = 4, k = 2, c = 7;
  const Plan plan = make_plan(kTopk, n, e, k);
  auto ys = random_normal(n * k * c, 5), w = random_normal(n * k, 6);
  const auto dout = random_normal(n * c, 7);
  std::vector<double> out(n * c);
  auto loss = [&] {
    std::fill(out.begin(), out.end(), 0.0);
    moe_combine(out.data(), ys.data(), w.data(), plan.assignment_slot.data(), n, k, c);
    return dot(out, dout);
  };
  const auto numeric_dys = numeric_gradient(ys, loss);
  const auto numeric_dw = numeric_gradient(w, loss);
  std::vector<double> dys(n * k * c, 99.0), dw(n * k, 99.0);
  moe_combine_backward(dys.data(), dw.data(), dout.data(), ys.data(), w.data(),
                       plan.assignment_slot.data(), n, k, c);
  EXPECT_LT(max_relative_error(dys, numeric_dys), 1e-9);
  EXPECT_LT(max_relative_error(dw, numeric_dw), 1e-9);
}

TEST(MoeGatherCombine, GatherBackwardMatchesFiniteDifferences) {
  const int64_t n = 6, e = 4, k = 2, c = 7;
  const Plan plan = make_plan(kTopk, n, e, k);
  auto x = random_normal(n * c, 8);
  const auto dxs = random_normal(n * k * c, 9), prior = random_normal(n * c, 10);
  std::vector<double> xs(n * k * c);
  auto loss = [&] {
    moe_gather(xs.data(), x.data(), plan.slot_token.data(), n * k, c);
    return dot(xs, dxs);
  };
  const auto numeric = numeric_gradient(x, loss);
  auto dx = prior;
  moe_gather_backward(dx.data(), dxs.data(), plan.assignment_slot.data(), n, k, c);
  for (int64_t i = 0; i < n * c; ++i) dx[i] -= prior[i];
  EXPECT_LT(max_relative_error(dx, numeric), 1e-9);
}

}  // namespace
}  // namespace foundry::ops
