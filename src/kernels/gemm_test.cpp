#include "kernels/gemm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/bf16.h"
#include "base/error.h"
#include "base/rng.h"
#include "kernels/test_support.h"

namespace foundry {
namespace {

std::vector<float> random_vec(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

// C = op(A) op(B) in double, A stored m×k (k×m if ta), B stored k×n (n×k if tb).
std::vector<double> reference(const std::vector<float>& a, bool ta, const std::vector<float>& b,
                              bool tb, int64_t m, int64_t n, int64_t k) {
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        double av = ta ? a[p * m + i] : a[i * k + p];
        double bv = tb ? b[j * k + p] : b[p * n + j];
        s += av * bv;
      }
      c[i * n + j] = s;
    }
  return c;
}

class GemmTest : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

TEST_P(GemmTest, MatchesReferenceWithTransposesAndAccumulate) {
  auto [ta, tb, use_bf16] = GetParam();
  const int64_t m = 37, n = 29, k = 53;
  auto a = random_vec(m * k, 1), b = random_vec(k * n, 2);
  auto ref = reference(a, ta, b, tb, m, n, k);
  std::vector<float> c(m * n, 1.0f);
  DType dt = use_bf16 ? DType::bf16 : DType::f32;
  std::vector<bf16> ah(a.size()), bh(b.size());
  const void* ap = a.data();
  const void* bp = b.data();
  if (use_bf16) {
    convert_to_bf16(a.data(), ah.data(), a.size());
    convert_to_bf16(b.data(), bh.data(), b.size());
    ap = ah.data();
    bp = bh.data();
  }
  gemm(ap, ta, bp, tb, c.data(), m, n, k, dt, /*accumulate=*/true);
  // bf16 inputs carry 8 mantissa bits: relative input error 2^-9, so |error| ≲ sqrt(k)·2^-8.
  const double tol = use_bf16 ? 0.1 : 1e-4;
  for (int64_t i = 0; i < m * n; ++i) ASSERT_NEAR(c[i], ref[i] + 1.0, tol) << "at " << i;
  gemm(ap, ta, bp, tb, c.data(), m, n, k, dt, /*accumulate=*/false);
  for (int64_t i = 0; i < m * n; ++i) ASSERT_NEAR(c[i], ref[i], tol) << "at " << i;
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, GemmTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Bool()));

TEST(DType, ParsedFromEverySpellingOfConfigsFlagsAndProfiles) {
  for (const char* name : {"bf16", "bfloat16"}) EXPECT_EQ(parse_dtype(name), DType::bf16) << name;
  for (const char* name : {"fp32", "f32", "float32", "float"})
    EXPECT_EQ(parse_dtype(name), DType::f32) << name;
  for (const char* name : {"fp16", "", "BF16", "bf16 "})
    EXPECT_EQ(parse_dtype(name), std::nullopt) << name;
  EXPECT_EQ(parse_dtype(dtype_name(DType::bf16)), DType::bf16);
  EXPECT_EQ(parse_dtype(dtype_name(DType::f32)), DType::f32);
}

TEST(Gemm, BatchedBroadcastView) {
  // A [2, 3, M, K] times B [2, 1, K, N] broadcast over the second batch dim.
  const int64_t m = 5, n = 4, k = 6;
  auto a = random_vec(2 * 3 * m * k, 3), b = random_vec(2 * k * n, 4);
  std::vector<float> c(2 * 3 * m * n);
  MatView av{a.data(), DType::f32, {2, 3, m, k}, {3 * m * k, m * k, k, 1}};
  MatView bv{b.data(), DType::f32, {2, 1, k, n}, {k * n, k * n, n, 1}};
  OutView cv{c.data(), {2, 3, m, n}, {3 * m * n, m * n, n, 1}};
  matmul(av, bv, cv);
  for (int x = 0; x < 2; ++x)
    for (int y = 0; y < 3; ++y)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p)
            s += double(a[((x * 3 + y) * m + i) * k + p]) * b[(x * k + p) * n + j];
          ASSERT_NEAR(c[((x * 3 + y) * m + i) * n + j], s, 1e-4);
        }
}

