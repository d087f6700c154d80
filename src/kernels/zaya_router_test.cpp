#include "kernels/zaya_router.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "base/error.h"
#include "kernels/ops.h"
#include "kernels/test_support.h"

namespace foundry::ops {
namespace {

using namespace foundry::testing;


// a − b elementwise (to take a prior off an accumulated gradient).
std::vector<double> minus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// ---- bias ----------------------------------------------------------------------------------

TEST(ZayaBiasAdd, ForwardAddsTheBiasToEveryRow) {
  const int64_t n = 5, m = 7;
  const auto y0 = random_normal(n * m, 1), bias = random_normal(m, 2);
  auto y = y0;
  bias_add_forward(y.data(), bias.data(), n, m);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) ASSERT_EQ(y[i * m + j], y0[i * m + j] + bias[j]);
  auto yf = cast_vector<float>(y0);
  const auto bias_f = cast_vector<float>(bias);
  bias_add_forward(yf.data(), bias_f.data(), n, m);
  EXPECT_LT(max_relative_error(yf, y), 1e-6);
}

TEST(ZayaBiasAdd, BackwardAccumulatesAndMatchesFiniteDifferences) {
  const int64_t n = 70, m = 9;  // n > 64: three row chunks in the reduction
  const auto x = random_normal(n * m, 3), dout = random_normal(n * m, 4);
  auto bias = random_normal(m, 5);
  std::vector<double> y(n * m);
  auto loss = [&] {
    y = x;
    bias_add_forward(y.data(), bias.data(), n, m);
    return dot(y, dout);
  };
  const auto numeric = numeric_gradient(bias, loss);
  const auto prior = random_normal(m, 6);
  auto dbias = prior;
  bias_add_backward(dbias.data(), dout.data(), n, m);
  EXPECT_LT(max_relative_error(minus(dbias, prior), numeric), 1e-9);
}

// ---- GELU ----------------------------------------------------------------------------------

double gelu_reference(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

TEST(ZayaGelu, ForwardIsTheExactErfForm) {
  // Φ(1) = 0.841344746068542948..., so gelu(1) = Φ(1) and gelu(−1) = −(1 − Φ(1)). The tanh
  // approximation gives 0.841191990… at 1, so this tells the two forms apart.
  std::vector<double> x{1.0, -1.0, 0.0};
  std::vector<double> y(3);
  gelu_forward(y.data(), x.data(), 1, 3);
  EXPECT_NEAR(y[0], 0.8413447460685429, 1e-15);
  EXPECT_NEAR(y[1], -0.15865525393145705, 1e-15);
  EXPECT_EQ(y[2], 0.0);

  const int64_t n = 6, c = 11;
  const auto in = random_normal(n * c, 7, 3.0);
  std::vector<double> expected(n * c);
  for (int64_t i = 0; i < n * c; ++i) expected[i] = gelu_reference(in[i]);
  std::vector<double> out(n * c);
  gelu_forward(out.data(), in.data(), n, c);
  EXPECT_LT(max_relative_error(out, expected), 1e-15);
  auto in_f = cast_vector<float>(in);
  gelu_forward(in_f.data(), in_f.data(), n, c);  // in place
  EXPECT_LT(max_relative_error(in_f, expected), 1e-6);
}

// Float GELU runs a vectorized erf and exp (zaya_router.cpp): over a dense sweep of [−12, 12]
// (and the extremes that clamp the exponential) forward and backward stay within 4e-7·(1+|x|)
// of the double reference, the same order as float rounding itself.
TEST(ZayaGelu, FloatFormIsAccurateOverTheWholeRange) {
  std::vector<float> x;
  for (int i = -240000; i <= 240000; ++i) x.push_back(static_cast<float>(i) * 5e-5f);
  for (float v : {-200.0f, -40.0f, -13.5f, 13.5f, 40.0f, 200.0f}) x.push_back(v);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(n), dy(n), ones(n, 1.0f);
  gelu_forward(y.data(), x.data(), 1, n);
  gelu_backward(dy.data(), ones.data(), x.data(), 1, n);
  double worst_y = 0, worst_dy = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double xi = x[i], phi = 0.5 * std::erfc(-xi / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * xi * xi) / std::sqrt(2.0 * M_PI);
    worst_y = std::max(worst_y, std::abs(y[i] - xi * phi) / (1 + std::abs(xi)));
    worst_dy = std::max(worst_dy, std::abs(dy[i] - (phi + xi * pdf)) / (1 + std::abs(xi)));
  }
  EXPECT_LT(worst_y, 4e-7);
  EXPECT_LT(worst_dy, 4e-7);
}

TEST(ZayaGelu, BackwardMatchesFiniteDifferencesAndMayRunInPlace) {
  const int64_t n = 9, c = 13;
  auto in = random_normal(n * c, 8, 2.5);
  const auto dout = random_normal(n * c, 9);
  std::vector<double> out(n * c);
  auto loss = [&] {
    gelu_forward(out.data(), in.data(), n, c);
    return dot(out, dout);
  };
  const auto numeric = numeric_gradient(in, loss);
  std::vector<double> din(n * c, 123.0);  // writes: the old contents must not matter
  gelu_backward(din.data(), dout.data(), in.data(), n, c);
  EXPECT_LT(max_relative_error(din, numeric), 1e-9);
  auto in_place = dout;
  gelu_backward(in_place.data(), in_place.data(), in.data(), n, c);
  EXPECT_EQ(in_place, din);
}

// The fused form keeps gelu'(a + b) in place of a: forward and backward give the bits of
// bias_add_forward + gelu_forward and gelu_backward + bias_add_backward, with any number of
// threads (n spans several row chunks).
TEST(ZayaGelu, BiasFusedFormEqualsTheCompositionBitForBit) {
  const int64_t n = 200, c = 24;
  const auto a0 = random_normal<float>(n * c, 14, 2.0);
  const auto bias = random_normal<float>(c, 15, 0.5);
  const auto dg = random_normal<float>(n * c, 16);
  const auto dbias0 = random_normal<float>(c, 17);
  auto composed_a = a0;
  std::vector<float> composed_g(n * c), composed_da(n * c), composed_dbias = dbias0;
  bias_add_forward(composed_a.data(), bias.data(), n, c);
  gelu_forward(composed_g.data(), composed_a.data(), n, c);
  gelu_backward(composed_da.data(), dg.data(), composed_a.data(), n, c);
  bias_add_backward(composed_dbias.data(), composed_da.data(), n, c);
  for (int threads : {1, 2, 3}) {
    WithThreads scope(threads);
    auto kept = a0;
    std::vector<float> g(n * c, 7.0f), da(n * c, 7.0f), dbias = dbias0;
    gelu_bias_forward(g.data(), kept.data(), bias.data(), n, c);
    gelu_bias_backward(da.data(), dbias.data(), dg.data(), kept.data(), n, c);
    EXPECT_EQ(g, composed_g) << threads << " threads";
    EXPECT_EQ(da, composed_da) << threads << " threads";
    EXPECT_EQ(dbias, composed_dbias) << threads << " threads";
  }
}

// ---- EDA -----------------------------------------------------------------------------------

TEST(ZayaEda, ForwardAddsTheScaledPreviousState) {
  const int64_t n = 4, r_dim = 6;
  const auto r0 = random_normal(n * r_dim, 10), prev = random_normal(n * r_dim, 11);
  const auto gamma = random_normal(r_dim, 12);
  auto r = r0;
  eda_forward(r.data(), prev.data(), gamma.data(), n, r_dim);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < r_dim; ++j)
      ASSERT_EQ(r[i * r_dim + j], r0[i * r_dim + j] + gamma[j] * prev[i * r_dim + j]);
}

