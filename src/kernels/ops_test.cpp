#include "kernels/ops.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "base/error.h"
#include "base/test_expect_error.h"
#include "kernels/cpu_backend.h"
#include "kernels/kernel_support.h"
#include "kernels/test_support.h"

namespace foundry::ops {
namespace {

using namespace foundry::testing;

std::vector<int32_t> random_tokens(int64_t n, int64_t v, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> tokens(n);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(v));
  return tokens;
}


// ---- embedding ---------------------------------------------------------------------------

// Backend::copy_blocks (the CPU's: a copy per block): block i of 3 floats from every 5th float
// of the source to every 4th of the destination; the gaps stay as they were.
TEST(BackendCopies, BlocksGoFromOneStrideToAnother) {
  std::vector<float> from(20), to(16, -1.0f);
  for (size_t i = 0; i < from.size(); ++i) from[i] = static_cast<float>(i);
  constexpr int64_t kF = sizeof(float);
  cpu_backend().copy_blocks(to.data(), 4 * kF, from.data() + 1, 5 * kF, 3 * kF, 4);
  for (int64_t i = 0; i < 16; ++i)
    EXPECT_EQ(to[i], i % 4 < 3 ? static_cast<float>(1 + (i / 4) * 5 + i % 4) : -1.0f) << i;
  expect_error([&] { cpu_backend().copy_blocks(to.data(), kF, from.data(), kF, 2 * kF, 1); },
               "internal check failed");
}

// Backend slabs on the CPU posing as a device, made as a GPU's (chunks of a page here): the
// chunks wholly inside holes, given at the start or handed back later, take no memory of
// their own and map one chunk of each kind, read-only zeros (a write there crashes) or
// writable scratch shared by every such place; the bytes around keep their memory and values.
// The host's CPU backend makes no holes (its slabs are PageSlabs, model.h).
TEST(BackendSlabs, HolesReadAsZerosOrSharedScratch) {
  const std::unique_ptr<Backend> device = make_cpu_backend_posing_as_device();
  using Released = Backend::Released;
  const int64_t page = sysconf(_SC_PAGESIZE), n = 8 * page;
  // Pages 1–2 (from the middle of page 0 to the middle of page 3) zeros from the start.
  auto* slab = static_cast<unsigned char*>(
      device->allocate_slab(n, {{page / 2, 3 * page + 5}}, Released::zeros));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(slab[i], 0) << i;
  EXPECT_EQ(device->slab_memory_bytes(slab, n), 7 * page);  // 6 pages and the zeros' alias
  for (int64_t i = 0; i < n; ++i)
    if (i < page || i >= 3 * page) slab[i] = 7;
  // Pages 5 and 6 handed back as scratch.
  EXPECT_EQ(device->release_slab_ranges(slab, {{5 * page, 7 * page}}, Released::scratch), 2 * page);
  EXPECT_EQ(device->slab_memory_bytes(slab, n), 6 * page);
  for (int64_t i = 0; i < n; ++i) {
    const bool zeros = i >= page && i < 3 * page, scratch = i >= 5 * page && i < 7 * page;
    ASSERT_EQ(slab[i], zeros || scratch ? 0 : 7) << i;
  }
  slab[5 * page + 1] = 3;  // scratch takes writes, and every scratch place reads them
  EXPECT_EQ(slab[6 * page + 1], 3);
  volatile unsigned char* zeros = slab + page;
  EXPECT_DEATH(zeros[1] = 3, "");
  EXPECT_EQ(device->release_slab_ranges(slab, {{0, page - 1}}, Released::zeros), 0);
  device->release(slab);
  void* host = cpu_backend().allocate_slab(n, {{0, n}});
  EXPECT_EQ(cpu_backend().release_slab_ranges(host, {{0, n}}, Released::zeros), 0);
  EXPECT_EQ(cpu_backend().slab_memory_bytes(host, n), n);
  cpu_backend().release(host);
}

// The vectorized max (AVX-512, AVX or scalar, as built) finds the largest element wherever it
// sits: in a whole vector of lanes, in the tail, first or last, and -inf for no elements.
TEST(KernelSupport, MaxOfFindsTheLargestAnywhere) {
  EXPECT_EQ(ops::detail::max_of(static_cast<const float*>(nullptr), 0),
            -std::numeric_limits<float>::infinity());
  for (int64_t n = 1; n <= 70; ++n)
    for (int64_t at = 0; at < n; ++at) {
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) x[i] = -1000.0f + static_cast<float>((i * 37) % 101);
      x[at] = 5.5f;
      ASSERT_EQ(ops::detail::max_of(x.data(), n), 5.5f) << "n " << n << ", at " << at;
    }
}

