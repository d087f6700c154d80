#include "kernels/cca.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "kernels/gemm.h"
#include "kernels/test_support.h"

namespace foundry::ops {
namespace {

// Where oneDNN runs bf16 products (AVX-512 and up) a product's rows are the same bits
// whatever rows it runs beside, and a weight gradient's sums over the rows are the same bits
// when both forms give the library the same shapes and strides (its kernel may split the rows
// differently for another stride), so a fused form equals its composition bit for bit. Below
// AVX-512, bf16 products run as fp32 ones through oneDNN's GEMM driver, whose rows depend on
// the row count: there the two agree to fp32 rounding.
void expect_same_products(const std::vector<float>& got, const std::vector<float>& want,
                          const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (native_bf16_products()) {
    EXPECT_EQ(got, want) << what;
    return;
  }
  double scale = 0;
  for (float x : want) scale = std::max(scale, std::abs(double(x)));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + scale)) << what << " [" << i << "]";
}


using namespace foundry::testing;
using Vec = std::vector<double>;

// analytic − prior: what a backward call added to a gradient buffer.
Vec added(const Vec& after, const Vec& prior) {
  Vec out(after.size());
  for (size_t i = 0; i < after.size(); ++i) out[i] = after[i] - prior[i];
  return out;
}

// ---- plain double references, straight from the definitions ------------------------------

// [mq ‖ mk] [N, C] from c [N, C] = [q0 ‖ k0].
Vec means_reference(const Vec& c, int64_t n, int64_t hq, int64_t hk, int64_t d) {
  const int64_t g = hq / hk, ch = (hq + hk) * d;
  Vec out(n * ch, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t x = 0; x < d; ++x) {
        const double mq = (c[r * ch + h * d + x] + c[r * ch + hq * d + (h / g) * d + x]) / 2;
        out[r * ch + h * d + x] = mq;
        out[r * ch + hq * d + (h / g) * d + x] += mq / g;
      }
  return out;
}

Vec depthwise_reference(const Vec& c, const Vec& w0, const Vec& b0, int64_t b, int64_t t,
                        int64_t ch, int64_t taps) {
  Vec y(b * t * ch);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti)
      for (int64_t j = 0; j < ch; ++j) {
        double s = b0[j];
        for (int64_t i = 0; i < taps; ++i) {
          const int64_t src = ti - (taps - 1) + i;
          if (src >= 0) s += w0[j * taps + i] * c[(bi * t + src) * ch + j];
        }
        y[(bi * t + ti) * ch + j] = s;
      }
  return y;
}

// y before position 0 reads `before` [G·d] (empty: zero).
Vec grouped_reference(const Vec& y, const Vec& w1, const Vec& b1, const Vec& before, int64_t b,
                      int64_t t, int64_t groups, int64_t d, int64_t taps) {
  const int64_t ch = groups * d;
  Vec z(b * t * ch);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti)
      for (int64_t grp = 0; grp < groups; ++grp)
        for (int64_t o = 0; o < d; ++o) {
          double s = b1[grp * d + o];
          for (int64_t i = 0; i < taps; ++i) {
            const int64_t src = ti - (taps - 1) + i;
            if (src < 0 && before.empty()) continue;
            for (int64_t ci = 0; ci < d; ++ci)
              s += w1[((grp * d + o) * d + ci) * taps + i] *
                   (src < 0 ? before[grp * d + ci] : y[(bi * t + src) * ch + grp * d + ci]);
          }
          z[(bi * t + ti) * ch + grp * d + o] = s;
        }
  return z;
}

// The adjoint of grouped_reference, for shapes too large for finite differences (dbefore:
// the gradient of `before`).
void grouped_backward_reference(Vec& dy, Vec& dw1, Vec& db1, Vec& dbefore, const Vec& dz,
                                const Vec& y, const Vec& w1, const Vec& before, int64_t b,
                                int64_t t, int64_t groups, int64_t d, int64_t taps) {
  const int64_t ch = groups * d;
  dbefore.resize(ch, 0.0);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti)
      for (int64_t grp = 0; grp < groups; ++grp)
        for (int64_t o = 0; o < d; ++o) {
          const double g = dz[(bi * t + ti) * ch + grp * d + o];
          db1[grp * d + o] += g;
          for (int64_t i = 0; i < taps; ++i) {
            const int64_t src = ti - (taps - 1) + i;
            for (int64_t ci = 0; ci < d; ++ci) {
              const int64_t wi = ((grp * d + o) * d + ci) * taps + i;
              if (src < 0) {
                if (!before.empty()) dw1[wi] += g * before[grp * d + ci];
                dbefore[grp * d + ci] += g * w1[wi];
                continue;
              }
              const int64_t yi = (bi * t + src) * ch + grp * d + ci;
              dw1[wi] += g * y[yi];
              dy[yi] += g * w1[wi];
            }
          }
        }
}

// The spec's CCA convolutions taken literally (§2 step 3): c padded once with (t0−1)+(t1−1)
// zero rows before each sequence, then the depthwise and the grouped convolution both
// unpadded ("valid") over it, as the released ZAYA1 code runs them: z [B, T, C].
Vec spec_convs_reference(const Vec& c, const Vec& w0, const Vec& b0, const Vec& w1, const Vec& b1,
                         int64_t b, int64_t t, int64_t groups, int64_t d, int64_t t0, int64_t t1) {
  const int64_t ch = groups * d, pad = (t0 - 1) + (t1 - 1), padded = t + pad;
  Vec z(b * t * ch);
  for (int64_t bi = 0; bi < b; ++bi) {
    // The padded sequence, then y over padded positions t1−1 … (length t + t1 − 1).
    Vec cp(padded * ch, 0.0);
    std::copy(c.begin() + bi * t * ch, c.begin() + (bi + 1) * t * ch, cp.begin() + pad * ch);
    const int64_t ylen = t + t1 - 1;
    Vec y(ylen * ch);
    for (int64_t r = 0; r < ylen; ++r)
      for (int64_t j = 0; j < ch; ++j) {
        double s = b0[j];
        for (int64_t i = 0; i < t0; ++i) s += w0[j * t0 + i] * cp[(r + i) * ch + j];
        y[r * ch + j] = s;
      }
    for (int64_t r = 0; r < t; ++r)
      for (int64_t grp = 0; grp < groups; ++grp)
        for (int64_t o = 0; o < d; ++o) {
          double s = b1[grp * d + o];
          for (int64_t i = 0; i < t1; ++i)
            for (int64_t ci = 0; ci < d; ++ci)
              s += w1[((grp * d + o) * d + ci) * t1 + i] * y[(r + i) * ch + grp * d + ci];
          z[(bi * t + r) * ch + grp * d + o] = s;
        }
  }
  return z;
}

Vec value_shift_reference(const Vec& vcur, const Vec& vprev_in, int64_t b, int64_t t,
                          int64_t half) {
  Vec v(b * t * 2 * half);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti)
      for (int64_t j = 0; j < half; ++j) {
        const int64_t row = bi * t + ti;
        v[row * 2 * half + j] = vcur[row * half + j];
        v[row * 2 * half + half + j] = ti > 0 ? vprev_in[(row - 1) * half + j] : 0.0;
      }
  return v;
}

void qk_norm_reference(Vec& q, Vec& k, const Vec& qk, const Vec& temp, int64_t n, int64_t hq,
                       int64_t hk, int64_t d, double eps) {
  const int64_t ch = (hq + hk) * d;
  q.assign(n * hq * d, 0.0);
  k.assign(n * hk * d, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < hq + hk; ++h) {
      double ss = 0;
      for (int64_t j = 0; j < d; ++j) ss += qk[r * ch + h * d + j] * qk[r * ch + h * d + j];
      const double norm = std::sqrt(ss + eps);
      for (int64_t j = 0; j < d; ++j) {
        const double x = qk[r * ch + h * d + j] * std::sqrt(double(d)) / norm;
        if (h < hq)
          q[(r * hq + h) * d + j] = x;
        else
          k[(r * hk + h - hq) * d + j] = x * temp[h - hq];
      }
    }
}

