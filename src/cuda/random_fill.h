// Benchmark operands made on the GPU: a seeded stream of random multiples of 1/8 in [-1, 1]
// (exact in bf16 and fp32), and the same stream on the host for checking results.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define FOUNDRY_HOST_DEVICE __host__ __device__
#else
#define FOUNDRY_HOST_DEVICE
#endif

namespace foundry::gpu {

// Element i of stream `seed`: splitmix64's finalizer of (seed, i), reduced to 17 values.
FOUNDRY_HOST_DEVICE inline float eighth_at(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<int>(z % 17) - 8) / 8.0f;
}

// x[i] = eighth_at(seed, i) for i < n, as fp32 or (bf16) as bfloat16; queued on the default
// stream.
void fill_eighths(void* x, int64_t n, bool bf16, uint64_t seed);

}  // namespace foundry::gpu