TEST(Embedding, ForwardCopiesTheTokenRows) {
  const int64_t n = 9, c = 5, v = 4;
  const auto wte = random_normal<float>(v * c, 1);
  const auto tokens = random_tokens(n, v, 2);
  std::vector<float> out(n * c, -1.0f);
  embedding_forward(out.data(), tokens.data(), wte.data(), n, c);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j) ASSERT_EQ(out[i * c + j], wte[tokens[i] * c + j]);
}

TEST(Embedding, BackwardAccumulatesTheScatterAndMatchesFiniteDifferences) {
  const int64_t n = 12, c = 70, v = 5;  // c > 64 crosses a column block
  const std::vector<int32_t> tokens{0, 3, 3, 1, 0, 3, 4, 4, 3, 1, 0, 3};  // repeats; id 2 unused
  const auto dout = random_normal(n * c, 3);
  auto wte = random_normal(v * c, 4);
  const auto prior = random_normal(v * c, 5);
  std::vector<double> dwte = prior;
  embedding_backward(dwte.data(), dout.data(), tokens.data(), n, c, v);

  std::vector<double> out(n * c);
  auto loss = [&] {
    embedding_forward(out.data(), tokens.data(), wte.data(), n, c);
    return dot(out, dout);
  };
  const auto numeric = numeric_gradient(wte, loss);
  std::vector<double> analytic(v * c);
  for (int64_t i = 0; i < v * c; ++i) analytic[i] = dwte[i] - prior[i];
  EXPECT_LT(max_relative_error(analytic, numeric), 1e-8);
  for (int64_t j = 0; j < c; ++j) EXPECT_EQ(dwte[2 * c + j], prior[2 * c + j]);
}

TEST(Embedding, BackwardRejectsTokensOutsideTheVocabulary) {
  const int64_t c = 3, v = 4;
  std::vector<double> dwte(v * c), dout(2 * c, 1.0);
  const std::vector<int32_t> tokens{1, 4};
  EXPECT_THROW(embedding_backward(dwte.data(), dout.data(), tokens.data(), 2, c, v), Error);
}

// ---- RMSNorm -----------------------------------------------------------------------------

std::vector<double> rmsnorm_reference(const std::vector<double>& in,
                                      const std::vector<double>& weight, int64_t n, int64_t c,
                                      double eps) {
  std::vector<double> out(n * c);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < c; ++j) ss += in[i * c + j] * in[i * c + j];
    const double r = 1.0 / std::sqrt(ss / c + eps);
    for (int64_t j = 0; j < c; ++j) out[i * c + j] = in[i * c + j] * r * weight[j];
  }
  return out;
}