// ---- parameter counts ----------------------------------------------------------------------

TEST(CcaDims, Zaya1ConvolutionParametersMatchTheSpec) {
  const CcaDims dims{.hq = 8, .hk = 2, .d = 128, .t0 = 2, .t1 = 2};
  dims.validate();
  EXPECT_EQ(dims.channels(), 1280);
  EXPECT_EQ(dims.depthwise_weight_size(), 1280 * 2);
  EXPECT_EQ(dims.depthwise_bias_size(), 1280);
  EXPECT_EQ(dims.grouped_weight_size(), 1280 * 128 * 2);
  EXPECT_EQ(dims.grouped_bias_size(), 1280);
  EXPECT_EQ(dims.conv_parameter_count(), 332800);
  EXPECT_EQ(dims.temperature_size(), 2);
  EXPECT_EQ(dims.value_half(), 128);
  // The whole CCA sublayer with E = 2048: q, k, v1, v2, convolutions, o, temperature.
  const int64_t e = 2048;
  const int64_t total = e * dims.hq * dims.d + e * dims.hk * dims.d + 2 * e * dims.value_half() +
                        dims.conv_parameter_count() + dims.hq * dims.d * e +
                        dims.temperature_size();
  EXPECT_EQ(total, 5575682);
}

TEST(CcaDims, ValidateRejectsUnusableShapes) {
  EXPECT_THROW((CcaDims{.hq = 6, .hk = 4, .d = 8}.validate()), Error);  // 6 % 4 ≠ 0
  EXPECT_THROW((CcaDims{.hq = 3, .hk = 1, .d = 7}.validate()), Error);  // hk·d odd
  EXPECT_THROW((CcaDims{.hq = 2, .hk = 1, .d = 8, .t0 = 0}.validate()), Error);
  EXPECT_THROW((CcaDims{.hq = 0, .hk = 1, .d = 8}.validate()), Error);
  EXPECT_NO_THROW((CcaDims{.hq = 4, .hk = 2, .d = 6, .t0 = 3, .t1 = 1}.validate()));
}

// ---- means ---------------------------------------------------------------------------------

TEST(CcaMeans, ForwardAddsTheReferenceMeans) {
  const int64_t n = 5, hq = 6, hk = 2, d = 7, ch = (hq + hk) * d;
  const auto c = random_normal(n * ch, 1), prior = random_normal(n * ch, 2);
  const auto means = means_reference(c, n, hq, hk, d);
  auto qk = prior;
  cca_means_forward(qk.data(), c.data(), n, hq, hk, d);
  EXPECT_LT(max_relative_error(added(qk, prior), means), 1e-15);

  const auto c_f = cast_vector<float>(c);
  std::vector<float> qk_f(n * ch, 0.0f);
  cca_means_forward(qk_f.data(), c_f.data(), n, hq, hk, d);
  EXPECT_LT(max_relative_error(qk_f, means), 1e-6);
}

TEST(CcaMeans, BackwardMatchesFiniteDifferences) {
  const int64_t n = 4, hq = 4, hk = 2, d = 5, ch = (hq + hk) * d;
  auto c = random_normal(n * ch, 3);
  const auto dqk = random_normal(n * ch, 4), prior = random_normal(n * ch, 5);
  Vec qk(n * ch);
  auto loss = [&] {
    std::fill(qk.begin(), qk.end(), 0.0);
    cca_means_forward(qk.data(), c.data(), n, hq, hk, d);
    return dot(qk, dqk);
  };
  const auto numeric = numeric_gradient(c, loss);
  auto dc = prior;
  cca_means_backward(dc.data(), dqk.data(), n, hq, hk, d);
  EXPECT_LT(max_relative_error(added(dc, prior), numeric), 1e-9);
}

// ---- depthwise convolution -----------------------------------------------------------------

TEST(CcaDepthwiseConv, ForwardMatchesReferenceInFloatAndDouble) {
  for (int64_t taps : {1, 2, 3}) {
    const int64_t b = 2, t = 6, ch = 37;
    const auto c = random_normal(b * t * ch, 10 + taps), w0 = random_normal(ch * taps, 20),
               b0 = random_normal(ch, 30);
    const auto expected = depthwise_reference(c, w0, b0, b, t, ch, taps);
    Vec y(b * t * ch);
    cca_depthwise_conv_forward(y.data(), c.data(), w0.data(), b0.data(), b, t, ch, taps);
    EXPECT_LT(max_relative_error(y, expected), 1e-15) << "taps " << taps;

    const auto c_f = cast_vector<float>(c), w0_f = cast_vector<float>(w0),
               b0_f = cast_vector<float>(b0);
    std::vector<float> y_f(b * t * ch);
    cca_depthwise_conv_forward(y_f.data(), c_f.data(), w0_f.data(), b0_f.data(), b, t, ch, taps);
    EXPECT_LT(max_relative_error(y_f, expected), 1e-6) << "taps " << taps;
  }
}

TEST(CcaDepthwiseConv, BackwardMatchesFiniteDifferences) {
  for (int64_t taps : {2, 3}) {
    const int64_t b = 2, t = 5, ch = 40;  // 40 channels: a full 32-channel block and a tail
    auto c = random_normal(b * t * ch, 40), w0 = random_normal(ch * taps, 41),
         b0 = random_normal(ch, 42);
    const auto dy = random_normal(b * t * ch, 43);
    Vec y(b * t * ch);
    auto loss = [&] {
      cca_depthwise_conv_forward(y.data(), c.data(), w0.data(), b0.data(), b, t, ch, taps);
      return dot(y, dy);
    };
    const auto num_dc = numeric_gradient(c, loss), num_dw = numeric_gradient(w0, loss),
               num_db = numeric_gradient(b0, loss);
    const auto dc_prior = random_normal(b * t * ch, 44), dw_prior = random_normal(ch * taps, 45),
               db_prior = random_normal(ch, 46);
    auto dc = dc_prior, dw = dw_prior, db = db_prior;
    cca_depthwise_conv_backward(dc.data(), dw.data(), db.data(), dy.data(), c.data(), w0.data(), b,
                                t, ch, taps);
    EXPECT_LT(max_relative_error(added(dc, dc_prior), num_dc), 1e-8) << "taps " << taps;
    EXPECT_LT(max_relative_error(added(dw, dw_prior), num_dw), 1e-8) << "taps " << taps;
    EXPECT_LT(max_relative_error(added(db, db_prior), num_db), 1e-8) << "taps " << taps;
  }
}

// ---- grouped convolution -------------------------------------------------------------------

TEST(CcaGroupedConv, ForwardMatchesReferenceInFloatAndDouble) {
  // d covers a full register tile plus a tail (32 + 4 doubles, 64 + 8 floats); t = 7 covers
  // a 4-row tile plus single rows. Before position 0: zero, then a vector (b0 in the CCA).
  for (int64_t taps : {1, 2, 3})
    for (bool with_before : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "taps " << taps << " before " << with_before);
      const int64_t b = 2, t = 7, groups = 3;
      {
        const int64_t d = 36, ch = groups * d;
        const auto y = random_normal(b * t * ch, 50), w1 = random_normal(ch * d * taps, 51, 0.2),
                   b1 = random_normal(ch, 52);
        const Vec before = with_before ? random_normal(ch, 56) : Vec();
        const auto expected = grouped_reference(y, w1, b1, before, b, t, groups, d, taps);
        Vec z(b * t * ch);
        cca_grouped_conv_forward(z.data(), y.data(), w1.data(), b1.data(),
                                 with_before ? before.data() : nullptr, b, t, groups, d, taps);
        EXPECT_LT(max_relative_error(z, expected), 1e-14);
      }
      {
        const int64_t d = 72, ch = groups * d;
        const auto y = random_normal(b * t * ch, 53), w1 = random_normal(ch * d * taps, 54, 0.2),
                   b1 = random_normal(ch, 55);
        const Vec before = with_before ? random_normal(ch, 57) : Vec();
        const auto expected = grouped_reference(y, w1, b1, before, b, t, groups, d, taps);
        const auto y_f = cast_vector<float>(y), w1_f = cast_vector<float>(w1),
                   b1_f = cast_vector<float>(b1), before_f = cast_vector<float>(before);
        std::vector<float> z_f(b * t * ch);
        cca_grouped_conv_forward(z_f.data(), y_f.data(), w1_f.data(), b1_f.data(),
                                 with_before ? before_f.data() : nullptr, b, t, groups, d, taps);
        EXPECT_LT(max_relative_error(z_f, expected), 2e-6);
      }
    }
}

