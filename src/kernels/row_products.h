// Products whose rows are the same bits for any row count, by construction: each output
// element is a sum over the reduction dimension in one fixed order, whatever the number of
// rows beside it, the tile it falls in or the thread count. kernels/gemm.cpp routes
// RowInvariantGemms' products here on CPUs where oneDNN cannot promise that: below AVX-512,
// oneDNN 2.6 runs every fp32 product through its GEMM driver, whose summation order depends
// on M (one row takes a matrix-vector path; tails of 8 and 32 rows differ from whole
// blocks). On AVX-512 cores its exact-M (brgemm) kernels keep rows invariant and are used.
#pragma once
#include <cstdint>

#include "kernels/gemm.h"

namespace foundry::ops {

// Whether row_product handles these views: 2-D, A and B of one dtype (fp32, or bf16 widened
// as it is read). Any strides: the fast forms are A with unit column stride, C row-major, and
// B either W stored N × K (x·Wᵀ, the layers' products) or K × N row-major; other layouts are
// copied into those first.
bool row_product_handles(const MatView& a, const MatView& b, const OutView& c);

// C = A · B (C += A · B when `accumulate`) with every C element summed over k in a fixed
// order that depends on K alone: x·Wᵀ as 8 interleaved partial sums (k ≡ j mod 8) added in
// order, then the tail; K × N as one running sum in k order.
void row_product(const MatView& a, const MatView& b, const OutView& c, bool accumulate);

}  // namespace foundry::ops