TEST(ZayaEda, BackwardWritesThePreviousStatesGradient) {
  const int64_t n = 5, r_dim = 3;
  const auto dr = random_normal(n * r_dim, 13), prev = random_normal(n * r_dim, 18);
  const auto gamma = random_normal(r_dim, 19);
  std::vector<double> dprev(n * r_dim, 99.0), dgamma(r_dim, 0.5);
  eda_backward(dprev.data(), dgamma.data(), dr.data(), prev.data(), gamma.data(), n, r_dim);
  for (int64_t j = 0; j < r_dim; ++j) {
    double sum = 0.5;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(dprev[i * r_dim + j], gamma[j] * dr[i * r_dim + j]);
      sum += prev[i * r_dim + j] * dr[i * r_dim + j];
    }
    EXPECT_NEAR(dgamma[j], sum, 1e-12);
  }
}

// Three MoE sublayers' router states, each read by its own RMSNorm (as in the model):
//   r0 = a0,  r1 = a1 + γ1 ⊙ r0,  r2 = a2 + γ2 ⊙ r1,  loss = Σ_l <rmsnorm(r_l; w_l), g_l>.
// The backward pass follows the recipe in zaya_router.h: per layer, in reverse, the norm's
// backward completes d_r[l], then eda_backward passes γ_l ⊙ d_r[l] on to d_r[l − 1]; the
// gradient of each pre-EDA a_l is the completed d_r[l].
TEST(ZayaEda, ChainOfThreeStepsMatchesFiniteDifferences) {
  const int64_t n = 40, r_dim = 10, layers = 3;  // n > 32: two row chunks
  const double eps = 1e-5;
  std::vector<std::vector<double>> a, gamma, w, g;
  for (int64_t l = 0; l < layers; ++l) {
    a.push_back(random_normal(n * r_dim, 20 + l));
    auto gl = random_normal(r_dim, 30 + l, 0.3);
    for (auto& v : gl) v += 1.0;  // around the init value 1
    gamma.push_back(gl);
    auto wl = random_normal(r_dim, 40 + l, 0.2);
    for (auto& v : wl) v += 1.0;
    w.push_back(wl);
    g.push_back(random_normal(n * r_dim, 50 + l));
  }
  std::vector<std::vector<double>> r(layers, std::vector<double>(n * r_dim));
  std::vector<std::vector<double>> rstd(layers, std::vector<double>(n));
  std::vector<double> u(n * r_dim);
  auto loss = [&] {
    double total = 0;
    for (int64_t l = 0; l < layers; ++l) {
      r[l] = a[l];
      if (l > 0) eda_forward(r[l].data(), r[l - 1].data(), gamma[l].data(), n, r_dim);
      rmsnorm_forward(u.data(), rstd[l].data(), r[l].data(), w[l].data(), n, r_dim, eps);
      total += dot(u, g[l]);
    }
    return total;
  };
  std::vector<std::vector<double>> numeric_da, numeric_dgamma;
  for (int64_t l = 0; l < layers; ++l) numeric_da.push_back(numeric_gradient(a[l], loss));
  for (int64_t l = 1; l < layers; ++l) numeric_dgamma.push_back(numeric_gradient(gamma[l], loss));

  loss();  // leaves r and rstd from the unperturbed inputs
  std::vector<std::vector<double>> d_r(layers, std::vector<double>(n * r_dim, 0.0));
  std::vector<std::vector<double>> dgamma_prior, dgamma;
  for (int64_t l = 0; l < layers; ++l) {
    dgamma_prior.push_back(random_normal(r_dim, 60 + l));
    dgamma.push_back(dgamma_prior.back());
  }
  std::vector<double> dw(r_dim);
  for (int64_t l = layers - 1; l >= 0; --l) {
    rmsnorm_backward(d_r[l].data(), dw.data(), g[l].data(), r[l].data(), w[l].data(),
                     rstd[l].data(), n, r_dim);
    if (l > 0)
      eda_backward(d_r[l - 1].data(), dgamma[l].data(), d_r[l].data(), r[l - 1].data(),
                   gamma[l].data(), n, r_dim);
  }
  for (int64_t l = 0; l < layers; ++l)
    EXPECT_LT(max_relative_error(d_r[l], numeric_da[l]), 1e-7) << "d a" << l;
  for (int64_t l = 1; l < layers; ++l)
    EXPECT_LT(max_relative_error(minus(dgamma[l], dgamma_prior[l]), numeric_dgamma[l - 1]), 1e-7)
        << "d gamma" << l;
  EXPECT_EQ(dgamma[0], dgamma_prior[0]);  // the first MoE sublayer has no EDA
}

// ---- gating --------------------------------------------------------------------------------

struct GatingReference {
  std::vector<double> probs, gate;
  std::vector<int32_t> choice;
};

// Softmax in double, then the K best of p + bias (or logit + bias) by a stable sort (ties:
// lower index).
GatingReference gating_reference(const std::vector<double>& logits,
                                 const std::vector<double>& bias, int64_t n, int64_t e,
                                 int64_t k, bool skip_passes_input,
                                 BiasOn bias_on = BiasOn::probs) {
  const int64_t classes = e + 1;
  GatingReference ref{std::vector<double>(n * classes), std::vector<double>(n * k),
                      std::vector<int32_t>(n * k)};
  for (int64_t i = 0; i < n; ++i) {
    double max_z = -1e300, sum = 0;
    for (int64_t j = 0; j < classes; ++j) max_z = std::max(max_z, logits[i * classes + j]);
    for (int64_t j = 0; j < classes; ++j) sum += std::exp(logits[i * classes + j] - max_z);
    for (int64_t j = 0; j < classes; ++j)
      ref.probs[i * classes + j] = std::exp(logits[i * classes + j] - max_z) / sum;
    std::vector<int32_t> order(classes);
    std::iota(order.begin(), order.end(), 0);
    const double* score =
        (bias_on == BiasOn::logits ? logits.data() : ref.probs.data()) + i * classes;
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
      return score[x] + bias[x] > score[y] + bias[y];
    });
    for (int64_t slot = 0; slot < k; ++slot) {
      const int32_t c = order[slot];
      ref.choice[i * k + slot] = c;
      ref.gate[i * k + slot] = (c == e && !skip_passes_input) ? 0.0 : ref.probs[i * classes + c];
    }
  }
  return ref;
}

