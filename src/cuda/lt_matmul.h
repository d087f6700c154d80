// gpu::gemm (blas.h) without foundry's types, so that blas.cu needs no host-only headers.
#pragma once
#include <cstdint>

namespace foundry::gpu::detail {

// lda: A's row stride as stored (k, or m when trans_a, for a dense A); ldc: C's (n if dense).
void lt_matmul(const void* a, bool trans_a, const void* b, bool trans_b, float* c, int64_t m,
               int64_t n, int64_t k, bool bf16_inputs, bool accumulate, int64_t lda,
               int64_t ldc);

}  // namespace foundry::gpu::detail