TEST(CcaGroupedConv, BackwardMatchesFiniteDifferences) {
  // d = 34: a 32-wide double tile plus a 2-wide tail; 34 outputs = two 16-output tasks and a
  // 2-output task (single-row tiles); t = 5 rows = a 4-row tile plus one row. Three taps: two
  // positions read before the sequence, one of them with two taps.
  for (int64_t taps : {2, 3}) {
    SCOPED_TRACE(::testing::Message() << "taps " << taps);
    const int64_t b = 2, t = 5, groups = 2, d = 34, ch = groups * d;
    auto y = random_normal(b * t * ch, 60), w1 = random_normal(ch * d * taps, 61, 0.2),
         b1 = random_normal(ch, 62), before = random_normal(ch, 67);
    const auto dz = random_normal(b * t * ch, 63);
    Vec z(b * t * ch);
    auto loss = [&] {
      cca_grouped_conv_forward(z.data(), y.data(), w1.data(), b1.data(), before.data(), b, t,
                               groups, d, taps);
      return dot(z, dz);
    };
    const auto num_dy = numeric_gradient(y, loss), num_dw = numeric_gradient(w1, loss),
               num_db = numeric_gradient(b1, loss), num_dbefore = numeric_gradient(before, loss);
    const auto dy_prior = random_normal(b * t * ch, 64),
               dw_prior = random_normal(ch * d * taps, 65), db_prior = random_normal(ch, 66),
               dbefore_prior = random_normal(ch, 68);
    auto dy = dy_prior, dw = dw_prior, db = db_prior, dbefore = dbefore_prior;
    cca_grouped_conv_backward(dy.data(), dw.data(), db.data(), dbefore.data(), dz.data(), y.data(),
                              w1.data(), before.data(), b, t, groups, d, taps);
    EXPECT_LT(max_relative_error(added(dy, dy_prior), num_dy), 1e-8);
    EXPECT_LT(max_relative_error(added(dw, dw_prior), num_dw), 1e-8);
    EXPECT_LT(max_relative_error(added(db, db_prior), num_db), 1e-8);
    EXPECT_LT(max_relative_error(added(dbefore, dbefore_prior), num_dbefore), 1e-8);
  }
}

TEST(CcaGroupedConv, LargeShapeOnTwoThreadsMatchesReference) {
  // Above the parallel thresholds; t = 150 spans several row tasks (64) and dw1 row blocks (128).
  WithThreads scope(2);
  const int64_t b = 2, t = 150, groups = 3, d = 40, taps = 3, ch = groups * d;
  const auto y = random_normal(b * t * ch, 70), w1 = random_normal(ch * d * taps, 71, 0.2),
             b1 = random_normal(ch, 72), dz = random_normal(b * t * ch, 73),
             before = random_normal(ch, 74);
  Vec z(b * t * ch);
  cca_grouped_conv_forward(z.data(), y.data(), w1.data(), b1.data(), before.data(), b, t, groups, d,
                           taps);
  EXPECT_LT(max_relative_error(z, grouped_reference(y, w1, b1, before, b, t, groups, d, taps)),
            1e-14);

  Vec dy(b * t * ch, 0.0), dw(ch * d * taps, 0.0), db(ch, 0.0), dbefore(ch, 0.0);
  Vec dy_ref = dy, dw_ref = dw, db_ref = db, dbefore_ref;
  cca_grouped_conv_backward(dy.data(), dw.data(), db.data(), dbefore.data(), dz.data(), y.data(),
                            w1.data(), before.data(), b, t, groups, d, taps);
  grouped_backward_reference(dy_ref, dw_ref, db_ref, dbefore_ref, dz, y, w1, before, b, t, groups,
                             d, taps);
  EXPECT_LT(max_relative_error(dy, dy_ref), 1e-13);
  EXPECT_LT(max_relative_error(dw, dw_ref), 1e-13);
  EXPECT_LT(max_relative_error(db, db_ref), 1e-13);
  EXPECT_LT(max_relative_error(dbefore, dbefore_ref), 1e-13);
}

// The oneDNN form against the double references: fp32 GEMMs to fp32 rounding, bf16 GEMMs to
// bf16 rounding of the inputs (8 significant bits, errors averaging over the d·t1 products).
// Shapes: one to three taps, sequences shorter than the window (t = 1, 2), ragged d.
TEST(CcaGroupedConv, GemmFormMatchesTheReferenceInFp32AndBf16) {
  struct Shape { int64_t b, t, groups, d, taps; };
  for (const Shape& sh : {Shape{2, 7, 3, 36, 2}, Shape{3, 1, 2, 8, 3}, Shape{2, 2, 2, 8, 3},
                          Shape{1, 33, 5, 24, 1}, Shape{4, 19, 2, 64, 2}}) {
    const auto [b, t, groups, d, taps] = sh;
    const int64_t ch = groups * d;
    SCOPED_TRACE(::testing::Message() << "b " << b << " t " << t << " groups " << groups << " d "
                                      << d << " taps " << taps);
    const auto y = random_normal(b * t * ch, 80), w1 = random_normal(ch * d * taps, 81, 0.2),
               b1 = random_normal(ch, 82), dz = random_normal(b * t * ch, 83),
               before = random_normal(ch, 87);
    const auto z_ref = grouped_reference(y, w1, b1, before, b, t, groups, d, taps);
    const auto z_plain_ref = grouped_reference(y, w1, Vec(ch, 0.0), Vec(), b, t, groups, d, taps);
    // dy is written (its stale contents ignored); dw1, db1 and dbefore accumulate.
    const auto dy_stale = random_normal(b * t * ch, 84),
               dw_prior = random_normal(ch * d * taps, 85), db_prior = random_normal(ch, 86),
               dbefore_prior = random_normal(ch, 88);
    Vec dy_ref(b * t * ch, 0.0), dw_ref = dw_prior, db_ref = db_prior, dbefore_ref;
    grouped_backward_reference(dy_ref, dw_ref, db_ref, dbefore_ref, dz, y, w1, before, b, t, groups,
                               d, taps);
    for (int64_t j = 0; j < ch; ++j) dbefore_ref[j] += dbefore_prior[j];
    const auto yf = cast_vector<float>(y), w1f = cast_vector<float>(w1),
               b1f = cast_vector<float>(b1), dzf = cast_vector<float>(dz),
               beforef = cast_vector<float>(before);
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(dtype_name(dtype));
      const double tol = dtype == DType::f32 ? 2e-6 : 1.5e-2;
      std::vector<float> z(b * t * ch);
      cca_grouped_conv_forward_gemm(z.data(), yf.data(), w1f.data(), b1f.data(), beforef.data(), b,
                                    t, groups, d, taps, dtype);
      EXPECT_LT(max_relative_error(z, z_ref), tol);
      // No bias, nothing before the sequence.
      std::vector<float> z_plain(b * t * ch, 7.0f);
      cca_grouped_conv_forward_gemm(z_plain.data(), yf.data(), w1f.data(), nullptr, nullptr, b, t,
                                    groups, d, taps, dtype);
      EXPECT_LT(max_relative_error(z_plain, z_plain_ref), tol);
      auto dy = cast_vector<float>(dy_stale), dw = cast_vector<float>(dw_prior),
           db = cast_vector<float>(db_prior), dbefore = cast_vector<float>(dbefore_prior);
      cca_grouped_conv_backward_gemm(dy.data(), dw.data(), db.data(), dbefore.data(), dzf.data(),
                                     yf.data(), w1f.data(), beforef.data(), b, t, groups, d, taps,
                                     dtype);
      EXPECT_LT(max_relative_error(dy, dy_ref), tol);
      EXPECT_LT(max_relative_error(dw, dw_ref), tol);
      EXPECT_LT(max_relative_error(db, db_ref), 2e-6);  // sums of dz: no GEMM
      // Sums of dz times fp32 w1: no GEMM either.
      EXPECT_LT(max_relative_error(dbefore, dbefore_ref), 2e-6);
    }
  }
}

