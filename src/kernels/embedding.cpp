#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "kernels/kernel_support.h"
#include "kernels/ops.h"

namespace foundry::ops {

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t n, int64_t c) {
#pragma omp parallel for schedule(static) if (n * c >= detail::kParallelMinElements)
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out + i * c, wte + static_cast<int64_t>(tokens[i]) * c, c * sizeof(T));
}

template <typename T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int64_t n, int64_t c,
                        int64_t v) {
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= v)
      fail(fmt::format("embedding_backward: token id {} at position {} is outside [0, {})",
                       tokens[i], i, v));
  // Threads own disjoint column blocks of dwte and walk the tokens in order, so every element
  // sums its contributions in token order whatever the thread count (no partial buffers).
  constexpr int64_t kColumnBlock = 64;
  const int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (n * c >= detail::kParallelMinElements)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(c, c0 + kColumnBlock);
    for (int64_t i = 0; i < n; ++i) {
      T* dst = dwte + static_cast<int64_t>(tokens[i]) * c;
      const T* src = dout + i * c;
#pragma omp simd
      for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
    }
  }
}

#define FOUNDRY_INSTANTIATE(T)                                                             \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t);     \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t, \
                                      int64_t);
FOUNDRY_INSTANTIATE(float)
FOUNDRY_INSTANTIATE(double)
#undef FOUNDRY_INSTANTIATE

}  // namespace foundry::ops
