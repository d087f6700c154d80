#include "kernels/kernel_support.h"
#include "kernels/ops.h"

namespace foundry::ops {

template <typename T>
void swiglu_forward(T* out, const T* h, int64_t n, int64_t f) {
#pragma omp parallel for schedule(static) if (n * f >= detail::kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    const T* gate = h + i * 2 * f;
    const T* up = gate + f;
    T* y = out + i * f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) {
      const T sigmoid = T(1) / (T(1) + detail::exp_fast(-gate[j]));
      y[j] = gate[j] * sigmoid * up[j];
    }
  }
}

// silu'(g) = s·(1 + g·(1 − s)) with s = sigmoid(g).
template <typename T>
void swiglu_backward(T* dh, const T* dout, const T* h, int64_t n, int64_t f) {
#pragma omp parallel for schedule(static) if (n * f >= detail::kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    const T* gate = h + i * 2 * f;
    const T* up = gate + f;
    const T* dy = dout + i * f;
    T* dgate = dh + i * 2 * f;
    T* dup = dgate + f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) {
      const T g = gate[j];
      const T sigmoid = T(1) / (T(1) + detail::exp_fast(-g));
      dgate[j] = dy[j] * up[j] * sigmoid * (T(1) + g * (T(1) - sigmoid));
      dup[j] = dy[j] * g * sigmoid;
    }
  }
}

template void swiglu_forward<float>(float*, const float*, int64_t, int64_t);
template void swiglu_forward<double>(double*, const double*, int64_t, int64_t);
template void swiglu_backward<float>(float*, const float*, const float*, int64_t, int64_t);
template void swiglu_backward<double>(double*, const double*, const double*, int64_t, int64_t);

}  // namespace foundry::ops