TEST(Gemm, PrimitivesAreCachedPerShape) {
  auto a = random_vec(8 * 8, 5);
  std::vector<float> c(64);
  gemm(a.data(), false, a.data(), false, c.data(), 8, 8, 8, DType::f32);
  size_t before = matmul_cache_size();
  gemm(a.data(), false, a.data(), false, c.data(), 8, 8, 8, DType::f32);
  EXPECT_EQ(matmul_cache_size(), before);
  gemm(a.data(), false, a.data(), true, c.data(), 8, 8, 8, DType::f32);
  EXPECT_EQ(matmul_cache_size(), before + 1);
}

TEST(Gemm, RowCountsShareAPrimitiveUnlessTheRowsModeIsExact) {
  // Expert GEMMs see a different row count every step: in the runtime mode M (or K for weight
  // gradients) creates no primitive per value; exact-m creates one per M; exact-k pads K to a
  // multiple of 64 (1, 3, 17 and 64 rows share one primitive), exact both
  // (gemm_rows_mode()). Every row count is exact in each mode.
  const GemmRows mode = gemm_rows_mode();
  // exact-fixed: these calls are outside run_products, so M and K are both exact.
  const size_t per_count = mode == GemmRows::exact_m || mode == GemmRows::exact ? 1
                           : mode == GemmRows::exact_fixed                      ? 2
                                                                                : 0;
  const int64_t n = 24, k = 40;
  auto a = random_vec(64 * k, 6), b = random_vec(k * n, 7), dy = random_vec(64 * n, 8);
  std::vector<float> c(64 * n), dw(n * k);
  gemm(a.data(), false, b.data(), false, c.data(), 3, n, k, DType::f32);
  gemm(dy.data(), true, a.data(), false, dw.data(), n, k, 3, DType::f32);
  const size_t before = matmul_cache_size();
  for (int64_t rows : {1, 17, 64}) {
    gemm(a.data(), false, b.data(), false, c.data(), rows, n, k, DType::f32);
    auto ref = reference(a, false, b, false, rows, n, k);
    for (int64_t i = 0; i < rows * n; ++i) ASSERT_NEAR(c[i], ref[i], 1e-4);
    // dW [n, k] = dy^T [n, rows] · a [rows, k]
    gemm(dy.data(), true, a.data(), false, dw.data(), n, k, rows, DType::f32);
    auto ref_dw = reference(dy, true, a, false, n, k, rows);
    for (int64_t i = 0; i < n * k; ++i) ASSERT_NEAR(dw[i], ref_dw[i], 1e-4);
  }
  EXPECT_EQ(matmul_cache_size(), before + 3 * per_count) << gemm_rows_name(mode);
}

// exact-fixed: the products of run_products' tasks (the experts', whose rows change every
// step) share primitives across row counts as under exact-k; the same products outside make
// one per shape, with K unpadded. The results are right either way.
TEST(Gemm, ExactFixedKeepsTheTasksRowCountsRuntime) {
  const GemmRows restore = gemm_rows_mode();
  set_gemm_rows_mode(GemmRows::exact_fixed);
  const int64_t n = 24, k = 40;
  auto a = random_vec(70 * k, 11), b = random_vec(k * n, 12), dy = random_vec(70 * n, 13);
  std::vector<float> c(70 * n), dw(n * k);
  auto products = [&](int64_t rows) {
    gemm(a.data(), false, b.data(), false, c.data(), rows, n, k, DType::f32);
    auto ref = reference(a, false, b, false, rows, n, k);
    for (int64_t i = 0; i < rows * n; ++i) ASSERT_NEAR(c[i], ref[i], 1e-4) << rows;
    gemm(dy.data(), true, a.data(), false, dw.data(), n, k, rows, DType::f32);
    auto ref_dw = reference(dy, true, a, false, n, k, rows);
    for (int64_t i = 0; i < n * k; ++i) ASSERT_NEAR(dw[i], ref_dw[i], 1e-4) << rows;
  };
  const std::vector<int64_t> counts = {5, 29, 70};
  auto in_tasks = [&] {
    run_products({1}, [&](int64_t) {
      for (int64_t rows : counts) products(rows);
    });
  };
  in_tasks();  // the runtime-M primitive and the padded-K ones (64 and 128 rows)
  const size_t before = matmul_cache_size();
  in_tasks();
  run_products({1}, [&](int64_t) { products(3); });  // K pads to 64 again
  EXPECT_EQ(matmul_cache_size(), before);
  for (int64_t rows : counts) products(rows);  // outside: an exact M and K per count
  EXPECT_EQ(matmul_cache_size(), before + 2 * counts.size());
  for (int64_t rows : counts) products(rows);
  EXPECT_EQ(matmul_cache_size(), before + 2 * counts.size());
  set_gemm_rows_mode(restore);
}