TEST(ZayaGating, ForwardMatchesReferenceForTopOneAndTopTwo) {
  const int64_t n = 23, e = 4, classes = e + 1;
  const auto logits = random_normal(n * classes, 70, 1.5);
  const auto bias = random_normal(classes, 71, 0.1);
  for (int64_t k : {1, 2, 3}) {
    for (bool passes : {false, true}) {
      for (BiasOn on : {BiasOn::probs, BiasOn::logits}) {
        const auto ref = gating_reference(logits, bias, n, e, k, passes, on);
        std::vector<double> probs(n * classes), gate(n * k);
        std::vector<int32_t> choice(n * k);
        zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(),
                            bias.data(), on, n, e, k, true, passes);
        EXPECT_LT(max_relative_error(probs, ref.probs), 1e-14);
        EXPECT_EQ(choice, ref.choice) << "k = " << k;
        EXPECT_LT(max_relative_error(gate, ref.gate), 1e-14);

        const auto logits_f = cast_vector<float>(logits), bias_f = cast_vector<float>(bias);
        std::vector<float> probs_f(n * classes), gate_f(n * k);
        std::vector<int32_t> choice_f(n * k);
        zaya_gating_forward(probs_f.data(), choice_f.data(), gate_f.data(), logits_f.data(),
                            bias_f.data(), on, n, e, k, true, passes);
        EXPECT_LT(max_relative_error(probs_f, ref.probs), 1e-6);
        EXPECT_EQ(choice_f, ref.choice);
        EXPECT_LT(max_relative_error(gate_f, ref.gate), 1e-6);
      }
    }
  }
}

TEST(ZayaGating, BiasSteersTheChoiceButNotTheGate) {
  // p = softmax(0, log 2, log 3, log 4) = (0.1, 0.2, 0.3, 0.4); no skip class.
  const std::vector<double> logits{0.0, std::log(2.0), std::log(3.0), std::log(4.0)};
  std::vector<double> probs(4), gate(1);
  std::vector<int32_t> choice(1);
  zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(),
                      static_cast<const double*>(nullptr), BiasOn::probs, 1, 4, 1, false, false);
  EXPECT_EQ(choice[0], 3);
  EXPECT_NEAR(gate[0], 0.4, 1e-15);
  const std::vector<double> bias{0.35, 0.0, 0.0, 0.0};  // 0.1 + 0.35 > 0.4
  zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(), bias.data(),
                      BiasOn::probs, 1, 4, 1, false, false);
  EXPECT_EQ(choice[0], 0);
  EXPECT_NEAR(gate[0], 0.1, 1e-15);  // the unbiased probability, not renormalized
  // On the logits the same bias is too small: log 4 − 0 > 0.35, so class 3 keeps the token;
  // a bias above log 4 moves it, and the gate is still the unbiased probability.
  zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(), bias.data(),
                      BiasOn::logits, 1, 4, 1, false, false);
  EXPECT_EQ(choice[0], 3);
  const std::vector<double> log_bias{1.4, 0.0, 0.0, 0.0};  // 0 + 1.4 > log 4 ≈ 1.386
  zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(), log_bias.data(),
                      BiasOn::logits, 1, 4, 1, false, false);
  EXPECT_EQ(choice[0], 0);
  EXPECT_NEAR(gate[0], 0.1, 1e-15);
}

TEST(ZayaGating, TiesGoToTheLowerIndex) {
  const std::vector<float> logits(5, 0.25f);  // all equal, E = 4 + skip
  std::vector<float> probs(5), gate(3);
  std::vector<int32_t> choice(3);
  zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(),
                      static_cast<const float*>(nullptr), BiasOn::probs, 1, 4, 3, true, false);
  EXPECT_EQ(choice, (std::vector<int32_t>{0, 1, 2}));
  for (float p : probs) EXPECT_FLOAT_EQ(p, 0.2f);
}

TEST(ZayaGating, SkipTokenGetsGateZeroAndCountsInTheSkipLoad) {
  const int64_t n = 4, e = 4, classes = 5;
  // Tokens 1 and 3 strongly prefer the skip class (index 4).
  const std::vector<float> logits{3, 0, 0, 0, 0,  0, 0, 0, 0, 5,
                                  0, 0, 2, 0, 0,  0, 0, 0, 1, 6};
  const std::vector<float> zero_bias(classes, 0.0f);
  std::vector<float> probs(n * classes), gate(n);
  std::vector<int32_t> choice(n);
  zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(), zero_bias.data(),
                      BiasOn::probs, n, e, 1, true, false);
  EXPECT_EQ(choice, (std::vector<int32_t>{0, 4, 2, 4}));
  EXPECT_EQ(gate[1], 0.0f);
  EXPECT_EQ(gate[3], 0.0f);
  EXPECT_FLOAT_EQ(gate[0], probs[0]);
  std::vector<int64_t> counts(classes);
  zaya_class_counts(counts.data(), choice.data(), n, 1, classes);
  EXPECT_EQ(counts, (std::vector<int64_t>{1, 0, 1, 0, 2}));
  std::vector<double> err(classes);
  zaya_load_error(err.data(), counts.data(), n, classes);
  EXPECT_NEAR(err[4], 0.5 - 0.2, 1e-15);

  // The skip choice does not reach the logits' gradient when its gate is the constant 0.
  std::vector<float> dgate{1.0f, 1.0f, 1.0f, 1.0f}, dlogits(n * classes, 7.0f);
  zaya_gating_backward(dlogits.data(), dgate.data(), probs.data(), choice.data(), n, e, 1, true,
                       false);
  for (int64_t j = 0; j < classes; ++j) {
    EXPECT_EQ(dlogits[1 * classes + j], 0.0f);
    EXPECT_EQ(dlogits[3 * classes + j], 0.0f);
  }

  // With skip_passes_input the skip gate is p_skip.
  zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(), zero_bias.data(),
                      BiasOn::probs, n, e, 1, true, true);
  EXPECT_EQ(choice, (std::vector<int32_t>{0, 4, 2, 4}));
  EXPECT_EQ(gate[1], probs[1 * classes + 4]);
  EXPECT_EQ(gate[3], probs[3 * classes + 4]);

  // The initial balancing bias (−1 on skip) keeps these tokens away from the skip class.
  const ZayaBalancer balancer(e, true);
  zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(),
                      balancer.bias.data(), BiasOn::probs, n, e, 1, true, false);
  EXPECT_EQ(choice, (std::vector<int32_t>{0, 0, 2, 3}));
}

// Logits with well-separated levels (class j of token i sits at level (i + j) mod S, 1.5
// apart, plus small noise), so that finite-difference steps never change the choice; every
// class, the skip class included, is the first choice of some tokens and the second of others.
std::vector<double> separated_logits(int64_t n, int64_t classes, uint64_t seed) {
  auto logits = random_normal(n * classes, seed, 0.05);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < classes; ++j) logits[i * classes + j] += 1.5 * ((i + j) % classes);
  return logits;
}

