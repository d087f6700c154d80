#include "cuda/blas.h"

#include "base/error.h"
#include "cuda/lt_matmul.h"

namespace foundry::gpu {

void gemm(const void* a, bool trans_a, const void* b, bool trans_b, float* c, int64_t m,
          int64_t n, int64_t k, DType dtype, bool accumulate, int64_t lda, int64_t ldc) {
  FOUNDRY_CHECK(m > 0 && n > 0 && k > 0);
  const int64_t row = trans_a ? m : k;  // A's row length as stored
  FOUNDRY_CHECK(lda == 0 || lda >= row);
  FOUNDRY_CHECK(ldc == 0 || ldc >= n);
  detail::lt_matmul(a, trans_a, b, trans_b, c, m, n, k, dtype == DType::bf16, accumulate,
                    lda == 0 ? row : lda, ldc == 0 ? n : ldc);
}

}  // namespace foundry::gpu
