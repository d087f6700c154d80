#include "kernels/row_products.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "base/bf16.h"
#include "kernels/test_support.h"

namespace foundry::ops {
namespace {

std::vector<float> normals(int64_t n, uint64_t seed) {
  return testing::random_normal<float>(n, seed);
}

// One product's operands in both dtypes, B as W stored N × K (x·Wᵀ) or as K × N.
struct Operands {
  int64_t k, n;
  bool w_layout;
  std::vector<float> a, b;
  std::vector<bf16> a16, b16;
  Operands(int64_t rows, int64_t k_, int64_t n_, bool w, uint64_t seed)
      : k(k_), n(n_), w_layout(w), a(normals(rows * k_, seed)), b(normals(k_ * n_, seed + 1)) {
    for (float x : a) a16.push_back(float_to_bf16(x));
    for (float x : b) b16.push_back(float_to_bf16(x));
  }
  MatView rows(int64_t first, int64_t count, DType dt) const {
    const void* base = dt == DType::bf16 ? static_cast<const void*>(a16.data() + first * k)
                                         : static_cast<const void*>(a.data() + first * k);
    return MatView::rows_major(base, dt, count, k);
  }
  MatView right(DType dt) const {
    const void* base = dt == DType::bf16 ? static_cast<const void*>(b16.data())
                                         : static_cast<const void*>(b.data());
    return w_layout ? MatView::transposed(base, dt, k, n) : MatView::rows_major(base, dt, k, n);
  }
  // op(B)[kk, j] as the product reads it (bf16-rounded in bf16).
  double b_at(int64_t kk, int64_t j, DType dt) const {
    const int64_t i = w_layout ? j * k + kk : kk * n + j;
    return dt == DType::bf16 ? bf16_to_float(b16[i]) : b[i];
  }
  double a_at(int64_t r, int64_t kk, DType dt) const {
    return dt == DType::bf16 ? bf16_to_float(a16[r * k + kk]) : a[r * k + kk];
  }
};

// Every row of a product over 1 … 70 rows is the bits of that row alone, in both layouts and
// dtypes, with K and N that leave tails of every tile (K mod 8, odd N, N mod 16), and near
// the double-precision product; accumulating adds the same bits to what C holds.
TEST(RowProducts, EveryRowIsTheBitsOfItsRowAloneAndNearTheExactProduct) {
  const int64_t total = 70;
  for (bool w_layout : {true, false})
    for (DType dt : {DType::f32, DType::bf16})
      for (auto [k, n] : {std::pair<int64_t, int64_t>{37, 3}, {64, 17}, {300, 40}, {64, 8}, {5, 1}}) {
        SCOPED_TRACE(::testing::Message() << (w_layout ? "x·Wᵀ" : "K × N") << ", "
                                          << dtype_name(dt) << ", K " << k << ", N " << n);
        const Operands op(total, k, n, w_layout, 40 + k + n);
        std::vector<float> alone(total * n);
        for (int64_t r = 0; r < total; ++r)
          row_product(op.rows(r, 1, dt), op.right(dt),
                      OutView::rows_major(alone.data() + r * n, 1, n), false);
        for (int64_t r = 0; r < total; ++r)
          for (int64_t j = 0; j < n; ++j) {
            double exact = 0;
            for (int64_t kk = 0; kk < k; ++kk) exact += op.a_at(r, kk, dt) * op.b_at(kk, j, dt);
            ASSERT_NEAR(alone[r * n + j], exact, 1e-5 * (1 + std::abs(exact)) * std::sqrt(k));
          }
        for (int64_t first : {0, 3})
          for (int64_t count : {2, 5, 8, 33, 67}) {
            std::vector<float> together(count * n);
            row_product(op.rows(first, count, dt), op.right(dt),
                        OutView::rows_major(together.data(), count, n), false);
            ASSERT_EQ(std::memcmp(together.data(), alone.data() + first * n,
                                  together.size() * sizeof(float)),
                      0)
                << count << " rows from row " << first;
          }
        std::vector<float> c(total * n, 0.5f), expected(total * n);
        for (size_t i = 0; i < c.size(); ++i) expected[i] = 0.5f + alone[i];
        row_product(op.rows(0, total, dt), op.right(dt), OutView::rows_major(c.data(), total, n),
                    true);
        EXPECT_EQ(std::memcmp(c.data(), expected.data(), c.size() * sizeof(float)), 0);
      }
}

// Views of any strides give the bits of the same product over dense copies: A's rows with a
// stride wider than K and A stored transposed; B with a column stride (neither of the two fast
// layouts); C with room between rows and with a column stride, accumulating.
TEST(RowProducts, AnyStridesGiveTheBitsOfDenseCopies) {
  const int64_t m = 6, k = 20, n = 9, lda = 31, ldc = 13;
  const auto a = normals(m * lda, 7), w = normals(n * k, 8), b = normals(k * 2 * n, 9);
  std::vector<float> a_dense(m * k), a_t(k * m), b_dense(k * n);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < k; ++i) a_dense[r * k + i] = a_t[i * m + r] = a[r * lda + i];
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < n; ++j) b_dense[i * n + j] = b[i * 2 * n + 2 * j];
  const MatView w_view = MatView::transposed(w.data(), DType::f32, k, n);
  std::vector<float> want(m * n), want_b(m * n);
  row_product(MatView::rows_major(a_dense.data(), DType::f32, m, k), w_view,
              OutView::rows_major(want.data(), m, n), false);
  row_product(MatView::rows_major(a_dense.data(), DType::f32, m, k),
              MatView::rows_major(b_dense.data(), DType::f32, k, n),
              OutView::rows_major(want_b.data(), m, n), false);

  std::vector<float> c(m * ldc, NAN);
  row_product(MatView::rows_major(a.data(), DType::f32, m, k, lda), w_view,
              OutView::rows_major(c.data(), m, n, ldc), false);
  for (int64_t r = 0; r < m; ++r) {
    EXPECT_EQ(std::memcmp(&c[r * ldc], &want[r * n], n * sizeof(float)), 0) << r;
    for (int64_t j = n; j < ldc && r + 1 < m; ++j) EXPECT_TRUE(std::isnan(c[r * ldc + j]));
  }
  std::vector<float> got(m * n);
  row_product(MatView::transposed(a_t.data(), DType::f32, m, k), w_view,
              OutView::rows_major(got.data(), m, n), false);
  EXPECT_EQ(got, want);
  row_product(MatView::rows_major(a_dense.data(), DType::f32, m, k),
              MatView{b.data(), DType::f32, {k, n}, {2 * n, 2}},
              OutView::rows_major(got.data(), m, n), false);
  EXPECT_EQ(got, want_b);
  std::vector<float> c2(m * n * 2, 1.0f);  // C's columns every other float, accumulating
  row_product(MatView::rows_major(a_dense.data(), DType::f32, m, k), w_view,
              OutView{c2.data(), {m, n}, {2 * n, 2}}, true);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      EXPECT_EQ(c2[r * 2 * n + 2 * j], 1.0f + want[r * n + j]);
      EXPECT_EQ(c2[r * 2 * n + 2 * j + 1], 1.0f);
    }
}

}  // namespace
}  // namespace foundry::ops