// exact-fixed: a task's product x·Wᵀ with at least twice as many outputs as inputs (the
// experts' gate|up projection) runs its largest multiple of 64 rows through an exact-M
// primitive and the rest at runtime M: one primitive per multiple, one for every rest. The
// results are right, and the same bits whether the tasks run concurrently or one by one.
TEST(Gemm, ExactFixedRunsATasksWideProductsRowsInParts) {
  const GemmRows restore = gemm_rows_mode();
  set_gemm_rows_mode(GemmRows::exact_fixed);
  testing::WithThreads two(2);
  const int64_t k = 48, n = 2 * k;
  const std::vector<int64_t> rows = {70, 100, 64, 5};
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  const auto a = random_vec(total * k, 21), w = random_vec(n * k, 22);
  std::vector<bf16> a16(a.size()), w16(w.size());
  convert_to_bf16(a.data(), a16.data(), static_cast<int64_t>(a.size()));
  convert_to_bf16(w.data(), w16.data(), static_cast<int64_t>(w.size()));
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const char* ap = dt == DType::bf16 ? reinterpret_cast<const char*>(a16.data())
                                       : reinterpret_cast<const char*>(a.data());
    const void* wp = dt == DType::bf16 ? static_cast<const void*>(w16.data()) : w.data();
    // Each task's rows from the start of `a`, so that one reference serves them all.
    auto run = [&](const std::vector<int64_t>& costs) {
      std::vector<float> y(total * n, -1.0f);
      std::vector<int64_t> first(rows.size(), 0);
      for (size_t e = 1; e < rows.size(); ++e) first[e] = first[e - 1] + rows[e - 1];
      run_products(costs, [&](int64_t e) {
        gemm(ap, false, wp, true, y.data() + first[e] * n, rows[e], n, k, dt);
      });
      return y;
    };
    const std::vector<float> together = run({1, 1, 1, 1}), alone = run({100, 1, 1, 1});
    EXPECT_EQ(std::memcmp(together.data(), alone.data(), together.size() * sizeof(float)), 0);
    const auto ref = reference(a, false, w, true, 100, n, k);
    const double tol = dt == DType::bf16 ? 0.15 : 1e-3;
    int64_t first = 0;
    for (int64_t r : rows) {
      for (int64_t i = 0; i < r * n; ++i)
        ASSERT_NEAR(together[first * n + i], ref[i], tol) << r << " rows, element " << i;
      first += r;
    }
    // 70 and 100 rows share the exact 64-row part and the runtime rest: no new primitive.
    const size_t before = matmul_cache_size();
    run({1, 1, 1, 1});
    EXPECT_EQ(matmul_cache_size(), before);
    run_products({1}, [&](int64_t) {
      std::vector<float> y(128 * n);
      gemm(ap, false, wp, true, y.data(), 127, n, k, dt);  // 64 + 63
    });
    EXPECT_EQ(matmul_cache_size(), before);
    run_products({1}, [&](int64_t) {
      std::vector<float> y(128 * n);
      gemm(ap, false, wp, true, y.data(), 128, n, k, dt);  // a second multiple
      const auto ref128 = reference(a, false, w, true, 128, n, k);
      for (int64_t i = 0; i < 128 * n; ++i) ASSERT_NEAR(y[i], ref128[i], tol) << i;
    });
    // (Below AVX-512 bf16 products are fp32 ones: the fp32 pass made that primitive.)
    EXPECT_EQ(matmul_cache_size(), before + (dt == DType::f32 || native_bf16_products() ? 1 : 0));
    // Accumulating: both parts add to what C holds.
    run_products({1}, [&](int64_t) {
      std::vector<float> y(100 * n, 1.0f);
      gemm(ap, false, wp, true, y.data(), 100, n, k, dt, /*accumulate=*/true);
      for (int64_t i = 0; i < 100 * n; ++i) ASSERT_NEAR(y[i], ref[i] + 1.0, tol) << i;
    });
  }
  set_gemm_rows_mode(restore);
}