TEST(RmsNorm, ForwardMatchesReferenceInFloatAndDouble) {
  const int64_t n = 7, c = 37;
  const auto in = random_normal(n * c, 1, 2.0), weight = random_normal(c, 2);
  const auto expected = rmsnorm_reference(in, weight, n, c, 1e-5);

  std::vector<double> out(n * c), rstd(n);
  rmsnorm_forward(out.data(), rstd.data(), in.data(), weight.data(), n, c, 1e-5);
  EXPECT_LT(max_relative_error(out, expected), 1e-14);

  const auto in_f = cast_vector<float>(in), weight_f = cast_vector<float>(weight);
  std::vector<float> out_f(n * c), rstd_f(n);
  rmsnorm_forward(out_f.data(), rstd_f.data(), in_f.data(), weight_f.data(), n, c, 1e-5f);
  EXPECT_LT(max_relative_error(out_f, expected), 1e-6);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(rstd_f[i], rstd[i], 1e-6 * rstd[i]);
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t n = 37, c = 11;  // n > 32 spans two row chunks of the dweight reduction
  const double eps = 1e-5;
  auto in = random_normal(n * c, 3), weight = random_normal(c, 4);
  const auto dout = random_normal(n * c, 5);
  std::vector<double> out(n * c), rstd(n);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), in.data(), weight.data(), n, c, eps);
    return dot(out, dout);
  };
  const auto numeric_din = numeric_gradient(in, loss);
  const auto numeric_dweight = numeric_gradient(weight, loss);

  rmsnorm_forward(out.data(), rstd.data(), in.data(), weight.data(), n, c, eps);
  const auto din_prior = random_normal(n * c, 6), dweight_prior = random_normal(c, 7);
  auto din = din_prior, dweight = dweight_prior;
  rmsnorm_backward(din.data(), dweight.data(), dout.data(), in.data(), weight.data(),
                   rstd.data(), n, c);
  for (int64_t i = 0; i < n * c; ++i) din[i] -= din_prior[i];
  for (int64_t j = 0; j < c; ++j) dweight[j] -= dweight_prior[j];
  EXPECT_LT(max_relative_error(din, numeric_din), 1e-7);
  EXPECT_LT(max_relative_error(dweight, numeric_dweight), 1e-7);

  // With a residual folded in, din is written: scale ⊙ residual + the same gradient, and
  // dweight gets the same bits.
  const auto residual = random_normal(n * c, 8), scale = random_normal(c, 9);
  std::vector<double> written(n * c, 1e30), dweight_residual = dweight_prior;
  rmsnorm_backward_residual(written.data(), dweight_residual.data(), dout.data(), in.data(),
                            weight.data(), rstd.data(), residual.data(), scale.data(), n, c);
  std::vector<double> expected(n * c);
  for (int64_t i = 0; i < n * c; ++i) expected[i] = scale[i % c] * residual[i] + din[i];
  EXPECT_LT(max_relative_error(written, expected), 1e-12);
  for (int64_t j = 0; j < c; ++j) EXPECT_EQ(dweight_residual[j] - dweight_prior[j], dweight[j]);
}

// ---- RoPE --------------------------------------------------------------------------------

// Rotate-half RoPE in double, straight from the definition.
std::vector<double> rope_reference(std::vector<double> x, int64_t b, int64_t t, int64_t h,
                                   int64_t d, int64_t rotary_dim, int64_t pos_offset,
                                   double theta) {
  const int64_t half = rotary_dim / 2;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti)
      for (int64_t hi = 0; hi < h; ++hi) {
        double* head = x.data() + ((bi * t + ti) * h + hi) * d;
        for (int64_t i = 0; i < half; ++i) {
          const double angle =
              (pos_offset + ti) / std::pow(theta, 2.0 * i / static_cast<double>(rotary_dim));
          const double x1 = head[i], x2 = head[i + half];
          head[i] = x1 * std::cos(angle) - x2 * std::sin(angle);
          head[i + half] = x2 * std::cos(angle) + x1 * std::sin(angle);
        }
      }
  return x;
}

TEST(Rope, RotatesAHandComputedExample) {
  // One head of dim 4 at positions 0 and 1, theta = 100: pair 0 = dims (0, 2) turns by
  // pos·1 rad, pair 1 = dims (1, 3) by pos·100^(-1/2) = pos·0.1 rad.
  std::vector<double> x{1, 2, 3, 4, 1, 2, 3, 4};
  rope_apply(x.data(), 1, 2, 1, 4, 4, 0, 100.0, false);
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c01 = std::cos(0.1), s01 = std::sin(0.1);
  const std::vector<double> expected{1, 2, 3, 4, 1 * c1 - 3 * s1, 2 * c01 - 4 * s01,
                                     3 * c1 + 1 * s1, 4 * c01 + 2 * s01};
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], expected[i], 1e-15) << i;
}