void check_gating_backward(int64_t k, bool skip_passes_input) {
  const int64_t n = 12, e = 4, classes = e + 1;
  auto logits = separated_logits(n, classes, 80 + k);
  const auto bias = random_normal(classes, 81, 0.02);
  const auto dgate = random_normal(n * k, 82 + k);
  std::vector<double> probs(n * classes), gate(n * k);
  std::vector<int32_t> choice(n * k);
  zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(), bias.data(),
                      BiasOn::probs, n, e, k, true, skip_passes_input);
  const auto choice0 = choice;
  // The skip class is some tokens' first choice and, for K = 2, other tokens' second.
  for (int64_t slot = 0; slot < k; ++slot) {
    int64_t skip_choices = 0;
    for (int64_t i = 0; i < n; ++i) skip_choices += choice0[i * k + slot] == e;
    ASSERT_GE(skip_choices, 2) << "slot " << slot;
  }

  int64_t flips = 0;
  auto loss = [&] {
    zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(), bias.data(),
                        BiasOn::probs, n, e, k, true, skip_passes_input);
    flips += choice != choice0;
    return dot(gate, dgate);
  };
  const auto numeric = numeric_gradient(logits, loss);
  ASSERT_EQ(flips, 0) << "the finite-difference steps changed the choice";

  loss();
  std::vector<double> dlogits(n * classes, 9.0);  // writes
  zaya_gating_backward(dlogits.data(), dgate.data(), probs.data(), choice.data(), n, e, k, true,
                       skip_passes_input);
  EXPECT_LT(max_relative_error(dlogits, numeric), 1e-7);
  // Each row of dlogits sums to zero (softmax), and the row of a token whose only choice is
  // the zero-gated skip class is exactly zero.
  for (int64_t i = 0; i < n; ++i) {
    double row_sum = 0;
    for (int64_t j = 0; j < classes; ++j) row_sum += dlogits[i * classes + j];
    EXPECT_NEAR(row_sum, 0.0, 1e-15);
    if (k == 1 && choice[i] == e && !skip_passes_input) {
      for (int64_t j = 0; j < classes; ++j) EXPECT_EQ(dlogits[i * classes + j], 0.0);
    }
  }
}

TEST(ZayaGating, BackwardTopOneMatchesFiniteDifferences) { check_gating_backward(1, false); }
TEST(ZayaGating, BackwardTopTwoMatchesFiniteDifferences) { check_gating_backward(2, false); }
TEST(ZayaGating, BackwardTopOneSkipPassesInputMatchesFiniteDifferences) {
  check_gating_backward(1, true);
}
TEST(ZayaGating, BackwardTopTwoSkipPassesInputMatchesFiniteDifferences) {
  check_gating_backward(2, true);
}

TEST(ZayaGating, WithoutSkipClassAllClassesAreExperts) {
  const int64_t n = 10, e = 4;
  auto logits = random_normal(n * e, 90);
  std::vector<double> probs(n * e), gate(n * 2);
  std::vector<int32_t> choice(n * 2);
  zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(),
                      static_cast<const double*>(nullptr), BiasOn::probs, n, e, 2, false, false);
  for (int64_t a = 0; a < n * 2; ++a) {
    ASSERT_GE(choice[a], 0);
    ASSERT_LT(choice[a], e);
    EXPECT_EQ(gate[a], probs[(a / 2) * e + choice[a]]);
  }
  EXPECT_THROW(zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(),
                                   static_cast<const double*>(nullptr), BiasOn::probs, n, e, 2,
                                   false, true),
               Error);
}

// ---- load statistics and the balancer ------------------------------------------------------

TEST(ZayaLoad, CountsAndErrorByHand) {
  const std::vector<int32_t> choice{0, 4, 1, 0, 4, 2, 0, 3};  // N = 4, K = 2
  std::vector<int64_t> counts(5);
  zaya_class_counts(counts.data(), choice.data(), 4, 2, 5);
  EXPECT_EQ(counts, (std::vector<int64_t>{3, 1, 1, 1, 2}));
  std::vector<double> err(5);
  zaya_load_error(err.data(), counts.data(), 8, 5);
  const std::vector<double> expected{3 / 8.0 - 0.2, 1 / 8.0 - 0.2, 1 / 8.0 - 0.2, 1 / 8.0 - 0.2,
                                     2 / 8.0 - 0.2};
  for (int j = 0; j < 5; ++j) EXPECT_NEAR(err[j], expected[j], 1e-16);
  const std::vector<int32_t> bad{0, 5};
  EXPECT_THROW(zaya_class_counts(counts.data(), bad.data(), 1, 2, 5), Error);
}

// A rule with its default lr (the model's defaults: model/model.h).
ZayaBalancerOptions rule_options(BalanceRule rule) {
  ZayaBalancerOptions o;
  o.rule = rule;
  o.lr = rule == BalanceRule::proportional ? 1.0 : rule == BalanceRule::newton ? 0.5 : 1e-3;
  return o;
}

// Biased scores (logits + bias) of 3 tokens over 4 classes, window 0.5:
//   token 0: 2.0  1.8  0.0  -1.0   top-1: class 0 beats class 1 by 0.2 → 0 and 1 near
//   token 1: 0.0  0.0  3.0   2.6   top-1: class 2 beats 3 by 0.4 → 2 and 3 near
//   token 2: 1.0  0.0  0.0   0.0   top-1: class 0 beats the rest by 1.0 → none near
// top-2: token 0 {0, 1}, lowest chosen 1.8, best unchosen 0.0 → none near; token 1 {2, 3},
// 2.6 vs 0.0 → none; token 2 {0, then 1 (tie, lower index)}, lowest chosen 0.0 = best
// unchosen 0.0 → classes 1, 2 and 3 near (gap 0 < 0.5), class 0 not (gap 1.0).
TEST(ZayaLoad, BoundaryCountsByHand) {
  const std::vector<float> logits{2.5f, 1.8f, 0.0f, -1.0f, 0.5f, 0.0f, 3.0f, 2.6f,
                                  1.5f, 0.0f, 0.0f, 0.0f};
  const std::vector<float> bias{-0.5f, 0.0f, 0.0f, 0.0f};
  std::vector<float> probs(12), gate(6);
  std::vector<int32_t> choice(6);
  std::vector<int64_t> near(4);
  zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(), bias.data(),
                      BiasOn::logits, 3, 4, 1, false, false);
  zaya_boundary_counts(near.data(), probs.data(), logits.data(), bias.data(), BiasOn::logits,
                       choice.data(), 3, 4, 1, 0.5);
  EXPECT_EQ(near, (std::vector<int64_t>{1, 1, 1, 1}));
  zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(), bias.data(),
                      BiasOn::logits, 3, 4, 2, false, false);
  zaya_boundary_counts(near.data(), probs.data(), logits.data(), bias.data(), BiasOn::logits,
                       choice.data(), 3, 4, 2, 0.5);
  EXPECT_EQ(near, (std::vector<int64_t>{0, 1, 1, 1}));
  // On the probabilities the same rule applies to p + bias: with a tiny window nobody is near
  // except exact ties (token 2's three zeros have equal probabilities).
  zaya_boundary_counts<float>(near.data(), probs.data(), logits.data(), nullptr, BiasOn::probs,
                       choice.data(), 3, 4, 2, 1e-6);
  EXPECT_EQ(near, (std::vector<int64_t>{0, 1, 1, 1}));
}

