// Which shape's cuBLASLt algorithm an exact GEMM shape runs with (blas.cu). The heuristic
// (cublasLtMatmulAlgoGetHeuristic) costs tens of microseconds of host time a call, and the
// experts' products change their row counts every step, hundreds of new shapes a step: asked
// once per representative, it leaves the host time to launch. A representative is a function
// of the shape alone, so a run and its resumed continuation pick the same algorithms.
// Host-only C++17 (nvcc compiles blas.cu so), tested without a GPU.
#pragma once
#include <algorithm>
#include <cstdint>

namespace foundry::gpu {

// Row-major C [m, n] = op(A) [m, k] · op(B) [k, n]; lda and ldc: A's and C's row strides as
// stored (A is m × k, or k × m when trans_a).
struct GemmShape {
  int64_t m, n, k;
  bool trans_a, trans_b;
  int64_t lda, ldc;
};

inline bool operator==(const GemmShape& a, const GemmShape& b) {
  return a.m == b.m && a.n == b.n && a.k == b.k && a.trans_a == b.trans_a &&
         a.trans_b == b.trans_b && a.lda == b.lda && a.ldc == b.ldc;
}

// A dimension rounded up to the size whose algorithm serves it: itself up to 64, then powers of
// two to 256, multiples of 256 to 8192, multiples of 1024 beyond.
inline int64_t gemm_bucket(int64_t x) {
  if (x <= 64) return x;
  if (x <= 256) {
    int64_t p = 128;
    while (p < x) p *= 2;
    return p;
  }
  if (x <= 8192) return (x + 255) / 256 * 256;
  return (x + 1023) / 1024 * 1024;
}

// Every dimension bucketed; a dense A or C stays dense, a padded one keeps its stride where the
// bucketed row still fits in it.
inline GemmShape representative(const GemmShape& s) {
  GemmShape r = s;
  r.m = gemm_bucket(s.m);
  r.n = gemm_bucket(s.n);
  r.k = gemm_bucket(s.k);
  const int64_t a_row = s.trans_a ? s.m : s.k, a_row_r = s.trans_a ? r.m : r.k;
  r.lda = s.lda == a_row ? a_row_r : std::max(s.lda, a_row_r);
  r.ldc = s.ldc == s.n ? r.n : std::max(s.ldc, r.n);
  return r;
}

}  // namespace foundry::gpu