TEST(Rope, PartialRotaryDimMatchesReferenceAndLeavesTheTailUntouched) {
  const int64_t b = 2, t = 5, h = 3, d = 10, rotary_dim = 6, pos_offset = 7;
  const auto x0 = random_normal(b * t * h * d, 1);
  const auto expected = rope_reference(x0, b, t, h, d, rotary_dim, pos_offset, 10000.0);
  auto x = x0;
  rope_apply(x.data(), b, t, h, d, rotary_dim, pos_offset, 10000.0, false);
  EXPECT_LT(max_relative_error(x, expected), 1e-14);
  for (int64_t row = 0; row < b * t * h; ++row)
    for (int64_t j = rotary_dim; j < d; ++j) ASSERT_EQ(x[row * d + j], x0[row * d + j]);

  auto xf = cast_vector<float>(x0);
  rope_apply(xf.data(), b, t, h, d, rotary_dim, pos_offset, 10000.0, false);
  EXPECT_LT(max_relative_error(xf, expected), 1e-6);
}

TEST(Rope, LargeShapeOnTwoThreadsMatchesReference) {
  // Above the parallel threshold, so the cos/sin table and the rotation run on two threads.
  WithThreads scope(2);
  const int64_t b = 2, t = 64, h = 4, d = 40, rotary_dim = 32, pos_offset = 11;
  const auto x0 = random_normal(b * t * h * d, 7);
  const auto expected = rope_reference(x0, b, t, h, d, rotary_dim, pos_offset, 5000.0);
  auto x = x0;
  rope_apply(x.data(), b, t, h, d, rotary_dim, pos_offset, 5000.0, false);
  EXPECT_LT(max_relative_error(x, expected), 1e-13);
  auto xf = cast_vector<float>(x0);
  rope_apply(xf.data(), b, t, h, d, rotary_dim, pos_offset + 1, 5000.0, false);
  rope_apply(xf.data(), b, t, h, d, rotary_dim, pos_offset + 1, 5000.0, true);
  EXPECT_LT(max_relative_error(xf, x0), 1e-6);
}

TEST(Rope, RowsAtTheirOwnPositionsEqualEachRowRotatedAlone) {
  // Decode rows: each at its own position, in no order. Each row must get the bits rope_apply
  // gives it alone; and rotated one at a time in double, each past every position rotated so
  // far (the cached table grows under them), the rows must match the definition.
  const int64_t h = 3, d = 12, rotary_dim = 8;
  const std::vector<int64_t> pos{5, 0, 4099, 17, 5, 300, 70000};
  const auto rows = static_cast<int64_t>(pos.size());
  const auto x0 = random_normal(rows * h * d, 9);
  auto together = cast_vector<float>(x0);
  rope_apply_rows(together.data(), pos.data(), rows, h, d, rotary_dim, 10000.0);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> alone(x0.begin() + r * h * d, x0.begin() + (r + 1) * h * d);
    rope_apply(alone.data(), 1, 1, h, d, rotary_dim, pos[r], 10000.0, false);
    for (int64_t i = 0; i < h * d; ++i)
      ASSERT_EQ(together[r * h * d + i], alone[i]) << r << " " << i;
    const std::vector<double> row(x0.begin() + r * h * d, x0.begin() + (r + 1) * h * d);
    const auto expected = rope_reference(row, 1, 1, h, d, rotary_dim, pos[r], 10000.0);
    auto exact = row;
    rope_apply_rows(exact.data(), &pos[r], 1, h, d, rotary_dim, 10000.0);
    // At position 70,000 the angle's last bits differ with the order of its two roundings.
    EXPECT_LT(max_relative_error(exact, expected), 1e-9) << "position " << pos[r];
  }
}