TEST(ZayaBalancer, InitAndUpdatesFollowAdamWWithOverusedClassesMovingDown) {
  ZayaBalancer balancer(4, true, rule_options(BalanceRule::adamw));
  EXPECT_EQ(balancer.bias, (std::vector<float>{0, 0, 0, 0, -1}));
  EXPECT_EQ(balancer.step, 0);

  // Reference: torch.optim.AdamW's arithmetic in double, weight decay 0.
  std::vector<double> bias{0, 0, 0, 0, -1}, m(5, 0.0), v(5, 0.0);
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  const std::vector<std::vector<int64_t>> rounds{
      {60, 10, 10, 10, 10}, {50, 20, 10, 10, 10}, {20, 20, 20, 20, 20}, {10, 10, 10, 10, 60}};
  for (size_t t = 1; t <= rounds.size(); ++t) {
    const auto& counts = rounds[t - 1];
    const std::vector<float> before = balancer.bias;
    balancer.update(counts.data(), 100);
    for (int j = 0; j < 5; ++j) {
      const double err = counts[j] / 100.0 - 0.2;
      m[j] = b1 * m[j] + (1 - b1) * err;
      v[j] = b2 * v[j] + (1 - b2) * err * err;
      const double m_hat = m[j] / (1 - std::pow(b1, t)), v_hat = v[j] / (1 - std::pow(b2, t));
      bias[j] -= lr * m_hat / (std::sqrt(v_hat) + eps);
      EXPECT_NEAR(balancer.bias[j], bias[j], 1e-7) << "step " << t << " class " << j;
    }
    if (t == 1) {
      // First step: m̂/√v̂ = sign(err), so each bias moves by lr against its load error.
      EXPECT_NEAR(balancer.bias[0] - before[0], -lr, 1e-9);  // over-used: down
      EXPECT_NEAR(balancer.bias[1] - before[1], lr, 1e-9);   // under-used: up
    }
  }
  EXPECT_EQ(balancer.step, 4);
}

TEST(ZayaBalancer, SignAdaptiveStepsGrowWhileTheSignHoldsAndHalveOnAFlip) {
  ZayaBalancerOptions o = rule_options(BalanceRule::sign_adaptive);
  o.lr = 0.01;  // the initial step
  o.step_max = 0.0144;
  ZayaBalancer balancer(1, true, o);  // classes: expert 0, skip
  EXPECT_EQ(balancer.bias, (std::vector<float>{0, -1}));
  EXPECT_TRUE(balancer.exp_avg.empty());
  const std::vector<int64_t> over{8, 2}, under{2, 8}, even{5, 5};
  // Expected bias of expert 0 and its step after each update (float rounding aside).
  struct Expect { const std::vector<int64_t>* counts; double bias, step; };
  const Expect rounds[] = {
      {&over, -0.01, 0.01},              // first move: the initial step, down
      {&over, -0.022, 0.012},            // same sign: ×1.2
      {&over, -0.0364, 0.0144},          // ×1.2 = 0.0144 (the cap)
      {&over, -0.0508, 0.0144},          // capped
      {&under, -0.0508, 0.0072},         // flipped: no move, ×0.5
      {&under, -0.0436, 0.0072},         // after a flip: move with the halved step, up
      {&even, -0.0436, 0.0072},          // zero error: no move
      {&under, -0.0364, 0.0072},         // last sign was 0: plain step
  };
  for (const Expect& r : rounds) {
    balancer.update(r.counts->data(), 10);
    EXPECT_NEAR(balancer.bias[0], r.bias, 1e-6) << "step " << balancer.step;
    EXPECT_NEAR(balancer.step_size[0], r.step, 1e-7) << "step " << balancer.step;
  }
  EXPECT_EQ(balancer.step, 8);
  // The step never goes below step_min.
  ZayaBalancerOptions tiny = o;
  tiny.step_min = 0.004;
  ZayaBalancer floor(1, true, tiny);
  for (int i = 0; i < 6; ++i) floor.update((i % 2 ? under : over).data(), 10);
  EXPECT_FLOAT_EQ(floor.step_size[0], 0.004f);
  EXPECT_THROW(
      {
        ZayaBalancer bad(2, true, [] {
          ZayaBalancerOptions b;
          b.decrease = 2;
          return b;
        }());
      },
      Error);
}

TEST(ZayaBalancer, ProportionalRuleMovesEachBiasByGainTimesItsError) {
  ZayaBalancerOptions o = rule_options(BalanceRule::proportional);
  o.lr = 2.0;
  ZayaBalancer balancer(3, true, o);
  EXPECT_EQ(balancer.bias, (std::vector<float>{0, 0, 0, -1}));
  const std::vector<int64_t> counts{50, 25, 25, 0};  // errors 0.25, 0, 0, −0.25
  balancer.update(counts.data(), 100);
  EXPECT_FLOAT_EQ(balancer.bias[0], -0.5f);  // over-used: down by 2 × 0.25
  EXPECT_FLOAT_EQ(balancer.bias[1], 0.0f);
  EXPECT_FLOAT_EQ(balancer.bias[3], -0.5f);  // under-used skip class: up from −1
  balancer.update(counts.data(), 100);
  EXPECT_FLOAT_EQ(balancer.bias[0], -1.0f);  // the integral of the error
  EXPECT_EQ(balancer.step, 2);
}

// The rule's state vectors, copied (load_state takes them by value).
std::vector<std::vector<float>> rule_state_copy(const ZayaBalancer& b) {
  std::vector<std::vector<float>> out;
  for (const std::vector<float>* v : b.rule_state()) out.push_back(*v);
  return out;
}

// slope = near / (2·window·assignments); bias −= lr / max(slope, lr / gain_max) · err.
TEST(ZayaBalancer, NewtonRuleDividesTheErrorByTheMeasuredSlope) {
  ZayaBalancerOptions o = rule_options(BalanceRule::newton);
  o.window = 0.1;
  o.gain_max = 4.0;
  ZayaBalancer balancer(3, true, o);
  const std::vector<int64_t> counts{50, 25, 25, 0};  // errors 0.25, 0, 0, −0.25
  const std::vector<int64_t> near{40, 10, 10, 0};    // slopes 2, 0.5, 0.5, 0
  balancer.update(counts.data(), 100, near.data());
  EXPECT_FLOAT_EQ(balancer.bias[0], -0.5f / 2.0f * 0.25f);   // steep: a small step
  EXPECT_FLOAT_EQ(balancer.bias[1], 0.0f);
  EXPECT_FLOAT_EQ(balancer.bias[3], -1.0f + 4.0f * 0.25f);  // flat: gain_max
  EXPECT_EQ(balancer.step, 1);
  EXPECT_THROW(balancer.update(counts.data(), 100), Error);  // needs the boundary counts
  EXPECT_THROW(balancer.update_from_error(std::vector<double>(4).data()), Error);
}

