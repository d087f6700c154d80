// Helpers shared by the kernel sources (not part of the kernel interface): an exp and a max
// that vectorize, a per-thread bf16 conversion, fixed-order column sums, and grow-only
// scratch buffers.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>

#include "base/aligned_memory.h"
#include "base/bf16.h"

namespace foundry::ops::detail {

// Below this many elements a loop runs on one thread: a parallel region costs a few
// microseconds, more than the work (the single-token decode path lives here).
constexpr int64_t kParallelMinElements = 16384;

// exp(x) in float without a libm call, so that `omp simd` loops around it vectorize.
// Cephes' polynomial on x = n·ln2 + r, |r| ≤ ln2/2; relative error below 2e-7.
// Returns exactly 0 below -87 (where exp underflows to denormals) and saturates above 88.
inline float exp_fast(float x) {
  const float xc = std::min(std::max(x, -87.0f), 88.0f);
  // Round xc·log2(e) to nearest by adding 1.5·2^23: the integer lands in the low mantissa bits.
  const float shifted = xc * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  const int32_t n_int = std::bit_cast<int32_t>(shifted) - 0x4B400000;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((n_int + 127) << 23);
  return x < -87.0f ? 0.0f : y * scale;
}
inline double exp_fast(double x) { return std::exp(x); }

// max(x[0..n)), -inf when n = 0. (Compilers do not vectorize a float max reduction on their
// own without relaxed NaN semantics.) With a NaN among x the result is unspecified (the
// vector paths and the scalar one skip it differently, and may return less than the largest
// other value); the callers' exp_fast(x − max) passes the NaN on to their sums.
inline float max_of(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#if defined(__AVX512F__)
  // The full-mask form: the unmasked intrinsic trips a false -Wmaybe-uninitialized in GCC 12.
  __m512 lanes = _mm512_set1_ps(m);
  for (; i + 16 <= n; i += 16)
    lanes = _mm512_mask_max_ps(lanes, 0xFFFF, lanes, _mm512_loadu_ps(x + i));
  alignas(64) float lane_values[16];
  _mm512_store_ps(lane_values, lanes);
  for (float lane : lane_values) m = std::max(m, lane);
#elif defined(__AVX__)
  // Two vectors of lanes, so that one max's latency overlaps the other's.
  __m256 a = _mm256_set1_ps(m), b = a;
  for (; i + 16 <= n; i += 16) {
    a = _mm256_max_ps(a, _mm256_loadu_ps(x + i));
    b = _mm256_max_ps(b, _mm256_loadu_ps(x + i + 8));
  }
  alignas(32) float lane_values[8];
  _mm256_store_ps(lane_values, _mm256_max_ps(a, b));
  for (float lane : lane_values) m = std::max(m, lane);
#endif
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}
inline double max_of(const double* x, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// p[0..n) = softmax(z[0..n)) for one row, with the max subtracted (serial; call it inside a
// loop over rows).
template <typename T>
inline void softmax_row(T* p, const T* z, int64_t n) {
  const T max_z = max_of(z, n);
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    p[j] = exp_fast(z[j] - max_z);
    sum += p[j];
  }
  const T inv_sum = T(1) / sum;
  for (int64_t j = 0; j < n; ++j) p[j] *= inv_sum;
}

// sums [W] += Σ_{rows} x[row, :] for x [N, W] (the bias gradients): tasks by blocks of 32
// columns; each sums its rows in a fixed order (blocks of 128 rows, then the blocks), so the
// result does not depend on the thread count.
template <typename T>
void add_column_sums(T* sums, const T* x, int64_t n, int64_t width) {
  constexpr int64_t kChannels = 32, kRows = 128;
  const int64_t blocks = (width + kChannels - 1) / kChannels;
#pragma omp parallel for schedule(static) if (n * width >= kParallelMinElements && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kChannels, cols = std::min(width - c0, kChannels);
    T total[kChannels] = {}, partial[kChannels];
    for (int64_t r0 = 0; r0 < n; r0 += kRows) {
      std::fill(partial, partial + cols, T(0));
      const int64_t r1 = std::min(n, r0 + kRows);
      for (int64_t r = r0; r < r1; ++r) {
        const T* row = x + r * width + c0;
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j) partial[j] += row[j];
      }
      for (int64_t j = 0; j < cols; ++j) total[j] += partial[j];
    }
    for (int64_t j = 0; j < cols; ++j) sums[c0 + j] += total[j];
  }
}

using ::foundry::to_bf16_serial;  // base/bf16.h

// A buffer that only grows: kernels keep one per purpose (thread_local) and reuse it across
// calls instead of allocating every step. Contents are unspecified after get().
template <typename T>
class ScratchBuffer {
 public:
  T* get(int64_t count) {
    if (count > capacity_) {
      const size_t bytes = (static_cast<size_t>(count) * sizeof(T) + 63) / 64 * 64;
      data_.reset(static_cast<T*>(allocate_aligned(64, bytes)));
      capacity_ = count;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(T* p) const { free_aligned(p); }
  };
  std::unique_ptr<T, Free> data_;
  int64_t capacity_ = 0;
};

}  // namespace foundry::ops::detail