TEST(Rope, InverseIsTheExactAdjointAndUndoesTheRotation) {
  const int64_t b = 2, t = 6, h = 2, d = 8;
  const auto x = random_normal(b * t * h * d, 2), y = random_normal(b * t * h * d, 3);
  auto rx = x, rty = y;
  rope_apply(rx.data(), b, t, h, d, d, 3, 500.0, false);
  rope_apply(rty.data(), b, t, h, d, d, 3, 500.0, true);
  EXPECT_NEAR(dot(rx, y), dot(x, rty), 1e-12);
  auto back = rx;
  rope_apply(back.data(), b, t, h, d, d, 3, 500.0, true);
  EXPECT_LT(max_relative_error(back, x), 1e-14);
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  const int64_t b = 1, t = 4, h = 2, d = 6, rotary_dim = 4;
  auto x = random_normal(b * t * h * d, 4);
  const auto dout = random_normal(b * t * h * d, 5);
  auto loss = [&] {
    auto y = x;
    rope_apply(y.data(), b, t, h, d, rotary_dim, 2, 10000.0, false);
    return dot(y, dout);
  };
  const auto numeric = numeric_gradient(x, loss);
  auto analytic = dout;
  rope_apply(analytic.data(), b, t, h, d, rotary_dim, 2, 10000.0, true);
  EXPECT_LT(max_relative_error(analytic, numeric), 1e-9);
}

TEST(Rope, OneDecodeStepAtAnOffsetMatchesTheSamePositionInASequence) {
  const int64_t t = 9, h = 2, d = 8;
  const auto x0 = random_normal(t * h * d, 6);
  auto seq = x0;
  rope_apply(seq.data(), 1, t, h, d, d, 0, 10000.0, false);
  std::vector<double> step(x0.begin() + 6 * h * d, x0.begin() + 7 * h * d);
  rope_apply(step.data(), 1, 1, h, d, d, 6, 10000.0, false);
  for (int64_t j = 0; j < h * d; ++j) EXPECT_EQ(step[j], seq[6 * h * d + j]);
}

// ---- SwiGLU ------------------------------------------------------------------------------

TEST(SwiGlu, ForwardMatchesReference) {
  const int64_t n = 5, f = 23;
  const auto h = random_normal(n * 2 * f, 1, 3.0);
  const auto hf = cast_vector<float>(h);
  std::vector<double> out(n * f);
  std::vector<float> out_f(n * f);
  swiglu_forward(out.data(), h.data(), n, f);
  swiglu_forward(out_f.data(), hf.data(), n, f);
  std::vector<double> expected(n * f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < f; ++j) {
      const double g = h[i * 2 * f + j], u = h[i * 2 * f + f + j];
      expected[i * f + j] = g / (1 + std::exp(-g)) * u;
    }
  EXPECT_LT(max_relative_error(out, expected), 1e-14);
  EXPECT_LT(max_relative_error(out_f, expected), 1e-6);
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  const int64_t n = 4, f = 9;
  auto h = random_normal(n * 2 * f, 2, 2.0);
  const auto dout = random_normal(n * f, 3);
  std::vector<double> out(n * f);
  auto loss = [&] {
    swiglu_forward(out.data(), h.data(), n, f);
    return dot(out, dout);
  };
  const auto numeric = numeric_gradient(h, loss);
  std::vector<double> dh(n * 2 * f, 99.0);  // written, not accumulated
  swiglu_backward(dh.data(), dout.data(), h.data(), n, f);
  EXPECT_LT(max_relative_error(dh, numeric), 1e-8);
}

// The bf16-output kernels equal the fp32 ones followed by the bf16 conversion, bit for bit,
// over rows longer than their stack pieces (f = 600: pieces of 256, 256 and 88 columns).
TEST(SwiGlu, Bf16OutputsEqualTheFp32ResultsRounded) {
  const int64_t n = 7, f = 600;
  const auto h = cast_vector<float>(random_normal(n * 2 * f, 4, 3.0));
  const auto dout = cast_vector<float>(random_normal(n * f, 5));
  std::vector<float> act(n * f), dh(n * 2 * f);
  swiglu_forward(act.data(), h.data(), n, f);
  swiglu_backward(dh.data(), dout.data(), h.data(), n, f);
  std::vector<bf16> act_bf16(n * f), dh_bf16(n * 2 * f);
  swiglu_forward_bf16(act_bf16.data(), h.data(), n, f);
  swiglu_backward_bf16(dh_bf16.data(), dout.data(), h.data(), n, f);
  for (int64_t i = 0; i < n * f; ++i)
    ASSERT_EQ(act_bf16[i], float_to_bf16(act[i])) << "act element " << i;
  for (int64_t i = 0; i < n * 2 * f; ++i)
    ASSERT_EQ(dh_bf16[i], float_to_bf16(dh[i])) << "dh element " << i;
}

