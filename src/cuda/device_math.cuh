// Device functions several kernel files use: bf16 rounding as the CPU rounds, and one row's
// softmax.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace foundry::gpu {

// float_to_bf16 (base/bf16.h) on the device: round to nearest even, a NaN stays a quiet NaN.
__device__ inline uint16_t to_bf16(float f) {
  uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// p [n] = softmax(z [n]) in fp32, by one thread, in index order.
__device__ inline void softmax_row(float* p, const float* z, int64_t n) {
  float max_z = -INFINITY;
  for (int64_t j = 0; j < n; ++j) max_z = fmaxf(max_z, z[j]);
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = expf(z[j] - max_z);
    sum += p[j];
  }
  const float inv_sum = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) p[j] *= inv_sum;
}

}  // namespace foundry::gpu