// Under RowInvariantGemms each row of a product is the same bits for every row count (what
// decoding needs): fp32 (the precision the decoding tests use; bf16 brgemm kernels differ
// between AVX-512 and AMX cores), shapes of a decode step's projections, a transposed weight
// (x·Wᵀ) as the model's linears use.
TEST(Gemm, RowInvariantProductsGiveEachRowTheBitsOfItsProductAlone) {
  const RowInvariantGemms row_invariant;
  const int64_t n = 96, k = 272;
  for (DType dt : {DType::f32}) {
    const auto a = random_vec(64 * k, 16), w = random_vec(n * k, 17);
    std::vector<bf16> a16(a.size()), w16(w.size());
    for (size_t i = 0; i < a.size(); ++i) a16[i] = float_to_bf16(a[i]);
    for (size_t i = 0; i < w.size(); ++i) w16[i] = float_to_bf16(w[i]);
    const void* A = dt == DType::bf16 ? static_cast<const void*>(a16.data()) : a.data();
    const void* W = dt == DType::bf16 ? static_cast<const void*>(w16.data()) : w.data();
    const size_t elem = dt == DType::bf16 ? 2 : 4;
    std::vector<float> alone(64 * n), together(64 * n);
    for (int64_t r = 0; r < 64; ++r)
      gemm(static_cast<const char*>(A) + r * k * elem, false, W, true, alone.data() + r * n, 1,
           n, k, dt);
    for (int64_t rows : {2, 3, 7, 16, 33, 64}) {
      gemm(A, false, W, true, together.data(), rows, n, k, dt);
      EXPECT_EQ(std::memcmp(together.data(), alone.data(), rows * n * sizeof(float)), 0)
          << rows << " rows, " << dtype_name(dt);
    }
  }
}

// Below AVX-512 (on any machine with DNNL_MAX_CPU_ISA=AVX2: ctest's kernels_below_avx512)
// oneDNN runs no bf16 products: a bf16 product is then the fp32 product of the widened
// operands, bit for bit, in every layout and when accumulating.
TEST(Gemm, Bf16BelowAvx512IsTheFp32ProductOfTheWidenedValues) {
  const char* isa = std::getenv("DNNL_MAX_CPU_ISA");
  if (isa && std::string(isa) == "AVX2") {
    EXPECT_FALSE(native_bf16_products());
  }
  if (native_bf16_products()) GTEST_SKIP() << "oneDNN runs bf16 products on this CPU";
  const int64_t m = 23, n = 19, k = 70;
  const auto a = random_vec(m * k, 30), b = random_vec(k * n, 31);
  std::vector<bf16> a16(a.size()), b16(b.size());
  std::vector<float> a_wide(a.size()), b_wide(b.size());
  for (size_t i = 0; i < a.size(); ++i) a_wide[i] = bf16_to_float(a16[i] = float_to_bf16(a[i]));
  for (size_t i = 0; i < b.size(); ++i) b_wide[i] = bf16_to_float(b16[i] = float_to_bf16(b[i]));
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool accumulate : {false, true}) {
        std::vector<float> half(m * n, 1.0f), wide(m * n, 1.0f);
        gemm(a16.data(), ta, b16.data(), tb, half.data(), m, n, k, DType::bf16, accumulate);
        gemm(a_wide.data(), ta, b_wide.data(), tb, wide.data(), m, n, k, DType::f32, accumulate);
        EXPECT_EQ(std::memcmp(half.data(), wide.data(), half.size() * sizeof(float)), 0)
            << "ta " << ta << " tb " << tb << " accumulate " << accumulate;
      }
}