// Foundry's two convolutions with the grouped one reading b0 before each sequence equal the
// spec's padding taken literally (the released code's), in double to rounding, for kernel
// sizes where the windows reach one, two and three positions back; the first positions read
// the padding only through b0, so b0 is far from zero here.
TEST(CcaConvolutions, ReadTheDepthwiseBiasBeforeASequenceAsTheSpecsPaddingDoes) {
  for (auto [t0, t1] : {std::pair<int64_t, int64_t>{2, 2}, {3, 2}, {2, 3}, {1, 3}, {3, 1}}) {
    SCOPED_TRACE(::testing::Message() << "t0 " << t0 << " t1 " << t1);
    const int64_t b = 2, t = 6, groups = 3, d = 8, ch = groups * d;
    const auto c = random_normal(b * t * ch, 90), w0 = random_normal(ch * t0, 91),
               b0 = random_normal(ch, 92, 3.0), w1 = random_normal(ch * d * t1, 93, 0.3),
               b1 = random_normal(ch, 94);
    Vec y(b * t * ch), z(b * t * ch);
    cca_depthwise_conv_forward(y.data(), c.data(), w0.data(), b0.data(), b, t, ch, t0);
    cca_grouped_conv_forward(z.data(), y.data(), w1.data(), b1.data(), b0.data(), b, t, groups, d,
                             t1);
    const Vec want = spec_convs_reference(c, w0, b0, w1, b1, b, t, groups, d, t0, t1);
    EXPECT_LT(max_relative_error(z, want), 1e-13);
    // Reading zero there instead (each convolution padded on its own) differs at the first
    // t1 − 1 positions of each sequence.
    if (t1 > 1) {
      Vec z_zero(b * t * ch);
      cca_grouped_conv_forward(z_zero.data(), y.data(), w1.data(), b1.data(),
                               static_cast<const double*>(nullptr), b, t, groups, d, t1);
      EXPECT_GT(max_relative_error(z_zero, want), 1e-3);
    }
  }
}

// ---- value shift ---------------------------------------------------------------------------

TEST(CcaValueShift, ForwardMatchesReferenceInBothForms) {
  const int64_t b = 3, t = 5, half = 6;
  const auto vcur = random_normal(b * t * half, 80), vprev_in = random_normal(b * t * half, 81);
  const auto expected = value_shift_reference(vcur, vprev_in, b, t, half);
  Vec v(b * t * 2 * half, -7.0);
  cca_value_shift_forward(v.data(), vcur.data(), vprev_in.data(), b, t, half);
  EXPECT_EQ(v, expected);

  // In place: v holds [vcur ‖ vprev_in] unshifted; last_out gets each sequence's last vprev_in.
  Vec v_inplace(b * t * 2 * half);
  for (int64_t row = 0; row < b * t; ++row)
    for (int64_t j = 0; j < half; ++j) {
      v_inplace[row * 2 * half + j] = vcur[row * half + j];
      v_inplace[row * 2 * half + half + j] = vprev_in[row * half + j];
    }
  Vec last(b * half);
  cca_value_shift_inplace_forward(v_inplace.data(), last.data(), b, t, half);
  EXPECT_EQ(v_inplace, expected);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t j = 0; j < half; ++j)
      EXPECT_EQ(last[bi * half + j], vprev_in[(bi * t + t - 1) * half + j]);

  // Head 0 (the first half with Hk = 2) is the current token, head 1 the previous one.
  EXPECT_EQ(v[(1 * t + 3) * 2 * half + 0], vcur[(1 * t + 3) * half + 0]);
  EXPECT_EQ(v[(1 * t + 3) * 2 * half + half], vprev_in[(1 * t + 2) * half + 0]);
}

TEST(CcaValueShift, BackwardMatchesFiniteDifferencesInBothForms) {
  const int64_t b = 2, t = 4, half = 3;
  auto vcur = random_normal(b * t * half, 82), vprev_in = random_normal(b * t * half, 83);
  const auto dv = random_normal(b * t * 2 * half, 84);
  Vec v(b * t * 2 * half);
  auto loss = [&] {
    cca_value_shift_forward(v.data(), vcur.data(), vprev_in.data(), b, t, half);
    return dot(v, dv);
  };
  const auto num_cur = numeric_gradient(vcur, loss), num_prev = numeric_gradient(vprev_in, loss);
  const auto cur_prior = random_normal(b * t * half, 85),
             prev_prior = random_normal(b * t * half, 86);
  auto dcur = cur_prior, dprev = prev_prior;
  cca_value_shift_backward(dcur.data(), dprev.data(), dv.data(), b, t, half);
  EXPECT_LT(max_relative_error(added(dcur, cur_prior), num_cur), 1e-9);
  EXPECT_LT(max_relative_error(added(dprev, prev_prior), num_prev), 1e-9);

  // In place: the input is the unshifted [vcur ‖ vprev_in] [B, T, 2·half].
  auto v_in = random_normal(b * t * 2 * half, 87);
  auto loss_inplace = [&] {
    Vec shifted = v_in;
    cca_value_shift_inplace_forward(shifted.data(), static_cast<double*>(nullptr), b, t, half);
    return dot(shifted, dv);
  };
  const auto num_in = numeric_gradient(v_in, loss_inplace);
  auto dv_inplace = dv;
  cca_value_shift_inplace_backward(dv_inplace.data(), b, t, half);
  EXPECT_LT(max_relative_error(dv_inplace, num_in), 1e-9);
}

// ---- QK-norm -------------------------------------------------------------------------------

TEST(CcaQkNorm, ForwardMatchesReferenceInFloatAndDouble) {
  const int64_t n = 6, hq = 4, hk = 2, d = 24, ch = (hq + hk) * d;
  const double eps = 1e-6;
  auto qk = random_normal(n * ch, 90, 1.5);
  for (int64_t j = 0; j < d; ++j) qk[2 * ch + hq * d + j] = 0.0;  // an all-zero key head
  const Vec temp{0.7, 1.6};
  Vec q_ref, k_ref;
  qk_norm_reference(q_ref, k_ref, qk, temp, n, hq, hk, d, eps);

  Vec q(n * hq * d), k(n * hk * d), rnorm(n * (hq + hk));
  cca_qk_norm_forward(q.data(), k.data(), rnorm.data(), qk.data(), temp.data(), n, hq, hk, d, eps);
  EXPECT_LT(max_relative_error(q, q_ref), 1e-14);
  EXPECT_LT(max_relative_error(k, k_ref), 1e-14);
  for (int64_t j = 0; j < d; ++j) EXPECT_EQ(k[(2 * hk + 0) * d + j], 0.0);
  // A query head's norm is √d·‖x‖/sqrt(‖x‖² + eps); a key head's that times temp.
  for (int64_t h : {int64_t{1}, hq + 1}) {
    double in_sq = 0, out_sq = 0;
    for (int64_t j = 0; j < d; ++j) {
      const double out = h < hq ? q[(3 * hq + h) * d + j] : k[(3 * hk + h - hq) * d + j];
      in_sq += qk[3 * ch + h * d + j] * qk[3 * ch + h * d + j];
      out_sq += out * out;
    }
    const double expected = std::sqrt(d * in_sq / (in_sq + eps)) * (h < hq ? 1.0 : temp[1]);
    EXPECT_NEAR(std::sqrt(out_sq), expected, 1e-13) << "head " << h;
  }

  const auto qk_f = cast_vector<float>(qk), temp_f = cast_vector<float>(temp);
  std::vector<float> q_f(n * hq * d), k_f(n * hk * d), rnorm_f(n * (hq + hk));
  cca_qk_norm_forward(q_f.data(), k_f.data(), rnorm_f.data(), qk_f.data(), temp_f.data(), n, hq, hk,
                      d, 1e-6f);
  EXPECT_LT(max_relative_error(q_f, q_ref), 1e-6);
  EXPECT_LT(max_relative_error(k_f, k_ref), 1e-6);
}