// ---- cross-entropy -----------------------------------------------------------------------

TEST(CrossEntropy, ForwardIgnoresPaddedColumns) {
  const int64_t n = 6, v = 11, vp = 16;
  auto logits = random_normal(n * vp, 1, 2.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = v; j < vp; ++j) logits[i * vp + j] = 1000.0;  // would swamp the row
  const auto targets = random_tokens(n, v, 2);
  double expected_mean = 0;
  std::vector<double> expected(n);
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(logits[i * vp + j]);
    expected[i] = std::log(sum) - logits[i * vp + targets[i]];
    expected_mean += expected[i] / n;
  }
  std::vector<double> losses(n);
  EXPECT_NEAR(cross_entropy<double>(nullptr, losses.data(), logits.data(), targets.data(), n, v,
                                    vp, 1.0),
              expected_mean, 1e-13);
  EXPECT_LT(max_relative_error(losses, expected), 1e-13);

  const auto logits_f = cast_vector<float>(logits);
  std::vector<float> losses_f(n), dlogits_f(n * vp);
  EXPECT_NEAR(cross_entropy<float>(dlogits_f.data(), losses_f.data(), logits_f.data(),
                                   targets.data(), n, v, vp, 1.0f),
              expected_mean, 1e-5);
  EXPECT_LT(max_relative_error(losses_f, expected), 1e-5);
}

// A NaN logit makes its row's loss NaN wherever it sits (first, inside a vector of lanes, in
// the tail, the target itself), with or without the gradient: max_of's result for NaN input
// is unspecified, and the NaN reaches the loss through the exp and the sum (the anomaly
// detector reads a non-finite loss).
TEST(CrossEntropy, ANanLogitGivesANanLoss) {
  const int64_t v = 37, vp = 48;
  const std::vector<int32_t> target{5};
  for (int64_t at : {int64_t{0}, int64_t{5}, int64_t{9}, int64_t{20}, int64_t{36}})
    for (bool gradient : {false, true}) {
      auto logits = cast_vector<float>(random_normal(vp, 3, 2.0));
      logits[at] = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> loss(1), d(vp);
      const double mean = cross_entropy<float>(gradient ? d.data() : nullptr, loss.data(),
                                               logits.data(), target.data(), 1, v, vp, 1.0f);
      EXPECT_TRUE(std::isnan(loss[0]) && std::isnan(mean)) << "NaN at " << at << ", gradient "
                                                           << gradient << ": " << loss[0];
    }
}

TEST(CrossEntropy, GradientMatchesFiniteDifferencesAndIsZeroInPaddedColumns) {
  const int64_t n = 5, v = 7, vp = 10;
  auto logits = random_normal(n * vp, 3, 2.0);
  const auto targets = random_tokens(n, v, 4);
  std::vector<double> losses(n);
  auto loss = [&] {
    return cross_entropy<double>(nullptr, losses.data(), logits.data(), targets.data(), n, v, vp,
                                 1.0);
  };
  const auto numeric = numeric_gradient(logits, loss);
  std::vector<double> dlogits(n * vp, 99.0);
  cross_entropy<double>(dlogits.data(), losses.data(), logits.data(), targets.data(), n, v, vp,
                        1.0 / n);
  EXPECT_LT(max_relative_error(dlogits, numeric), 1e-8);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = v; j < vp; ++j) ASSERT_EQ(dlogits[i * vp + j], 0.0);
}