TEST(ZayaBalancer, StateRoundTripsBitwiseAndBadStateIsRejected) {
  for (BalanceRule rule : {BalanceRule::proportional, BalanceRule::newton, BalanceRule::adamw,
                           BalanceRule::sign_adaptive}) {
    SCOPED_TRACE(balance_rule_name(rule));
    const ZayaBalancerOptions o = rule_options(rule);
    ZayaBalancer a(3, true, o);
    const std::vector<int64_t> c1{5, 1, 1, 1}, c2{2, 3, 1, 2}, near{3, 1, 0, 2};
    a.update(c1.data(), 8, near.data());
    a.update(c2.data(), 8, near.data());
    ZayaBalancer b(3, true, o);
    b.load_state(a.bias, rule_state_copy(a), a.step);
    for (int i = 0; i < 3; ++i) {
      a.update(c1.data(), 8, near.data());
      b.update(c1.data(), 8, near.data());
    }
    EXPECT_EQ(a.bias, b.bias);
    EXPECT_EQ(rule_state_copy(a), rule_state_copy(b));
    EXPECT_EQ(a.step, b.step);

    ZayaBalancer c(3, true, o);
    const size_t vectors = c.rule_state_names().size();
    const bool stateless = rule == BalanceRule::proportional || rule == BalanceRule::newton;
    EXPECT_EQ(vectors, stateless ? 0u : 2u);
    const std::vector<float> ok_a(4, 0.5f), ok_b(4, 0.0f);
    const std::vector<std::vector<float>> ok = vectors == 0
                                                   ? std::vector<std::vector<float>>{}
                                                   : std::vector<std::vector<float>>{ok_a, ok_b};
    c.load_state({0, 0, 0, 0}, ok, 1);  // a valid state of any rule
    c = ZayaBalancer(3, true, o);
    EXPECT_THROW(c.load_state({0, 0, 0}, ok, 1), Error);
    EXPECT_THROW(c.load_state({0, 0, 0, 0}, ok, -1), Error);
    EXPECT_THROW(c.load_state({0, NAN, 0, 0}, ok, 1), Error);
    EXPECT_THROW(c.load_state({0, 0, 0, 0}, {ok_a}, 1), Error);  // another rule's vectors
    if (rule == BalanceRule::adamw) {
      EXPECT_THROW(c.load_state({0, 0, 0, 0}, {ok_a, {0, -1, 0, 0}}, 1), Error);  // v < 0
    } else if (rule == BalanceRule::sign_adaptive) {
      EXPECT_THROW(c.load_state({0, 0, 0, 0}, {{0.5f, 0, 0.5f, 0.5f}, ok_b}, 1), Error);  // 0
      EXPECT_THROW(c.load_state({0, 0, 0, 0}, {ok_a, {0, 0.5f, 0, 0}}, 1), Error);  // sign 0.5
    }
    EXPECT_EQ(c.bias, (std::vector<float>{0, 0, 0, -1}));  // a rejected state leaves it unchanged
  }
  EXPECT_THROW({ ZayaBalancer no_experts(0, true); }, Error);
}

// How a balancer drives fixed router logits [n, e + 1] (no learning: only the bias moves,
// one update per round from the round's counts) toward uniform load.
struct BalanceTrace {
  double initial = 0;        // max |load error| before any update
  int reached = -1;          // the first update count after which it is below `threshold`
  double settled_worst = 0;  // the largest after update `settle_from`
};

// Runs `updates` balancer updates against router logits [N, E + 1] that logits_at(u) gives
// for update u (top-1, skip class on) and traces the max |load error| of each update's load.
template <typename LogitsAt>
BalanceTrace balance_trace(LogitsAt&& logits_at, int64_t n, int64_t e,
                           const ZayaBalancerOptions& options, BiasOn bias_on, int updates,
                           double threshold, int settle_from) {
  const int64_t classes = e + 1;
  ZayaBalancer balancer(e, true, options);
  std::vector<float> probs(n * classes), gate(n);
  std::vector<int32_t> choice(n);
  std::vector<int64_t> counts(classes), near(classes);
  std::vector<double> err(classes);
  BalanceTrace trace;
  for (int u = 0; u <= updates; ++u) {
    // The load this bias (after u updates) gives, then the next update.
    const std::vector<float>& logits = logits_at(u);
    zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(),
                        balancer.bias.data(), bias_on, n, e, 1, true, false);
    zaya_class_counts(counts.data(), choice.data(), n, 1, classes);
    zaya_boundary_counts(near.data(), probs.data(), logits.data(), balancer.bias.data(),
                         bias_on, choice.data(), n, classes, 1, options.window);
    zaya_load_error(err.data(), counts.data(), n, classes);
    double max_err = 0;
    for (double x : err) max_err = std::max(max_err, std::abs(x));
    if (u == 0) trace.initial = max_err;
    if (trace.reached < 0 && max_err < threshold) trace.reached = u;
    if (u >= settle_from) trace.settled_worst = std::max(trace.settled_worst, max_err);
    balancer.update(counts.data(), n, near.data());
  }
  return trace;
}

BalanceTrace balance_fixed_logits(const std::vector<float>& logits, int64_t n, int64_t e,
                                  const ZayaBalancerOptions& options, int updates,
                                  double threshold, int settle_from) {
  return balance_trace([&](int) -> const std::vector<float>& { return logits; }, n, e, options,
                       BiasOn::probs, updates, threshold, settle_from);
}

// Fixed router logits that favour expert 0 strongly (+4 on its logit: 99% of the tokens pick
// it with zero bias; the skip class starts at bias −1, so nobody picks it).
// AdamW (lr 1e-3) moves each bias by about lr per update while its error keeps its sign, and
// the skip bias has to climb from −1 to about +0.27, so the first ~1300 updates are spent
// getting there. The sign-adaptive rule's steps grow geometrically to that distance and
// shrink once the loads are near uniform: there within a hundred updates. Both then settle
// to within the 1/N granularity of uniform.
TEST(ZayaBalancer, DrivesAStronglySkewedRouterTowardUniformLoad) {
  const int64_t n = 2048, e = 4;
  auto logits = random_normal<float>(n * (e + 1), 100);
  for (int64_t i = 0; i < n; ++i) logits[i * (e + 1) + 0] += 4.0f;
  struct Case { BalanceRule rule; int reach_by; };
  for (const Case& c : {Case{BalanceRule::adamw, 1500}, Case{BalanceRule::sign_adaptive, 100}}) {
    const BalanceTrace t = balance_fixed_logits(logits, n, e, rule_options(c.rule), 2000, 0.05,
                                                c.reach_by);
    EXPECT_GT(t.initial, 0.75);  // expert 0 takes almost every token at the start
    EXPECT_GE(t.reached, 0) << balance_rule_name(c.rule);
    EXPECT_LE(t.reached, c.reach_by) << balance_rule_name(c.rule);
    EXPECT_LT(t.settled_worst, 0.01) << balance_rule_name(c.rule);
    std::printf("[ balancing ] %s: max |load error| %.3f at start, < 0.05 after %d updates, "
                "worst from update %d on: %.4f\n",
                balance_rule_name(c.rule), t.initial, t.reached, c.reach_by, t.settled_worst);
  }
}