// Products called from several threads at once (the experts' GEMMs) share the cached
// primitives; each runs on its calling thread alone, with its own scratchpad. The results are
// bitwise those of the same calls made one after another on every thread.
// In every rows mode (gemm_rows_mode(): runtime, exact M, K padded to a multiple of 64, both).
TEST(Gemm, ConcurrentCallsMatchSequentialCallsBitwise) {
  const GemmRows restore = gemm_rows_mode();
  for (GemmRows mode : {GemmRows::runtime, GemmRows::exact_m, GemmRows::exact_k, GemmRows::exact,
                        GemmRows::exact_fixed}) {
  SCOPED_TRACE(gemm_rows_name(mode));
  set_gemm_rows_mode(mode);
  const int64_t k = 96, n = 160;
  const std::vector<int64_t> rows = {37, 64, 1, 90, 53, 64};
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  const auto a = random_vec(total * k, 9), w = random_vec(rows.size() * n * k, 10);
  std::vector<bf16> a16(a.size()), w16(w.size());
  convert_to_bf16(a.data(), a16.data(), static_cast<int64_t>(a.size()));
  convert_to_bf16(w.data(), w16.data(), static_cast<int64_t>(w.size()));
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const size_t elem = dt == DType::bf16 ? 2 : 4;
    const char* ap = dt == DType::bf16 ? reinterpret_cast<const char*>(a16.data())
                                       : reinterpret_cast<const char*>(a.data());
    const char* wp = dt == DType::bf16 ? reinterpret_cast<const char*>(w16.data())
                                       : reinterpret_cast<const char*>(w.data());
    // Per expert e: y_e = a_e · W_eᵀ and the weight-gradient form dW_e = y_eᵀ[:, :k] · a_e.
    auto run = [&](bool concurrent) {
      std::vector<float> y(total * n), dw(rows.size() * k * k);
      std::vector<int64_t> first(rows.size(), 0);
      for (size_t e = 1; e < rows.size(); ++e) first[e] = first[e - 1] + rows[e - 1];
      auto one = [&](int64_t e) {
        gemm(ap + first[e] * k * elem, false, wp + e * n * k * elem, true, y.data() + first[e] * n,
             rows[e], n, k, dt);
        gemm(ap + first[e] * k * elem, true, ap + first[e] * k * elem, false,
             dw.data() + e * k * k, k, k, rows[e], dt);
      };
      const int64_t experts = static_cast<int64_t>(rows.size());
      if (concurrent) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(2)
        for (int64_t e = 0; e < experts; ++e) one(e);
      } else {
        for (int64_t e = 0; e < experts; ++e) one(e);
      }
      y.insert(y.end(), dw.begin(), dw.end());
      return y;
    };
    const auto sequential = run(false), concurrent = run(true);
    ASSERT_EQ(sequential.size(), concurrent.size());
    EXPECT_EQ(std::memcmp(sequential.data(), concurrent.data(), sequential.size() * sizeof(float)),
              0);
    // And right: the first expert's product against the double reference.
    const auto ref = reference(a, false, w, true, rows[0], n, k);
    const double tol = dt == DType::bf16 ? 0.15 : 1e-3;
    for (int64_t i = 0; i < rows[0] * n; ++i) ASSERT_NEAR(concurrent[i], ref[i], tol) << i;
    // And the first expert's weight-gradient form (37 rows: K padded in exact-k).
    const std::vector<float> a0(a.begin(), a.begin() + rows[0] * k);
    const auto ref_dw = reference(a0, true, a0, false, k, k, rows[0]);
    const float* dw0 = concurrent.data() + total * n;
    for (int64_t i = 0; i < k * k; ++i) ASSERT_NEAR(dw0[i], ref_dw[i], tol) << i;
  }
  }
  set_gemm_rows_mode(restore);
}

// run_products: every task once; concurrently only when the costs split evenly over the
// threads; a task's exception reaches the caller.
TEST(Gemm, RunProductsRunsConcurrentlyOnlyWhenTheWorkSplitsEvenly) {
  testing::WithThreads two(2);
  auto run = [](const std::vector<int64_t>& costs) {
    std::vector<int> calls(costs.size(), 0), in_parallel(costs.size(), 0);
    run_products(costs, [&](int64_t i) {
      ++calls[i];
      in_parallel[i] = omp_in_parallel();
    });
    for (int c : calls) EXPECT_EQ(c, 1);
    return in_parallel;
  };
  EXPECT_EQ(run({262, 198, 0, 247, 205, 219, 256, 222}), std::vector<int>(8, 1));
  EXPECT_EQ(run({900, 50, 50, 0}), std::vector<int>(4, 0));  // one expert holds most rows
  EXPECT_EQ(run({300}), std::vector<int>(1, 0));
  EXPECT_EQ(run({}), std::vector<int>());
  EXPECT_THROW(run_products({10, 10, 10, 10},
                            [](int64_t i) {
                              if (i == 2) fail("task 2 failed");
                            }),
               Error);
}

}  // namespace
}  // namespace foundry
