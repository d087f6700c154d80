#include <cuda_runtime.h>

#include <cmath>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/launch.cuh"
#include "cuda/lt_matmul.h"
#include "cuda/reductions.h"

namespace foundry::gpu::ops {

namespace {

constexpr int kThreads = kBlockThreads;
constexpr int kBlocksPerRange = 32;  // partial sums per range: a fixed layout

constexpr float kNsA = 3.4445f, kNsB = -4.7750f, kNsC = 2.0315f;

// partials [range][block]: each block's strided share of its range, reduced in a fixed tree.
__global__ void squares_partials_kernel(double* partials, const float* x, const AdamWRange* ranges) {
  __shared__ double shared[kThreads];
  const AdamWRange r = ranges[blockIdx.y];
  double sum = 0;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < r.size;
       j += int64_t{gridDim.x} * blockDim.x) {
    const double v = x[r.offset + j];
    sum += v * v;
  }
  shared[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) shared[threadIdx.x] += shared[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.y * int64_t{gridDim.x} + blockIdx.x] = shared[0];
}

__global__ void sum_in_order_kernel(double* out, const double* values, int64_t count) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double total = 0;
  for (int64_t i = 0; i < count; ++i) total += values[i];
  *out = total;
}

__global__ void clip_factor_kernel(float* factor, const double* sum_squares, double max_norm) {
  const double norm = sqrt(*sum_squares);
  *factor = (max_norm > 0 && isfinite(norm) && norm > max_norm) ? static_cast<float>(max_norm / norm)
                                                                 : 1.0f;
}

__global__ void scale_ranges_kernel(float* x, const AdamWRange* ranges, const float* factor) {
  const AdamWRange r = ranges[blockIdx.y];
  const float f = *factor;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < r.size;
       j += int64_t{gridDim.x} * blockDim.x)
    x[r.offset + j] *= f;
}

// y = x / (√(*squares) + 1e-7), the inverse norm rounded to float as on the CPU.
__global__ void normalize_kernel(float* y, const float* x, const double* squares, int64_t n) {
  const float inv_norm = static_cast<float>(1.0 / (sqrt(*squares) + 1e-7));
  FOUNDRY_FOR_EACH(i, n) y[i] = x[i] * inv_norm;
}

__global__ void to_bf16_kernel(uint16_t* out, const float* x, int64_t n) {
  FOUNDRY_FOR_EACH(i, n) out[i] = to_bf16(x[i]);
}

__global__ void combine_kernel(float* b, const float* a, int64_t n) {  // b = kNsB·a + kNsC·b
  FOUNDRY_FOR_EACH(i, n) b[i] = kNsB * a[i] + kNsC * b[i];
}

__global__ void scale_kernel(float* y, const float* x, float s, int64_t n) {
  FOUNDRY_FOR_EACH(i, n) y[i] = s * x[i];
}