// A router at initialization: its probabilities differ between tokens by ~1e-4 (logits of
// std 1e-3 around class offsets of std 3e-3). A fixed step of 1e-3 is ten times that spread,
// so AdamW updates tend to move whole batches from class to class (whether they settle
// depends on rounding, so its figure is printed for comparison only); the sign-adaptive step
// shrinks to the spread and must balance.
TEST(ZayaBalancer, BalancesARouterWhoseProbabilitiesBarelyDifferBetweenTokens) {
  const int64_t n = 2048, e = 8, classes = e + 1;
  auto logits = random_normal<float>(n * classes, 101);
  const auto offsets = random_normal<float>(classes, 102);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t s = 0; s < classes; ++s)
      logits[i * classes + s] = 1e-3f * logits[i * classes + s] + 3e-3f * offsets[s];
  const BalanceTrace adamw =
      balance_fixed_logits(logits, n, e, rule_options(BalanceRule::adamw), 400, 0.1, 200);
  const BalanceTrace adaptive =
      balance_fixed_logits(logits, n, e, rule_options(BalanceRule::sign_adaptive), 400, 0.1, 200);
  EXPECT_GE(adaptive.reached, 0);
  EXPECT_LE(adaptive.reached, 150);
  EXPECT_LT(adaptive.settled_worst, 0.1);
  std::printf("[ balancing ] spread 1e-4: worst max |load error| over updates 200..400: adamw "
              "%.3f, sign_adaptive %.3f (below 0.1 after %d updates)\n",
              adamw.settled_worst, adaptive.settled_worst, adaptive.reached);
}

// A router in training, as the demo's: each update routes a new batch of 16 sequences whose
// topics shift their tokens' logits together (so the loads of a batch are noisy even at the
// right bias), and the router drifts: the skip logit climbs by 4 over the run and one
// expert's by 2. The noise flips the sign of a balanced class's error every few updates,
// which keeps the sign-adaptive steps near their minimum, so the drift runs ahead of them;
// the proportional rule integrates the error, moves each bias by gain × the noise only, and
// follows the drift.
TEST(ZayaBalancer, ProportionalOnTheLogitsFollowsANoisyDriftingRouter) {
  const int64_t n = 2048, e = 8, classes = e + 1, sequences = 16;
  const int updates = 1200;
  const auto tokens = random_normal<float>(n * classes, 103);
  const auto offsets = random_normal<float>(classes, 104);
  std::vector<float> logits(n * classes);
  auto batch = [&](int u) -> const std::vector<float>& {
    const float t = static_cast<float>(u) / updates;
    const auto topics = random_normal<float>(sequences * classes, 1000 + u, 0.5);
    for (int64_t i = 0; i < n; ++i) {
      const float* topic = topics.data() + (i * sequences / n) * classes;
      for (int64_t s = 0; s < classes; ++s)
        logits[i * classes + s] = tokens[i * classes + s] + 0.5f * offsets[s] + topic[s] +
                                  (s == e ? 2.0f + 4.0f * t : 0.0f) + (s == 0 ? 2.0f * t : 0.0f);
    }
    return logits;
  };
  const BalanceTrace proportional = balance_trace(
      batch, n, e, rule_options(BalanceRule::proportional), BiasOn::logits, updates, 0.2, 300);
  const BalanceTrace adaptive = balance_trace(
      batch, n, e, rule_options(BalanceRule::sign_adaptive), BiasOn::logits, updates, 0.2, 300);
  const BalanceTrace newton = balance_trace(
      batch, n, e, rule_options(BalanceRule::newton), BiasOn::logits, updates, 0.2, 300);
  std::printf("newton %.3f reached %d\n", newton.settled_worst, newton.reached);
  EXPECT_GE(proportional.reached, 0);
  EXPECT_LE(proportional.reached, 100);
  EXPECT_LT(proportional.settled_worst, 0.2);
  EXPECT_LT(proportional.settled_worst, adaptive.settled_worst);
  std::printf("[ balancing ] noisy drifting router, worst max |load error| from update 300 on "
              "the logits: proportional %.3f, sign_adaptive %.3f\n",
              proportional.settled_worst, adaptive.settled_worst);
}

// ---- residual scaling ------------------------------------------------------------------------

struct ResidualParams {
  std::vector<double> alpha_res, beta_res, alpha_h, beta_h;
};

ResidualParams random_residual_params(int64_t c, uint64_t seed) {
  ResidualParams p{random_normal(c, seed, 0.3), random_normal(c, seed + 1, 0.3),
                   random_normal(c, seed + 2, 0.3), random_normal(c, seed + 3, 0.3)};
  for (auto& a : p.alpha_res) a += 1.0;
  for (auto& a : p.alpha_h) a += 1.0;
  return p;
}

TEST(ZayaResidualScale, ForwardMatchesReferenceAndMayRunInPlace) {
  const int64_t n = 6, c = 9;
  const auto res = random_normal(n * c, 110), h = random_normal(n * c, 111);
  const auto p = random_residual_params(c, 112);
  std::vector<double> expected(n * c);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j)
      expected[i * c + j] = (res[i * c + j] + p.beta_res[j]) * p.alpha_res[j] +
                            (h[i * c + j] + p.beta_h[j]) * p.alpha_h[j];
  std::vector<double> out(n * c);
  residual_scale_forward(out.data(), res.data(), h.data(), p.alpha_res.data(),
                         p.beta_res.data(), p.alpha_h.data(), p.beta_h.data(), n, c);
  EXPECT_LT(max_relative_error(out, expected), 1e-15);
  auto in_place = res;
  residual_scale_forward(in_place.data(), in_place.data(), h.data(), p.alpha_res.data(),
                         p.beta_res.data(), p.alpha_h.data(), p.beta_h.data(), n, c);
  EXPECT_EQ(in_place, out);

  auto res_f = cast_vector<float>(res);
  const auto h_f = cast_vector<float>(h), ar = cast_vector<float>(p.alpha_res),
             br = cast_vector<float>(p.beta_res), ah = cast_vector<float>(p.alpha_h),
             bh = cast_vector<float>(p.beta_h);
  residual_scale_forward(res_f.data(), res_f.data(), h_f.data(), ar.data(), br.data(), ah.data(),
                         bh.data(), n, c);
  EXPECT_LT(max_relative_error(res_f, expected), 1e-6);
}