TEST(CcaQkNorm, BackwardMatchesFiniteDifferences) {
  const int64_t n = 37, hq = 4, hk = 2, d = 6, ch = (hq + hk) * d;  // 37 rows: two dtemp chunks
  const double eps = 1e-6;
  auto qk = random_normal(n * ch, 91);
  Vec temp{0.8, 1.3};
  const auto dq = random_normal(n * hq * d, 92), dk = random_normal(n * hk * d, 93);
  Vec q(n * hq * d), k(n * hk * d), rnorm(n * (hq + hk));
  auto loss = [&] {
    cca_qk_norm_forward(q.data(), k.data(), rnorm.data(), qk.data(), temp.data(), n, hq, hk, d,
                        eps);
    return dot(q, dq) + dot(k, dk);
  };
  const auto num_dqk = numeric_gradient(qk, loss), num_dtemp = numeric_gradient(temp, loss);
  loss();
  const auto dqk_prior = random_normal(n * ch, 94);
  const Vec dtemp_prior{0.25, -0.5};
  auto dqk = dqk_prior, dtemp = dtemp_prior;
  cca_qk_norm_backward(dqk.data(), dtemp.data(), dq.data(), dk.data(), qk.data(), rnorm.data(),
                       temp.data(), n, hq, hk, d);
  EXPECT_LT(max_relative_error(added(dqk, dqk_prior), num_dqk), 1e-7);
  EXPECT_LT(max_relative_error(added(dtemp, dtemp_prior), num_dtemp), 1e-7);
}

// The fused forms a step runs equal, value for value, the compositions they stand for (the
// pieces above are checked against references and finite differences).
TEST(CcaFused, MeansAndNormInOnePassEqualTheComposition) {
  const int64_t n = 45, hq = 4, hk = 2, d = 16, ch = (hq + hk) * d;  // 45 rows: two dtemp chunks
  const auto c = cast_vector<float>(random_normal(n * ch, 120));
  const auto z = cast_vector<float>(random_normal(n * ch, 121));
  const auto b1 = cast_vector<float>(random_normal(ch, 122));
  const std::vector<float> temp{0.9f, 1.4f};
  for (const bool bias : {false, true}) {
    std::vector<float> qk_ref = z;
    if (bias)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < ch; ++j) qk_ref[r * ch + j] += b1[j];
    std::vector<float> q_ref(n * hq * d), k_ref(n * hk * d), rn_ref(n * (hq + hk));
    cca_means_forward(qk_ref.data(), c.data(), n, hq, hk, d);
    cca_qk_norm_forward(q_ref.data(), k_ref.data(), rn_ref.data(), qk_ref.data(), temp.data(), n,
                        hq, hk, d, 1e-6f);
    std::vector<float> qk = z, q(q_ref.size()), k(k_ref.size()), rn(rn_ref.size());
    cca_means_qk_norm_forward(q.data(), k.data(), rn.data(), qk.data(), c.data(),
                              bias ? b1.data() : nullptr, temp.data(), n, hq, hk, d, 1e-6f);
    EXPECT_EQ(qk, qk_ref) << "bias " << bias;
    EXPECT_EQ(q, q_ref) << "bias " << bias;
    EXPECT_EQ(k, k_ref) << "bias " << bias;
    EXPECT_EQ(rn, rn_ref) << "bias " << bias;
  }

  const auto qk = cast_vector<float>(random_normal(n * ch, 123));
  const auto rnorm = cast_vector<float>(random_normal(n * (hq + hk), 124, 0.2));
  const auto dq = cast_vector<float>(random_normal(n * hq * d, 125));
  const auto dk = cast_vector<float>(random_normal(n * hk * d, 126));
  std::vector<float> dqk_ref(n * ch, 0.0f), dc_ref(n * ch, 0.0f), dtemp_ref{0.5f, -0.25f};
  cca_qk_norm_backward(dqk_ref.data(), dtemp_ref.data(), dq.data(), dk.data(), qk.data(),
                       rnorm.data(), temp.data(), n, hq, hk, d);
  cca_means_backward(dc_ref.data(), dqk_ref.data(), n, hq, hk, d);
  // Stale values in both outputs: the fused backward writes them.
  auto dqk = cast_vector<float>(random_normal(n * ch, 127));
  auto dc = cast_vector<float>(random_normal(n * ch, 128));
  std::vector<float> dtemp{0.5f, -0.25f};
  cca_qk_norm_means_backward(dqk.data(), dc.data(), dtemp.data(), dq.data(), dk.data(), qk.data(),
                             rnorm.data(), temp.data(), n, hq, hk, d);
  EXPECT_EQ(dqk, dqk_ref);
  EXPECT_EQ(dc, dc_ref);
  EXPECT_EQ(dtemp, dtemp_ref);
}

// The CPU's bf16 training form of the two convolutions (y straight into the grouped conv's
// stacked rows, kept for the backward in y's place) against the composition it replaces:
// the same bits, forward and backward, including the rows before each sequence's start.
TEST(CcaFused, ConvolutionsThroughTheStackedRowsEqualTheComposition) {
  EXPECT_TRUE(cca_convs_fused(2, DType::bf16));
  EXPECT_FALSE(cca_convs_fused(3, DType::bf16));  // the stacked rows would not fit y's room
  EXPECT_FALSE(cca_convs_fused(2, DType::f32));
  const int64_t b = 3, t = 7, groups = 3, d = 16, ch = groups * d, n = b * t;
  for (const int64_t t0 : {1, 2, 3})
    for (const int64_t t1 : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "t0 " << t0 << " t1 " << t1);
      const auto c = cast_vector<float>(random_normal(n * ch, 130));
      const auto w0 = cast_vector<float>(random_normal(ch * t0, 131));
      const auto b0 = cast_vector<float>(random_normal(ch, 132));
      const auto w1 = cast_vector<float>(random_normal(ch * d * t1, 133, 0.2));
      const auto dqk = cast_vector<float>(random_normal(n * ch, 134));
      const auto dc0 = cast_vector<float>(random_normal(n * ch, 135));  // the means' part

      std::vector<float> y(n * ch), qk_ref(n * ch), dy(n * ch), dc_ref = dc0;
      std::vector<float> dw0_ref(ch * t0, 0.5f), db0_ref(ch, 0.5f), dw1_ref(ch * d * t1, 0.5f),
          db1_ref(ch, 0.5f);
      cca_depthwise_conv_forward(y.data(), c.data(), w0.data(), b0.data(), b, t, ch, t0);
      cca_grouped_conv_forward_gemm(qk_ref.data(), y.data(), w1.data(), nullptr, b0.data(), b, t,
                                    groups, d, t1, DType::bf16);
      cca_grouped_conv_backward_gemm(dy.data(), dw1_ref.data(), db1_ref.data(), db0_ref.data(),
                                     dqk.data(), y.data(), w1.data(), b0.data(), b, t, groups, d,
                                     t1, DType::bf16);
      cca_depthwise_conv_backward(dc_ref.data(), dw0_ref.data(), db0_ref.data(), dy.data(),
                                  c.data(), w0.data(), b, t, ch, t0);

      // Stale values in the outputs and the scratch: the fused forms write them.
      auto kept = cast_vector<float>(random_normal(n * ch, 136));
      auto qk = cast_vector<float>(random_normal(n * ch, 137));
      auto dy_scratch = cast_vector<float>(random_normal(n * ch, 138));
      std::vector<float> dc = dc0, dw0(ch * t0, 0.5f), db0(ch, 0.5f), dw1(ch * d * t1, 0.5f),
                         db1(ch, 0.5f);
      cca_convs_forward_gemm(qk.data(), kept.data(), c.data(), w0.data(), b0.data(), w1.data(), b,
                             t, groups, d, t0, t1);
      expect_same_products(qk, qk_ref, "qk");

      // With the QK norm read from the products' output (two query heads, one key head).
      const int64_t hq = 2, hk = 1;
      const auto b1 = cast_vector<float>(random_normal(ch, 139));
      const std::vector<float> temp = {1.3f};
      std::vector<float> q_ref(n * hq * d), k_ref(n * hk * d), rnorm_ref(n * groups);
      auto normed_ref = qk_ref;
      cca_means_qk_norm_forward(q_ref.data(), k_ref.data(), rnorm_ref.data(), normed_ref.data(),
                                c.data(), b1.data(), temp.data(), n, hq, hk, d, 1e-6f);
      auto q = cast_vector<float>(random_normal(n * hq * d, 140)), k = q, rnorm = q;
      auto normed = cast_vector<float>(random_normal(n * ch, 141)), kept_too = normed;
      cca_convs_qk_norm_forward_gemm(q.data(), k.data(), rnorm.data(), normed.data(),
                                     kept_too.data(), c.data(), w0.data(), b0.data(), w1.data(),
                                     b1.data(), temp.data(), b, t, hq, hk, d, t0, t1, 1e-6f);
      q.resize(n * hq * d);
      k.resize(n * hk * d);
      rnorm.resize(n * groups);
      expect_same_products(q, q_ref, "q");
      expect_same_products(k, k_ref, "k");
      expect_same_products(rnorm, rnorm_ref, "rnorm");
      expect_same_products(normed, normed_ref, "normed");
      // The stacked bf16 rows, [G, N, t1·d], fill the front of the room.
      const size_t stacked = static_cast<size_t>(n * ch * t1) / 2;
      EXPECT_TRUE(std::equal(kept.begin(), kept.begin() + stacked, kept_too.begin()));
      cca_convs_backward_gemm(dc.data(), dw0.data(), db0.data(), dw1.data(), db1.data(),
                              dy_scratch.data(), dqk.data(), kept.data(), c.data(), w0.data(),
                              w1.data(), b, t, groups, d, t0, t1);
      expect_same_products(dc, dc_ref, "dc");
      expect_same_products(dw0, dw0_ref, "dw0");
      expect_same_products(db0, db0_ref, "db0");
      expect_same_products(dw1, dw1_ref, "dw1");
      expect_same_products(db1, db1_ref, "db1");
    }
}

