#include <cuda_runtime.h>

#include "cuda/check.h"
#include "cuda/random_fill.h"

namespace foundry::gpu {

namespace {

__global__ void fill_eighths_kernel(void* x, int64_t n, bool bf16, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = eighth_at(seed, static_cast<uint64_t>(i));
    if (bf16)
      static_cast<uint16_t*>(x)[i] = static_cast<uint16_t>(__float_as_uint(v) >> 16);  // exact
    else
      static_cast<float*>(x)[i] = v;
  }
}

}  // namespace

void fill_eighths(void* x, int64_t n, bool bf16, uint64_t seed) {
  const int64_t blocks = (n + 255) / 256;
  fill_eighths_kernel<<<static_cast<int>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536), 256>>>(
      x, n, bf16, seed);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace foundry::gpu
