// The backend's small elementwise operations on the GPU (ops.h, "fills and conversions").
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/device_math.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"

namespace foundry::gpu::ops {
namespace {

template <typename T>
__global__ void fill_kernel(T* x, int64_t n, T value) {
  FOUNDRY_FOR_EACH(i, n) x[i] = value;
}

__global__ void bf16_kernel(uint16_t* out, const float* x, int64_t n) {
  FOUNDRY_FOR_EACH(i, n) out[i] = to_bf16(x[i]);
}

__global__ void fractions_kernel(double* fractions, const int64_t* counts, int64_t e,
                                 int64_t total) {
  FOUNDRY_FOR_EACH(j, e)
  fractions[j] = static_cast<double>(counts[j]) / static_cast<double>(total);
}

// By rows (rows_launch): a column index without a 64-bit remainder per element.
__global__ void scale_shift_kernel(float* out, const float* x, const float* alpha,
                                   const float* beta, int64_t n, int64_t c) {
  FOUNDRY_FOR_EACH_ROW(i, n) {
    FOUNDRY_FOR_EACH_COL(j, c) out[i * c + j] = (x[i * c + j] + beta[j]) * alpha[j];
  }
}

}  // namespace

void fill(float* x, int64_t n, float value) {
  if (n == 0) return;
  fill_kernel<float><<<blocks_for(n), kBlockThreads>>>(x, n, value);
  check_launch();
}

void fill(int32_t* x, int64_t n, int32_t value) {
  if (n == 0) return;
  fill_kernel<int32_t><<<blocks_for(n), kBlockThreads>>>(x, n, value);
  check_launch();
}

void convert_to_bf16(uint16_t* out, const float* x, int64_t n) {
  if (n == 0) return;
  bf16_kernel<<<blocks_for(n), kBlockThreads>>>(out, x, n);
  check_launch();
}

void fractions_of_counts(double* fractions, const int64_t* counts, int64_t e, int64_t total) {
  if (e == 0) return;
  fractions_kernel<<<blocks_for(e), kBlockThreads>>>(fractions, counts, e, total);
  check_launch();
}

void scale_shift_forward(float* out, const float* x, const float* alpha, const float* beta,
                         int64_t n, int64_t c) {
  if (n * c == 0) return;
  const RowsLaunch l = rows_launch(n, c);
  scale_shift_kernel<<<l.grid, l.block>>>(out, x, alpha, beta, n, c);
  check_launch();
}

}  // namespace foundry::gpu::ops