// A training step's blocked forms (each sequence's positions in runs of kCcaRowsPerBlock, a
// task each) against the whole-batch compositions they replace, with sequences of several
// blocks, a short last block, and rows whose windows cross a block's edge: the same bits, and
// the same again on one thread. d = 24 leaves partial vectors of the means' and the norms'
// 16-lane loops.
TEST(CcaFused, BlockedStepEqualsTheWholeBatchComposition) {
  const int64_t hq = 4, hk = 2, groups = hq + hk, d = 24, ch = groups * d;
  for (const int64_t t : {int64_t{7}, detail::kCcaRowsPerBlock + 1, 2 * detail::kCcaRowsPerBlock})
    for (const int64_t t0 : {1, 2, 3})
      for (const int64_t t1 : {1, 2}) {
        SCOPED_TRACE(::testing::Message() << "t " << t << " t0 " << t0 << " t1 " << t1);
        const int64_t b = 2, n = b * t;
        const auto c = cast_vector<float>(random_normal(n * ch, 150));
        const auto w0 = cast_vector<float>(random_normal(ch * t0, 151));
        const auto b0 = cast_vector<float>(random_normal(ch, 152));
        const auto w1 = cast_vector<float>(random_normal(ch * d * t1, 153, 0.2));
        const auto b1 = cast_vector<float>(random_normal(ch, 154));
        const std::vector<float> temp = {1.3f, 0.8f};

        // Forward: the convolutions into qk, then the bias, the means and the norm.
        std::vector<float> kept_ref(n * ch), qk_ref(n * ch), q_ref(n * hq * d), k_ref(n * hk * d),
            rnorm_ref(n * groups);
        cca_convs_forward_gemm(qk_ref.data(), kept_ref.data(), c.data(), w0.data(), b0.data(),
                               w1.data(), b, t, groups, d, t0, t1);
        cca_means_qk_norm_forward(q_ref.data(), k_ref.data(), rnorm_ref.data(), qk_ref.data(),
                                  c.data(), b1.data(), temp.data(), n, hq, hk, d, 1e-6f);
        auto kept = cast_vector<float>(random_normal(n * ch, 155)), qk = kept, q = kept, k = kept,
             rnorm = kept;  // stale values: all written
        cca_convs_qk_norm_forward_gemm(q.data(), k.data(), rnorm.data(), qk.data(), kept.data(),
                                       c.data(), w0.data(), b0.data(), w1.data(), b1.data(),
                                       temp.data(), b, t, hq, hk, d, t0, t1, 1e-6f);
        expect_same_products(qk, qk_ref, "qk");
        expect_same_products(std::vector<float>(q.begin(), q.begin() + q_ref.size()), q_ref,
                             "q");
        expect_same_products(std::vector<float>(k.begin(), k.begin() + k_ref.size()), k_ref,
                             "k");
        expect_same_products(std::vector<float>(rnorm.begin(), rnorm.begin() + rnorm_ref.size()), rnorm_ref,
                             "rnorm");
        const size_t stacked = static_cast<size_t>(n * ch * t1) / 2;  // bf16 [G, N, t1·d]
        EXPECT_TRUE(std::equal(kept_ref.begin(), kept_ref.begin() + stacked, kept.begin()));

        // Backward from the attention's dq, dk.
        const auto dq = cast_vector<float>(random_normal(n * hq * d, 156));
        const auto dk = cast_vector<float>(random_normal(n * hk * d, 157));
        std::vector<float> dqk(n * ch), dc_ref(n * ch), dy(n * ch), dtemp_ref{0.5f, -0.25f};
        std::vector<float> dw0_ref(ch * t0, 0.5f), db0_ref(ch, 0.5f), dw1_ref(ch * d * t1, 0.5f),
            db1_ref(ch, 0.5f);
        cca_qk_norm_means_backward(dqk.data(), dc_ref.data(), dtemp_ref.data(), dq.data(),
                                   dk.data(), qk_ref.data(), rnorm_ref.data(), temp.data(), n, hq,
                                   hk, d);
        cca_convs_backward_gemm(dc_ref.data(), dw0_ref.data(), db0_ref.data(), dw1_ref.data(),
                                db1_ref.data(), dy.data(), dqk.data(), kept_ref.data(), c.data(),
                                w0.data(), w1.data(), b, t, groups, d, t0, t1);
        auto dc = cast_vector<float>(random_normal(n * ch, 158)), scratch = dc;  // written
        std::vector<float> dtemp{0.5f, -0.25f}, dw0(ch * t0, 0.5f), db0(ch, 0.5f),
            dw1(ch * d * t1, 0.5f), db1(ch, 0.5f);
        cca_qk_norm_convs_backward_gemm(dc.data(), dtemp.data(), dw0.data(), db0.data(), dw1.data(),
                                        db1.data(), scratch.data(), dq.data(), dk.data(), qk.data(),
                                        rnorm.data(), temp.data(), kept.data(), c.data(), w0.data(),
                                        w1.data(), b, t, hq, hk, d, t0, t1);
        expect_same_products(dc, dc_ref, "dc");
        expect_same_products(dtemp, dtemp_ref, "dtemp");
        expect_same_products(dw0, dw0_ref, "dw0");
        expect_same_products(db0, db0_ref, "db0");
        expect_same_products(dw1, dw1_ref, "dw1");
        expect_same_products(db1, db1_ref, "db1");

        // One thread: the blocks one after another, the same bits.
        const int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        auto q1 = q, k1 = k, rnorm1 = rnorm, qk1 = qk, kept1 = kept;
        cca_convs_qk_norm_forward_gemm(q1.data(), k1.data(), rnorm1.data(), qk1.data(),
                                       kept1.data(), c.data(), w0.data(), b0.data(), w1.data(),
                                       b1.data(), temp.data(), b, t, hq, hk, d, t0, t1, 1e-6f);
        auto dc1 = dc;
        std::vector<float> dtemp1{0.5f, -0.25f}, dw01(ch * t0, 0.5f), db01(ch, 0.5f),
            dw11(ch * d * t1, 0.5f), db11(ch, 0.5f);
        cca_qk_norm_convs_backward_gemm(dc1.data(), dtemp1.data(), dw01.data(), db01.data(),
                                        dw11.data(), db11.data(), scratch.data(), dq.data(),
                                        dk.data(), qk1.data(), rnorm1.data(), temp.data(),
                                        kept1.data(), c.data(), w0.data(), w1.data(), b, t, hq, hk,
                                        d, t0, t1);
        omp_set_num_threads(threads);
        EXPECT_EQ(q1, q);
        EXPECT_EQ(k1, k);
        EXPECT_EQ(rnorm1, rnorm);
        EXPECT_EQ(qk1, qk);
        EXPECT_EQ(kept1, kept);
        EXPECT_EQ(dc1, dc);
        EXPECT_EQ(dtemp1, dtemp);
        EXPECT_EQ(dw01, dw0);
        EXPECT_EQ(db01, db0);
        EXPECT_EQ(dw11, dw1);
        EXPECT_EQ(db11, db1);
      }
}