TEST(ZayaResidualScale, BackwardMatchesFiniteDifferencesForAllSixGradients) {
  const int64_t n = 70, c = 13;  // three row chunks in the parameter reductions
  auto res = random_normal(n * c, 120), h = random_normal(n * c, 121);
  auto p = random_residual_params(c, 122);
  const auto dout = random_normal(n * c, 126);
  std::vector<double> out(n * c);
  auto loss = [&] {
    residual_scale_forward(out.data(), res.data(), h.data(), p.alpha_res.data(),
                           p.beta_res.data(), p.alpha_h.data(), p.beta_h.data(), n, c);
    return dot(out, dout);
  };
  const auto num_res = numeric_gradient(res, loss), num_h = numeric_gradient(h, loss);
  const auto num_ar = numeric_gradient(p.alpha_res, loss);
  const auto num_br = numeric_gradient(p.beta_res, loss);
  const auto num_ah = numeric_gradient(p.alpha_h, loss);
  const auto num_bh = numeric_gradient(p.beta_h, loss);

  const auto prior_nc = random_normal(n * c, 127), prior_c = random_normal(c, 128);
  auto dres = prior_nc, dh = prior_nc;  // written, not added to
  auto dar = prior_c, dbr = prior_c, dah = prior_c, dbh = prior_c;
  residual_scale_backward(dres.data(), dh.data(), dar.data(), dbr.data(), dah.data(), dbh.data(),
                          dout.data(), res.data(), h.data(), p.alpha_res.data(),
                          p.beta_res.data(), p.alpha_h.data(), p.beta_h.data(), n, c);
  EXPECT_LT(max_relative_error(dres, num_res), 1e-9);
  EXPECT_LT(max_relative_error(dh, num_h), 1e-9);
  EXPECT_LT(max_relative_error(minus(dar, prior_c), num_ar), 1e-9);
  EXPECT_LT(max_relative_error(minus(dbr, prior_c), num_br), 1e-9);
  EXPECT_LT(max_relative_error(minus(dah, prior_c), num_ah), 1e-9);
  EXPECT_LT(max_relative_error(minus(dbh, prior_c), num_bh), 1e-9);
}

// Without dres, dh and the parameter gradients are residual_scale_backward's bits; in bf16,
// dh is their rounding (float inputs, several row chunks, one and two threads).
TEST(ZayaResidualScale, BackwardWithoutTheResidualGradientGivesTheSameBits) {
  const int64_t n = 70, c = 40;
  const auto res = random_normal<float>(n * c, 140), h = random_normal<float>(n * c, 141);
  const auto dout = random_normal<float>(n * c, 142), vec = random_normal<float>(4 * c, 143);
  const float *ar = vec.data(), *br = ar + c, *ah = br + c, *bh = ah + c;
  std::vector<float> dres(n * c), dh(n * c), grads(4 * c, 0.5f);
  residual_scale_backward(dres.data(), dh.data(), grads.data(), grads.data() + c,
                          grads.data() + 2 * c, grads.data() + 3 * c, dout.data(), res.data(),
                          h.data(), ar, br, ah, bh, n, c);
  for (int threads : {1, 2}) {
    WithThreads scope(threads);
    std::vector<float> dh_alone(n * c, 7.0f), grads_alone(4 * c, 0.5f);
    std::vector<bf16> dh16(n * c);
    residual_scale_backward_params(dh_alone.data(), grads_alone.data(), grads_alone.data() + c,
                                   grads_alone.data() + 2 * c, grads_alone.data() + 3 * c,
                                   dout.data(), res.data(), h.data(), ar, br, ah, bh, n, c);
    EXPECT_EQ(dh_alone, dh);
    EXPECT_EQ(grads_alone, grads);
    std::vector<float> grads16(4 * c, 0.5f);
    residual_scale_backward_params(dh16.data(), grads16.data(), grads16.data() + c,
                                   grads16.data() + 2 * c, grads16.data() + 3 * c, dout.data(),
                                   res.data(), h.data(), ar, br, ah, bh, n, c);
    for (int64_t i = 0; i < n * c; ++i) ASSERT_EQ(dh16[i], float_to_bf16(dh[i])) << i;
    EXPECT_EQ(grads16, grads);
  }
}

// ---- determinism across thread counts ----------------------------------------------------

// Every kernel here at sizes above the parallel threshold: the same bits on one and two
// threads (and, under the sanitizers, no races or stray accesses in the parallel paths).
TEST(ZayaDeterminism, EveryKernelIsBitwiseIdenticalForOneAndTwoThreads) {
  const int64_t n = 4096, r_dim = 48, c = 64, e = 4, classes = e + 1, k = 2;
  const auto x = random_normal<float>(n * r_dim, 130), prev = random_normal<float>(n * r_dim, 131);
  const auto vec_r = random_normal<float>(r_dim, 132);
  const auto res = random_normal<float>(n * c, 133), h = random_normal<float>(n * c, 134);
  const auto dres_in = random_normal<float>(n * c, 135);
  const auto vec_c = random_normal<float>(4 * c, 136);
  const auto logits = random_normal<float>(n * classes, 137);
  const auto bias = random_normal<float>(classes, 138, 0.05);
  const auto dgate = random_normal<float>(n * k, 139);
  auto run = [&](int threads) {
    WithThreads scope(threads);
    std::vector<float> all;
    auto keep = [&](const auto& values) {
      for (auto value : values) all.push_back(static_cast<float>(value));
    };
    auto y = x;
    bias_add_forward(y.data(), vec_r.data(), n, r_dim);
    keep(y);
    std::vector<float> dbias(r_dim, 0.5f);
    bias_add_backward(dbias.data(), x.data(), n, r_dim);
    keep(dbias);
    std::vector<float> g(n * r_dim), dg(n * r_dim);
    gelu_forward(g.data(), x.data(), n, r_dim);
    gelu_backward(dg.data(), prev.data(), x.data(), n, r_dim);
    keep(g);
    keep(dg);
    auto r = x;
    eda_forward(r.data(), prev.data(), vec_r.data(), n, r_dim);
    keep(r);
    std::vector<float> dprev(n * r_dim, 0.25f), dgamma(r_dim, 0.125f);
    eda_backward(dprev.data(), dgamma.data(), x.data(), prev.data(), vec_r.data(), n, r_dim);
    keep(dprev);
    keep(dgamma);
    std::vector<float> probs(n * classes), gate(n * k), dlogits(n * classes);
    std::vector<int32_t> choice(n * k);
    std::vector<int64_t> counts(classes);
    zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(), bias.data(),
                        BiasOn::probs, n, e, k, true, true);
    zaya_gating_backward(dlogits.data(), dgate.data(), probs.data(), choice.data(), n, e, k,
                         true, true);
    zaya_class_counts(counts.data(), choice.data(), n, k, classes);
    keep(probs);
    keep(choice);
    keep(gate);
    keep(dlogits);
    keep(counts);
    const float *ar = vec_c.data(), *br = ar + c, *ah = br + c, *bh = ah + c;
    std::vector<float> out(n * c);
    residual_scale_forward(out.data(), res.data(), h.data(), ar, br, ah, bh, n, c);
    keep(out);
    std::vector<float> dres(n * c, 0.0f), dh(n * c, 1.0f), dar(c, 0.0f), dbr(c, 0.0f),
        dah(c, 0.0f), dbh(c, 0.0f);
    residual_scale_backward(dres.data(), dh.data(), dar.data(), dbr.data(), dah.data(),
                            dbh.data(), dres_in.data(), res.data(), h.data(), ar, br, ah, bh, n,
                            c);
    keep(dres);
    keep(dh);
    keep(dar);
    keep(dbr);
    keep(dah);
    keep(dbh);
    return all;
  };
  const auto one = run(1), two = run(2);
  ASSERT_EQ(one.size(), two.size());
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace foundry::ops