TEST(CrossEntropy, InPlaceGradientEqualsOutOfPlace) {
  const int64_t n = 4, v = 30, vp = 32;
  const auto logits = random_normal<float>(n * vp, 5, 3.0);
  const auto targets = random_tokens(n, v, 6);
  std::vector<float> losses(n), losses_inplace(n), dlogits(n * vp);
  const double mean = cross_entropy<float>(dlogits.data(), losses.data(), logits.data(),
                                           targets.data(), n, v, vp, 0.25f);
  auto buffer = logits;
  const double mean_inplace = cross_entropy<float>(buffer.data(), losses_inplace.data(),
                                                   buffer.data(), targets.data(), n, v, vp, 0.25f);
  EXPECT_EQ(mean, mean_inplace);
  EXPECT_EQ(losses, losses_inplace);
  EXPECT_EQ(dlogits, buffer);
}

// The bf16 form writes the float gradient rounded to bf16, bit for bit, and the same losses:
// out of place (contiguous rows) and in place (each row in the first half of its float row).
TEST(CrossEntropy, Bf16GradientIsTheFloatGradientRounded) {
  const int64_t n = 40, v = 1000, vp = 1024;  // above the parallel threshold
  const auto logits = random_normal<float>(n * vp, 7, 3.0);
  const auto targets = random_tokens(n, v, 8);
  std::vector<float> losses(n), losses16(n), losses_inplace(n), dlogits(n * vp);
  std::vector<bf16> dlogits16(n * vp, 0xFFFF);
  const double mean = cross_entropy<float>(dlogits.data(), losses.data(), logits.data(),
                                           targets.data(), n, v, vp, 0.25f);
  const double mean16 = cross_entropy(dlogits16.data(), vp, losses16.data(), logits.data(),
                                      targets.data(), n, v, vp, 0.25f);
  EXPECT_EQ(mean, mean16);
  EXPECT_EQ(losses, losses16);
  for (int64_t i = 0; i < n * vp; ++i) ASSERT_EQ(dlogits16[i], float_to_bf16(dlogits[i])) << i;

  auto buffer = logits;
  bf16* in_place = reinterpret_cast<bf16*>(buffer.data());
  EXPECT_EQ(cross_entropy(in_place, 2 * vp, losses_inplace.data(), buffer.data(), targets.data(),
                          n, v, vp, 0.25f),
            mean);
  EXPECT_EQ(losses_inplace, losses);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < vp; ++j) ASSERT_EQ(in_place[i * 2 * vp + j], dlogits16[i * vp + j]);

  EXPECT_THROW(cross_entropy(dlogits16.data(), vp, losses16.data(), logits.data(),
                             std::vector<int32_t>(n, static_cast<int32_t>(v)).data(), n, v, vp,
                             0.25f),
               Error);
}

TEST(CrossEntropy, RejectsTargetsOutsideTheRealVocabulary) {
  std::vector<float> logits(8, 0.0f), losses(1);
  const std::vector<int32_t> padded_target{6};
  EXPECT_THROW(cross_entropy<float>(nullptr, losses.data(), logits.data(), padded_target.data(),
                                    1, 5, 8, 1.0f),
               Error);
}

// ---- determinism across thread counts ----------------------------------------------------

TEST(Determinism, RmsNormBackwardIsBitwiseIdenticalForOneAndTwoThreads) {
  const int64_t n = 300, c = 96;  // above the parallel threshold, ten row chunks
  const auto in = random_normal<float>(n * c, 1), weight = random_normal<float>(c, 2);
  const auto dout = random_normal<float>(n * c, 3);
  std::vector<float> out(n * c), rstd(n);
  rmsnorm_forward(out.data(), rstd.data(), in.data(), weight.data(), n, c, 1e-5f);
  auto run = [&](int threads) {
    WithThreads scope(threads);
    std::vector<float> din(n * c, 0.5f), dweight(c, 0.25f);
    rmsnorm_backward(din.data(), dweight.data(), dout.data(), in.data(), weight.data(),
                     rstd.data(), n, c);
    din.insert(din.end(), dweight.begin(), dweight.end());
    return din;
  };
  const auto one = run(1), two = run(2);
  ASSERT_EQ(one.size(), two.size());
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
}