// ---- the composed pipeline: causality, batch isolation, decode -----------------------------

struct Pipeline {
  CcaDims dims;
  Vec w0, b0, w1, b1;
  Pipeline(const CcaDims& d, uint64_t seed) : dims(d) {
    w0 = random_normal(dims.depthwise_weight_size(), seed);
    b0 = random_normal(dims.depthwise_bias_size(), seed + 1);
    w1 = random_normal(dims.grouped_weight_size(), seed + 2, 0.3);
    b1 = random_normal(dims.grouped_bias_size(), seed + 3);
  }
  // The pre-norm [q ‖ k] [B, T, C] = grouped(depthwise(c)) + means(c); y [B, T, C] is kept.
  template <typename T>
  std::vector<T> run(const std::vector<T>& c, std::vector<T>& y, int64_t b, int64_t t) const {
    const int64_t ch = dims.channels();
    const auto w0t = cast_vector<T>(w0), b0t = cast_vector<T>(b0), w1t = cast_vector<T>(w1),
               b1t = cast_vector<T>(b1);
    y.assign(b * t * ch, T(0));
    std::vector<T> qk(b * t * ch);
    cca_depthwise_conv_forward(y.data(), c.data(), w0t.data(), b0t.data(), b, t, ch, dims.t0);
    cca_grouped_conv_forward(qk.data(), y.data(), w1t.data(), b1t.data(), b0t.data(), b, t,
                             dims.groups(), dims.d, dims.t1);
    cca_means_forward(qk.data(), c.data(), b * t, dims.hq, dims.hk, dims.d);
    return qk;
  }
};

TEST(CcaCausality, ConvAndMeansSeeOnlyTheLastThreeTokensOfTheirOwnSequence) {
  const CcaDims dims{.hq = 2, .hk = 1, .d = 8, .t0 = 2, .t1 = 2};
  const Pipeline p(dims, 100);
  const int64_t b = 2, t = 9, ch = dims.channels();
  const auto c = random_normal(b * t * ch, 104);
  Vec y;
  const auto base = p.run(c, y, b, t);
  for (int64_t s = 0; s < t; ++s) {
    auto c2 = c;
    for (int64_t j = 0; j < ch; ++j) c2[(0 * t + s) * ch + j] += 0.5 + 0.01 * j;
    const auto out = p.run(c2, y, b, t);
    for (int64_t ti = 0; ti < t; ++ti) {
      bool any_changed = false;
      for (int64_t j = 0; j < ch; ++j) {
        const int64_t i = (0 * t + ti) * ch + j;
        if (ti < s || ti > s + 2) {
          ASSERT_EQ(out[i], base[i]) << "token " << s << " pos " << ti;
        }
        any_changed |= out[i] != base[i];
      }
      if (ti >= s && ti <= s + 2) {
        EXPECT_TRUE(any_changed) << "token " << s << " pos " << ti;
      }
    }
    for (int64_t i = t * ch; i < 2 * t * ch; ++i) ASSERT_EQ(out[i], base[i]) << "other sequence";
  }
}

TEST(CcaCausality, ValueShiftSeesOnlyTheCurrentAndPreviousTokenOfItsOwnSequence) {
  const int64_t b = 2, t = 6, half = 4;
  const auto vcur = random_normal(b * t * half, 110), vprev_in = random_normal(b * t * half, 111);
  Vec base(b * t * 2 * half), out(b * t * 2 * half);
  cca_value_shift_forward(base.data(), vcur.data(), vprev_in.data(), b, t, half);
  for (int64_t s = 0; s < t; ++s) {
    auto cur2 = vcur, prev2 = vprev_in;
    for (int64_t j = 0; j < half; ++j) {
      cur2[(1 * t + s) * half + j] += 1.0;
      prev2[(1 * t + s) * half + j] += 1.0;
    }
    cca_value_shift_forward(out.data(), cur2.data(), prev2.data(), b, t, half);
    for (int64_t row = 0; row < b * t; ++row) {
      const int64_t bi = row / t, ti = row % t;
      for (int64_t j = 0; j < 2 * half; ++j) {
        const int64_t i = row * 2 * half + j;
        const bool may_change = bi == 1 && (j < half ? ti == s : ti == s + 1);
        if (may_change)
          EXPECT_NE(out[i], base[i]);
        else
          ASSERT_EQ(out[i], base[i]) << "token " << s << " row " << row << " col " << j;
      }
    }
  }
}

// Full-sequence forward vs prefill + one token at a time.
template <typename T>
void check_decode(const CcaDims& dims, int64_t prefill, double tolerance) {
  const Pipeline p(dims, 120);
  const int64_t b = 2, t = 10, ch = dims.channels(), half = dims.value_half();
  const auto c = cast_vector<T>(random_normal(b * t * ch, 125));
  const auto vproj = cast_vector<T>(random_normal(b * t * 2 * half, 126));  // [x·Wv1 ‖ x·Wv2]
  std::vector<T> y;
  const auto qk_full = p.run(c, y, b, t);
  auto v_full = vproj;
  cca_value_shift_inplace_forward(v_full.data(), static_cast<T*>(nullptr), b, t, half);

  const auto w0 = cast_vector<T>(p.w0), b0 = cast_vector<T>(p.b0), w1 = cast_vector<T>(p.w1),
             b1 = cast_vector<T>(p.b1);
  CcaDecodeState<T> state(dims, b);  // zero: reads b0 before the sequence, as p.run does
  if (prefill > 0) {
    // The prompt's forward: rows [0, prefill) of every sequence, packed [B, prefill, ·].
    std::vector<T> c_prompt(b * prefill * ch), v_prompt(b * prefill * 2 * half), y_prompt;
    for (int64_t bi = 0; bi < b; ++bi) {
      std::copy_n(c.begin() + bi * t * ch, prefill * ch, c_prompt.begin() + bi * prefill * ch);
      std::copy_n(vproj.begin() + bi * t * 2 * half, prefill * 2 * half,
                  v_prompt.begin() + bi * prefill * 2 * half);
    }
    p.run(c_prompt, y_prompt, b, prefill);
    std::vector<T> v_last(b * half);
    cca_value_shift_inplace_forward(v_prompt.data(), v_last.data(), b, prefill, half);
    cca_decode_state_load(state, c_prompt.data(), y_prompt.data(), b0.data(), v_last.data(),
                          prefill);
  }
  for (int64_t ti = prefill; ti < t; ++ti) {
    std::vector<T> c_new(b * ch), v_new(b * 2 * half), qk(b * ch);
    for (int64_t bi = 0; bi < b; ++bi) {
      std::copy_n(c.begin() + (bi * t + ti) * ch, ch, c_new.begin() + bi * ch);
      std::copy_n(vproj.begin() + (bi * t + ti) * 2 * half, 2 * half,
                  v_new.begin() + bi * 2 * half);
    }
    const std::vector<T*> states = state.rows();
    cca_conv_decode(qk.data(), dims, states.data(), b, c_new.data(), w0.data(), b0.data(),
                    w1.data(), b1.data());
    cca_means_forward(qk.data(), c_new.data(), b, dims.hq, dims.hk, dims.d);
    cca_value_shift_decode(v_new.data(), dims, states.data(), b);
    std::vector<double> expected_qk(b * ch), expected_v(b * 2 * half);
    for (int64_t bi = 0; bi < b; ++bi) {
      std::copy_n(qk_full.begin() + (bi * t + ti) * ch, ch, expected_qk.begin() + bi * ch);
      std::copy_n(v_full.begin() + (bi * t + ti) * 2 * half, 2 * half,
                  expected_v.begin() + bi * 2 * half);
    }
    EXPECT_LT(max_relative_error(qk, expected_qk), tolerance) << "position " << ti;
    EXPECT_EQ(cast_vector<double>(v_new), expected_v) << "position " << ti;
  }
}

