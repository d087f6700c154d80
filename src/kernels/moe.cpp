#include <cstring>
#include <vector>

#include "base/error.h"
#include "kernels/kernel_support.h"
#include "kernels/ops.h"

namespace foundry::ops {

void moe_dispatch_plan(int64_t* expert_offsets, int32_t* slot_token, int32_t* assignment_slot,
                       const int32_t* topk_idx, int64_t n, int64_t e, int64_t k) {
  std::fill(expert_offsets, expert_offsets + e + 1, int64_t{0});
  for (int64_t a = 0; a < n * k; ++a) {
    FOUNDRY_CHECK(topk_idx[a] >= 0 && topk_idx[a] < e);
    ++expert_offsets[topk_idx[a] + 1];
  }
  for (int64_t j = 0; j < e; ++j) expert_offsets[j + 1] += expert_offsets[j];
  // Walking the assignments in token order makes the sort stable.
  std::vector<int64_t> next_row(expert_offsets, expert_offsets + e);
  for (int64_t a = 0; a < n * k; ++a) {
    const int64_t row = next_row[topk_idx[a]]++;
    slot_token[row] = static_cast<int32_t>(a / k);
    assignment_slot[a] = static_cast<int32_t>(row);
  }
}

template <typename T>
void moe_gather(T* xs, const T* x, const int32_t* slot_token, int64_t rows, int64_t c) {
#pragma omp parallel for schedule(static) if (rows * c >= detail::kParallelMinElements)
  for (int64_t s = 0; s < rows; ++s)
    std::memcpy(xs + s * c, x + static_cast<int64_t>(slot_token[s]) * c, c * sizeof(T));
}

template <typename T>
void moe_combine(T* out, const T* ys, const T* topk_w, const int32_t* assignment_slot,
                 int64_t n, int64_t k, int64_t c) {
#pragma omp parallel for schedule(static) if (n * k * c >= detail::kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    T* y = out + i * c;
    for (int64_t j = 0; j < k; ++j) {
      const T w = topk_w[i * k + j];
      const T* row = ys + static_cast<int64_t>(assignment_slot[i * k + j]) * c;
#pragma omp simd
      for (int64_t col = 0; col < c; ++col) y[col] += w * row[col];
    }
  }
}

template <typename T>
void moe_combine_backward(T* dys, T* dtopk_w, const T* dout, const T* ys, const T* topk_w,
                          const int32_t* assignment_slot, int64_t n, int64_t k, int64_t c) {
#pragma omp parallel for schedule(static) if (n * k * c >= detail::kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    const T* dy = dout + i * c;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t slot = assignment_slot[i * k + j];
      const T w = topk_w[i * k + j];
      const T* row = ys + slot * c;
      T* drow = dys + slot * c;
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t col = 0; col < c; ++col) {
        drow[col] = w * dy[col];
        dot += dy[col] * row[col];
      }
      dtopk_w[i * k + j] = dot;
    }
  }
}

template <typename T>
void moe_gather_backward(T* dx, const T* dxs, const int32_t* assignment_slot, int64_t n,
                         int64_t k, int64_t c) {
#pragma omp parallel for schedule(static) if (n * k * c >= detail::kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    T* d = dx + i * c;
    for (int64_t j = 0; j < k; ++j) {
      const T* row = dxs + static_cast<int64_t>(assignment_slot[i * k + j]) * c;
#pragma omp simd
      for (int64_t col = 0; col < c; ++col) d[col] += row[col];
    }
  }
}

#define FOUNDRY_INSTANTIATE(T)                                                                 \
  template void moe_gather<T>(T*, const T*, const int32_t*, int64_t, int64_t);                \
  template void moe_combine<T>(T*, const T*, const T*, const int32_t*, int64_t, int64_t,      \
                               int64_t);                                                       \
  template void moe_combine_backward<T>(T*, T*, const T*, const T*, const T*, const int32_t*, \
                                        int64_t, int64_t, int64_t);                            \
  template void moe_gather_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);
FOUNDRY_INSTANTIATE(float)
FOUNDRY_INSTANTIATE(double)
#undef FOUNDRY_INSTANTIATE

}  // namespace foundry::ops