TEST(Determinism, EmbeddingBackwardIsBitwiseIdenticalForOneAndTwoThreads) {
  const int64_t n = 400, c = 96, v = 23;  // many repeats per token id
  const auto dout = random_normal<float>(n * c, 4);
  const auto tokens = random_tokens(n, v, 5);
  auto run = [&](int threads) {
    WithThreads scope(threads);
    std::vector<float> dwte(v * c, 0.125f);
    embedding_backward(dwte.data(), dout.data(), tokens.data(), n, c, v);
    return dwte;
  };
  const auto one = run(1), two = run(2);
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
}

// Every row-parallel kernel at sizes above the parallel threshold: the same bits on one and
// two threads (and, under the sanitizers, no races or stray accesses in the parallel paths).
TEST(Determinism, EveryKernelIsBitwiseIdenticalForOneAndTwoThreads) {
  const int64_t n = 256, c = 128, f = 128, e = 64, k = 2, v = 120, vp = 128;
  const auto x = random_normal<float>(n * c, 10), w = random_normal<float>(c, 11);
  const auto h = random_normal<float>(n * 2 * f, 12), dact = random_normal<float>(n * f, 13);
  const auto logits = random_normal<float>(n * e, 14), dtopk = random_normal<float>(n * k, 15);
  const auto vocab_logits = random_normal<float>(n * vp, 16);
  const auto tokens = random_tokens(n, v, 17), targets = random_tokens(n, v, 18);
  auto run = [&](int threads) {
    WithThreads scope(threads);
    std::vector<float> all;
    auto keep = [&](const auto& values) {
      for (auto value : values) all.push_back(static_cast<float>(value));
    };
    std::vector<float> out(n * c), rstd(n);
    embedding_forward(out.data(), tokens.data(), x.data(), n, c);
    keep(out);
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, 1e-5f);
    keep(out);
    keep(rstd);
    auto rotated = x;
    rope_apply(rotated.data(), 2, n / 2, c / 64, 64, 64, 3, 10000.0, false);
    keep(rotated);
    std::vector<float> act(n * f), dh(n * 2 * f);
    swiglu_forward(act.data(), h.data(), n, f);
    swiglu_backward(dh.data(), dact.data(), h.data(), n, f);
    keep(act);
    keep(dh);
    std::vector<float> probs(n * e), topk_w(n * k), dlogits(n * e);
    std::vector<int32_t> topk_idx(n * k);
    router_forward(probs.data(), topk_idx.data(), topk_w.data(), logits.data(), n, e, k, true);
    all.push_back(router_aux_loss(probs.data(), topk_idx.data(), n, e, k));
    router_backward(dlogits.data(), dtopk.data(), probs.data(), topk_idx.data(), topk_w.data(),
                    n, e, k, true, 0.01f);
    keep(probs);
    keep(topk_idx);
    keep(topk_w);
    keep(dlogits);
    std::vector<int64_t> offsets(e + 1);
    std::vector<int32_t> slot_token(n * k), assignment_slot(n * k);
    moe_dispatch_plan(offsets.data(), slot_token.data(), assignment_slot.data(), topk_idx.data(),
                      n, e, k);
    std::vector<float> xs(n * k * c), combined(n * c, 0.0f), dys(n * k * c), dw(n * k);
    std::vector<float> dx(n * c, 0.0f);
    moe_gather(xs.data(), x.data(), slot_token.data(), n * k, c);
    moe_combine(combined.data(), xs.data(), topk_w.data(), assignment_slot.data(), n, k, c);
    moe_combine_backward(dys.data(), dw.data(), x.data(), xs.data(), topk_w.data(),
                         assignment_slot.data(), n, k, c);
    moe_gather_backward(dx.data(), dys.data(), assignment_slot.data(), n, k, c);
    keep(combined);
    keep(dw);
    keep(dx);
    std::vector<float> losses(n), dvocab(n * vp);
    all.push_back(static_cast<float>(cross_entropy(dvocab.data(), losses.data(),
                                                   vocab_logits.data(), targets.data(), n, v,
                                                   vp, 1.0f / n)));
    keep(losses);
    keep(dvocab);
    return all;
  };
  const auto one = run(1), two = run(2);
  ASSERT_EQ(one.size(), two.size());
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace foundry::ops