TEST(CcaDecode, TokenByTokenReproducesTheFullSequence) {
  const CcaDims zaya_like{.hq = 4, .hk = 2, .d = 16, .t0 = 2, .t1 = 2};
  const CcaDims wide{.hq = 2, .hk = 1, .d = 36, .t0 = 3, .t1 = 2};  // tile + tail, longer window
  // Two positions before the sequence in the grouped window; prefill 1 leaves one of them.
  const CcaDims long_grouped{.hq = 2, .hk = 1, .d = 8, .t0 = 2, .t1 = 3};
  for (const auto& dims : {zaya_like, wide, long_grouped})
    for (int64_t prefill : {0, 1, 4}) {
      SCOPED_TRACE(::testing::Message() << "d " << dims.d << " t0 " << dims.t0 << " t1 " << dims.t1
                                        << " prefill " << prefill);
      check_decode<double>(dims, prefill, 1e-13);
      check_decode<float>(dims, prefill, 2e-6);
    }
}

// Rows that share a state are successive tokens of one sequence: one call with a sequence's
// three tokens as rows (beside another sequence's row) gives the bits of three calls.
TEST(CcaDecode, RowsSharingAStateContinueIt) {
  const CcaDims dims{.hq = 2, .hk = 2, .d = 4, .t0 = 3, .t1 = 3};
  const int64_t ch = dims.channels(), half = dims.value_half();
  const auto w0 = cast_vector<float>(random_normal(dims.depthwise_weight_size(), 1));
  const auto b0 = cast_vector<float>(random_normal(dims.depthwise_bias_size(), 2));
  const auto w1 = cast_vector<float>(random_normal(dims.grouped_weight_size(), 3));
  const auto b1 = cast_vector<float>(random_normal(dims.grouped_bias_size(), 4));
  const auto c = cast_vector<float>(random_normal(4 * ch, 5));
  const auto v = cast_vector<float>(random_normal(4 * 2 * half, 6));

  CcaDecodeState<float> one(dims, 1), other(dims, 1);  // one call: rows 0–2 one, row 3 other
  std::vector<float*> states = {one.sequence(0), one.sequence(0), one.sequence(0),
                                other.sequence(0)};
  std::vector<float> qk(4 * ch), vv = v;
  cca_conv_decode(qk.data(), dims, states.data(), 4, c.data(), w0.data(), b0.data(), w1.data(),
                  b1.data());
  cca_value_shift_decode(vv.data(), dims, states.data(), 4);

  CcaDecodeState<float> alone(dims, 1), other_alone(dims, 1);  // a call per token
  for (int64_t r = 0; r < 4; ++r) {
    float* st = r < 3 ? alone.sequence(0) : other_alone.sequence(0);
    std::vector<float> qk_r(ch), v_r(v.begin() + r * 2 * half, v.begin() + (r + 1) * 2 * half);
    cca_conv_decode(qk_r.data(), dims, &st, 1, c.data() + r * ch, w0.data(), b0.data(),
                    w1.data(), b1.data());
    cca_value_shift_decode(v_r.data(), dims, &st, 1);
    EXPECT_EQ(std::vector<float>(qk.begin() + r * ch, qk.begin() + (r + 1) * ch), qk_r) << r;
    EXPECT_EQ(std::vector<float>(vv.begin() + r * 2 * half, vv.begin() + (r + 1) * 2 * half), v_r)
        << r;
  }
  EXPECT_EQ(one.data, alone.data);
  EXPECT_EQ(other.data, other_alone.data);
  // The state moved: the second token's value half is the first token's.
  EXPECT_EQ(vv[2 * half + half], v[half]);
}

// ---- determinism ---------------------------------------------------------------------------

TEST(CcaDeterminism, ParameterGradientsAreBitwiseIdenticalForOneAndTwoThreads) {
  // Above every parallel threshold: tasks really split over two threads.
  const CcaDims dims{.hq = 2, .hk = 2, .d = 32, .t0 = 2, .t1 = 2};
  const int64_t b = 2, t = 150, n = b * t, ch = dims.channels(), groups = dims.groups();
  const auto c = random_normal<float>(n * ch, 130), y = random_normal<float>(n * ch, 131),
             dz = random_normal<float>(n * ch, 132), dy_in = random_normal<float>(n * ch, 133);
  const auto w0 = random_normal<float>(dims.depthwise_weight_size(), 134),
             w1 = random_normal<float>(dims.grouped_weight_size(), 135, 0.2),
             b1 = random_normal<float>(dims.grouped_bias_size(), 136),
             b0 = random_normal<float>(dims.depthwise_bias_size(), 140);
  const auto qk = random_normal<float>(n * ch, 137), dq = random_normal<float>(n * 2 * 32, 138),
             dk = random_normal<float>(n * 2 * 32, 139);
  const std::vector<float> temp{0.9f, 1.1f};

  struct Grads {
    std::vector<float> z, dw0, db0, dc, dw1, db1, dbefore, dy, dtemp, dqk;
  };
  auto run = [&](int threads) {
    WithThreads scope(threads);
    Grads g;
    g.z.assign(n * ch, 0.0f);
    cca_grouped_conv_forward(g.z.data(), y.data(), w1.data(), b1.data(), b0.data(), b, t, groups,
                             dims.d, dims.t1);
    g.dw0.assign(w0.size(), 0.0f);
    g.db0.assign(ch, 0.0f);
    g.dc.assign(n * ch, 0.0f);
    cca_depthwise_conv_backward(g.dc.data(), g.dw0.data(), g.db0.data(), dy_in.data(), c.data(),
                                w0.data(), b, t, ch, dims.t0);
    g.dw1.assign(w1.size(), 0.0f);
    g.db1.assign(ch, 0.0f);
    g.dbefore.assign(ch, 0.0f);
    g.dy.assign(n * ch, 0.0f);
    cca_grouped_conv_backward(g.dy.data(), g.dw1.data(), g.db1.data(), g.dbefore.data(), dz.data(),
                              y.data(), w1.data(), b0.data(), b, t, groups, dims.d, dims.t1);
    std::vector<float> q(n * 2 * 32), k(n * 2 * 32), rnorm(n * groups);
    cca_qk_norm_forward(q.data(), k.data(), rnorm.data(), qk.data(), temp.data(), n, dims.hq,
                        dims.hk, dims.d, 1e-6f);
    g.dtemp.assign(2, 0.0f);
    g.dqk.assign(n * ch, 0.0f);
    cca_qk_norm_backward(g.dqk.data(), g.dtemp.data(), dq.data(), dk.data(), qk.data(),
                         rnorm.data(), temp.data(), n, dims.hq, dims.hk, dims.d);
    return g;
  };
  const Grads one = run(1), two = run(2);
  EXPECT_EQ(one.z, two.z);
  EXPECT_EQ(one.dw0, two.dw0);
  EXPECT_EQ(one.db0, two.db0);
  EXPECT_EQ(one.dc, two.dc);
  EXPECT_EQ(one.dw1, two.dw1);
  EXPECT_EQ(one.db1, two.db1);
  EXPECT_EQ(one.dbefore, two.dbefore);
  EXPECT_EQ(one.dy, two.dy);
  EXPECT_EQ(one.dtemp, two.dtemp);
  EXPECT_EQ(one.dqk, two.dqk);
}

}  // namespace
}  // namespace foundry::ops
