// What the elementwise kernels of src/cuda/*.cu share: the block size, a grid for a count of
// elements or for rows of elements, the grid-stride loops, the vector width a shape allows, and
// the launch check.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "cuda/check.h"

namespace foundry::gpu {

inline constexpr int kBlockThreads = 256;

// Blocks of kBlockThreads for `elements` threads' worth of work: at least 1, at most the
// 2^20 that grid-stride loops need to fill any GPU.
inline int blocks_for(int64_t elements) {
  const int64_t blocks = (elements + kBlockThreads - 1) / kBlockThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 1048560 ? 1048560 : blocks));
}

// rows_launch's grid for `rows` rows (of blocks) of `cols` items: blocks along x cover a row's
// items, and each of the gridDim.y block rows loops over rows. A row and a column then advance
// by additions, where a flat index needs a 64-bit division and remainder
// by the row length per element: tens of instructions that leave a memory-bound kernel
// compute-bound. At most blocks_for's 2^20 blocks in all, and gridDim.y within its 65535.
inline dim3 grid_for_rows(int64_t rows, int64_t cols) {
  const int x = blocks_for(cols);
  int64_t y = rows < 65535 ? rows : 65535;
  if (y > 1048560 / x) y = 1048560 / x;
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y < 1 ? 1 : y));
}

// Whether p (null counts) is a multiple of `bytes`: what a float4 (16) or four bf16 (8) needs.
inline bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// A launch for `rows` rows of `cols` items whose rows may be shorter than a block: blocks of
// kBlockThreads, blockDim.x a power of two from 32 up to kBlockThreads along a row
// (FOUNDRY_FOR_EACH_COL) and blockDim.y = kBlockThreads / blockDim.x rows at once
// (FOUNDRY_FOR_EACH_ROW), so that a head of 128 floats (32 float4s) still fills a block;
// rows of kBlockThreads items or more get grid_for_rows's launch.
struct RowsLaunch {
  dim3 grid, block;
};

inline RowsLaunch rows_launch(int64_t rows, int64_t cols) {
  unsigned x = 32;
  while (x < static_cast<unsigned>(kBlockThreads) && x < cols) x *= 2;
  const unsigned y = kBlockThreads / x;
  return {grid_for_rows((rows + y - 1) / y, cols), dim3(x, y)};
}

// 4 where rows of `c` floats at the pointers, `ld` floats apart, may go as float4 (Lanes<4>):
// c and ld multiples of 4 and every pointer 16-byte aligned; 1 otherwise.
inline int lanes_for(int64_t c, int64_t ld, std::initializer_list<const float*> pointers) {
  if (c % 4 != 0 || ld % 4 != 0) return 1;
  for (const float* p : pointers)
    if (!aligned(p, 16)) return 1;
  return 4;
}
// The same for dense rows (ld = c).
inline int lanes_for(int64_t c, std::initializer_list<const float*> pointers) {
  return lanes_for(c, c, pointers);
}

inline void check_launch() { FOUNDRY_CUDA_CHECK(cudaGetLastError()); }

// `wide_kernel` (W = 4 floats a thread) where `wide`, else `narrow_kernel` (W = 1), over `rows`
// rows of `cols` floats by rows_launch, then the launch check. Both are the same kernel template
// instantiated at 4 and 1, looping with FOUNDRY_FOR_EACH_ROW and FOUNDRY_FOR_EACH_COL over
// cols / W; `wide` comes from lanes_for (and any alignment the kernel's other outputs need).
template <typename Wide, typename Narrow, typename... Args>
void launch_rows(bool wide, int64_t rows, int64_t cols, Wide wide_kernel, Narrow narrow_kernel,
                 Args... args) {
  const RowsLaunch l = rows_launch(rows, wide ? cols / 4 : cols);
  if (wide) {
    wide_kernel<<<l.grid, l.block>>>(args...);
  } else {
    narrow_kernel<<<l.grid, l.block>>>(args...);
  }
  check_launch();
}

}  // namespace foundry::gpu

// for (i = this thread's first index; i < count; i += all threads of the grid)
#define FOUNDRY_FOR_EACH(i, count)                                              \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (count); \
       i += int64_t{gridDim.x} * blockDim.x)

// In a rows_launch: for (r = this thread's first row; r < rows; r += the rows the grid covers)
#define FOUNDRY_FOR_EACH_ROW(r, rows)                                          \
  for (int64_t r = blockIdx.y * int64_t{blockDim.y} + threadIdx.y; r < (rows); \
       r += int64_t{gridDim.y} * blockDim.y)

// In a rows_launch: for (j = this thread's first column; j < cols; j += the x threads)
#define FOUNDRY_FOR_EACH_COL(j, cols)                                          \
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < (cols); \
       j += int64_t{gridDim.x} * blockDim.x)