// One range launch: kBlocksPerRange blocks per range, up to 65535 ranges per launch.
template <typename Launch>
void over_ranges(int64_t range_count, Launch launch) {
  for (int64_t first = 0; first < range_count; first += 65535) {
    const int64_t count = range_count - first < 65535 ? range_count - first : 65535;
    launch(first, dim3(kBlocksPerRange, static_cast<unsigned>(count)));
    FOUNDRY_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

void sum_of_squares(double* out, const float* x, const AdamWRange* ranges, int64_t range_count,
                    Workspace& workspace) {
  double* partials = static_cast<double*>(workspace.get(std::max<int64_t>(1, range_count) *
                                                        kBlocksPerRange * 8));
  over_ranges(range_count, [&](int64_t first, dim3 grid) {
    squares_partials_kernel<<<grid, kThreads>>>(partials + first * kBlocksPerRange, x,
                                                ranges + first);
  });
  sum_in_order_kernel<<<1, 1>>>(out, partials, range_count * kBlocksPerRange);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

void clip_factor(float* factor, const double* sum_squares, double max_norm) {
  clip_factor_kernel<<<1, 1>>>(factor, sum_squares, max_norm);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

void scale_ranges(float* x, const AdamWRange* ranges, int64_t range_count, const float* factor) {
  over_ranges(range_count, [&](int64_t first, dim3 grid) {
    scale_ranges_kernel<<<grid, kThreads>>>(x, ranges + first, factor);
  });
}

void newton_schulz(const float* g, float* out, int64_t rows, int64_t cols, int steps,
                   bool use_bf16, Workspace& workspace) {
  FOUNDRY_GPU_CHECK(rows > 0 && cols > 0 && steps >= 0);
  const int64_t n = rows * cols;
  const bool tall = rows > cols;
  const int64_t r = tall ? cols : rows;
  // Workspace: y [n], a [r·r], b [r·r], the norm's partials and total, bf16 copies.
  auto round_up = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t y_bytes = round_up(n * 4), ab_bytes = round_up(r * r * 4);
  const int64_t x16_bytes = use_bf16 ? round_up(n * 2) : 0, a16_bytes = use_bf16 ? round_up(r * r * 2) : 0;
  const int64_t partial_bytes = round_up(kBlocksPerRange * 8 + 8);
  char* base = static_cast<char*>(workspace.get(y_bytes + 2 * ab_bytes + x16_bytes +
                                                2 * a16_bytes + partial_bytes + 256));
  float* y = reinterpret_cast<float*>(base);
  float* a = reinterpret_cast<float*>(base + y_bytes);
  float* b = reinterpret_cast<float*>(base + y_bytes + ab_bytes);
  char* rest = base + y_bytes + 2 * ab_bytes;
  uint16_t* x16 = reinterpret_cast<uint16_t*>(rest);
  uint16_t* a16 = reinterpret_cast<uint16_t*>(rest + x16_bytes);
  uint16_t* b16 = reinterpret_cast<uint16_t*>(rest + x16_bytes + a16_bytes);
  double* partials = reinterpret_cast<double*>(rest + x16_bytes + 2 * a16_bytes);
  double* squares = partials + kBlocksPerRange;
  AdamWRange* whole = reinterpret_cast<AdamWRange*>(rest + x16_bytes + 2 * a16_bytes + partial_bytes);
  const AdamWRange range{0, n, 0};
  FOUNDRY_CUDA_CHECK(cudaMemcpy(whole, &range, sizeof range, cudaMemcpyHostToDevice));

  squares_partials_kernel<<<dim3(kBlocksPerRange, 1), kThreads>>>(partials, g, whole);
  sum_in_order_kernel<<<1, 1>>>(squares, partials, kBlocksPerRange);
  normalize_kernel<<<blocks_for(n), kThreads>>>(out, g, squares, n);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());

  float* x = out;
  float* next = y;
  for (int s = 0; s < steps; ++s) {
    const void* x_in = x;
    if (use_bf16) {
      to_bf16_kernel<<<blocks_for(n), kThreads>>>(x16, x, n);
      x_in = x16;
    }
    // A = X Xᵀ (wide) or Xᵀ X (tall).
    if (tall) detail::lt_matmul(x_in, true, x_in, false, a, r, r, rows, use_bf16, false, r, r);
    else detail::lt_matmul(x_in, false, x_in, true, a, r, r, cols, use_bf16, false, cols, r);
    const void* a_in = a;
    if (use_bf16) {
      to_bf16_kernel<<<blocks_for(r * r), kThreads>>>(a16, a, r * r);
      a_in = a16;
    }
    detail::lt_matmul(a_in, false, a_in, false, b, r, r, r, use_bf16, false, r, r);  // B = A·A
    combine_kernel<<<blocks_for(r * r), kThreads>>>(b, a, r * r);             // B = bA + cAA
    const void* b_in = b;
    if (use_bf16) {
      to_bf16_kernel<<<blocks_for(r * r), kThreads>>>(b16, b, r * r);
      b_in = b16;
    }
    scale_kernel<<<blocks_for(n), kThreads>>>(next, x, kNsA, n);  // Y = a X, then += B X
    if (tall) detail::lt_matmul(x_in, false, b_in, false, next, rows, cols, cols, use_bf16, true,
                                cols, cols);
    else detail::lt_matmul(b_in, false, x_in, false, next, rows, cols, rows, use_bf16, true,
                           rows, cols);
    FOUNDRY_CUDA_CHECK(cudaGetLastError());
    float* t = x;
    x = next;
    next = t;
  }
  if (x != out)
    FOUNDRY_CUDA_CHECK(cudaMemcpyAsync(out, x, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice));
}

}  // namespace foundry::gpu::ops
