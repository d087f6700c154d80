// Dense products on the GPU through cuBLASLt, with the same contract as foundry::gemm
// (kernels/gemm.h) so that the two can be compared element by element: row-major storage,
// C[M,N] (+)= op(A)[M,K] · op(B)[K,N], A and B fp32 or bf16, C fp32, fp32 accumulation.
// fp32 inputs run in full fp32 (no TF32), as the CPU path does.
//
// The pointers are device memory; the product is queued on the default stream. Each shape's
// cuBLASLt descriptors and the algorithm its heuristic picks are made on first use and kept,
// so that a shape always runs the same algorithm (the same bits, run after run).
#pragma once
#include <cstdint>

#include "kernels/gemm.h"

namespace foundry::gpu {

// lda > 0: A's rows as stored are lda elements apart (≥ their length: k, or m when trans_a);
// ldc > 0: C's rows are ldc elements apart (≥ n), so that C may be a column block of a wider
// matrix.
void gemm(const void* a, bool trans_a, const void* b, bool trans_b, float* c, int64_t m,
          int64_t n, int64_t k, DType dtype, bool accumulate = false, int64_t lda = 0,
          int64_t ldc = 0);

}  // namespace foundry::gpu
