#include <algorithm>
#include <cmath>

#include "kernels/kernel_support.h"
#include "kernels/ops.h"

namespace foundry::ops {

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* in, const T* weight, int64_t n, int64_t c,
                     T eps) {
#pragma omp parallel for schedule(static) if (n * c >= detail::kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    const T* x = in + i * c;
    T* y = out + i * c;
    T sum_sq = 0;
#pragma omp simd reduction(+ : sum_sq)
    for (int64_t j = 0; j < c; ++j) sum_sq += x[j] * x[j];
    const T r = T(1) / std::sqrt(sum_sq / static_cast<T>(c) + eps);
    rstd[i] = r;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) y[j] = x[j] * r * weight[j];
  }
}

namespace {

// y = x·r·w with r = (mean(x²) + eps)^(-1/2), so
//   dx_k = r·w_k·dy_k − x_k·r³/C · Σ_j dy_j·w_j·x_j,   dw_j = Σ_rows dy_j·x_j·r.
// dx is added to din, or, with a residual, din = residual_scale ⊙ residual + dx.
template <typename T>
void rmsnorm_backward_rows(T* din, T* dweight, const T* dout, const T* in, const T* weight,
                           const T* rstd, const T* residual, const T* residual_scale, int64_t n,
                           int64_t c) {
  // dweight: one partial per fixed chunk of rows, then the partials are summed in chunk
  // order, so the result does not depend on how chunks are spread over threads.
  constexpr int64_t kRowsPerChunk = 32;
  const int64_t chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
  thread_local detail::ScratchBuffer<T> partial_buffer;
  T* partials = partial_buffer.get(std::max<int64_t>(chunks * c, 1));
  const T inv_c = T(1) / static_cast<T>(c);
  const bool parallel = n * c >= detail::kParallelMinElements;

#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    T* dw = partials + chunk * c;
    std::fill(dw, dw + c, T(0));
    const int64_t row_end = std::min(n, (chunk + 1) * kRowsPerChunk);
    for (int64_t i = chunk * kRowsPerChunk; i < row_end; ++i) {
      const T* x = in + i * c;
      const T* dy = dout + i * c;
      T* dx = din + i * c;
      const T r = rstd[i];
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < c; ++j) dot += dy[j] * weight[j] * x[j];
      const T coef = dot * r * r * r * inv_c;
      if (residual) {
        const T* res = residual + i * c;
#pragma omp simd
        for (int64_t j = 0; j < c; ++j)
          dx[j] = residual_scale[j] * res[j] + (r * weight[j] * dy[j] - coef * x[j]);
      } else {
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) dx[j] += r * weight[j] * dy[j] - coef * x[j];
      }
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) dw[j] += dy[j] * x[j] * r;
    }
  }
  constexpr int64_t kColumnBlock = 256;
  const int64_t column_blocks = (c + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (parallel && column_blocks > 1)
  for (int64_t blk = 0; blk < column_blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(c, c0 + kColumnBlock);
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const T* dw = partials + chunk * c;
#pragma omp simd
      for (int64_t j = c0; j < c1; ++j) dweight[j] += dw[j];
    }
  }
}

}  // namespace

template <typename T>
void rmsnorm_backward(T* din, T* dweight, const T* dout, const T* in, const T* weight,
                      const T* rstd, int64_t n, int64_t c) {
  rmsnorm_backward_rows<T>(din, dweight, dout, in, weight, rstd, nullptr, nullptr, n, c);
}

template <typename T>
void rmsnorm_backward_residual(T* din, T* dweight, const T* dout, const T* in, const T* weight,
                               const T* rstd, const T* residual, const T* residual_scale,
                               int64_t n, int64_t c) {
  rmsnorm_backward_rows<T>(din, dweight, dout, in, weight, rstd, residual, residual_scale, n, c);
}

#define FOUNDRY_INSTANTIATE(T)                                                                \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, T);         \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, \
                                    int64_t);                                                \
  template void rmsnorm_backward_residual<T>(T*, T*, const T*, const T*, const T*, const T*, \
                                             const T*, const T*, int64_t, int64_t);
FOUNDRY_INSTANTIATE(float)
FOUNDRY_INSTANTIATE(double)
#undef FOUNDRY_INSTANTIATE

}  // namespace foundry::ops
