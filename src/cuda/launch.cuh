// What the elementwise kernels of src/cuda/*.cu share: the block size, a grid for a count of
// elements, the grid-stride loop, and the launch check.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/check.h"

namespace foundry::gpu {

inline constexpr int kBlockThreads = 256;

// Blocks of kBlockThreads for `elements` threads' worth of work: at least 1, at most the
// 2^20 that grid-stride loops need to fill any GPU.
inline int blocks_for(int64_t elements) {
  const int64_t blocks = (elements + kBlockThreads - 1) / kBlockThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 1048560 ? 1048560 : blocks));
}

inline void check_launch() { FOUNDRY_CUDA_CHECK(cudaGetLastError()); }

}  // namespace foundry::gpu

// for (i = this thread's first index; i < count; i += all threads of the grid)
#define FOUNDRY_FOR_EACH(i, count)                                                  \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (count); \
       i += int64_t{gridDim.x} * blockDim.x)
