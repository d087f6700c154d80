// Device functions several kernel files use: bf16 rounding as the CPU rounds, one row's
// softmax, a warp's and a block's sum and maximum, and W consecutive floats moved as one
// vector.
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

// Σ over a block of `threads` threads of `value` (every thread gets the sum), in a fixed tree;
// `shared` holds `threads` values.
template <int threads, typename T>
__device__ T block_sum(T value, T* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int width = threads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) shared[threadIdx.x] += shared[threadIdx.x + width];
    __syncthreads();
  }
  const T sum = shared[0];
  __syncthreads();
  return sum;
}

// Σ over the warp (all 32 lanes), every lane getting it, in a fixed butterfly.
__device__ inline float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The largest v over the warp, every lane getting it.
__device__ inline float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The largest `value` over a block of `threads` threads, as block_sum.
template <int threads>
__device__ float block_max(float value, float* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int width = threads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width)
      shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + width]);
    __syncthreads();
  }
  const float m = shared[0];
  __syncthreads();
  return m;
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

// W (1 or 4) consecutive floats. Elementwise kernels are written once over Lanes<W>: with
// W = 4 a thread moves 16 bytes per access (where the row length is a multiple of 4 and the
// rows are aligned), with W = 1 any shape; each lane gets the same formula either way.
template <int W>
struct Lanes {
  static_assert(W == 1 || W == 4);
  float v[W];
};

// p [W] as one access: p 16-byte aligned when W = 4.
template <int W>
__device__ inline Lanes<W> load_lanes(const float* p) {
  Lanes<W> l;
  if constexpr (W == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    l.v[0] = q.x, l.v[1] = q.y, l.v[2] = q.z, l.v[3] = q.w;
  } else {
    l.v[0] = *p;
  }
  return l;
}

template <int W>
__device__ inline void store_lanes(float* p, const Lanes<W>& l) {
  if constexpr (W == 4) *reinterpret_cast<float4*>(p) = make_float4(l.v[0], l.v[1], l.v[2], l.v[3]);
  else *p = l.v[0];
}

// p [W] = the lanes rounded by to_bf16, as one access: p 8-byte aligned when W = 4.
template <int W>
__device__ inline void store_lanes(uint16_t* p, const Lanes<W>& l) {
  if constexpr (W == 4) {
    auto pair = [](float lo, float hi) {  // little-endian: the lower address in the low half
      return static_cast<uint32_t>(to_bf16(lo)) | static_cast<uint32_t>(to_bf16(hi)) << 16;
    };
    *reinterpret_cast<uint2*>(p) = make_uint2(pair(l.v[0], l.v[1]), pair(l.v[2], l.v[3]));
  } else {
    *p = to_bf16(l.v[0]);
  }
}

}  // namespace foundry::gpu
