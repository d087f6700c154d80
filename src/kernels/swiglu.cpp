#include <algorithm>

#include "kernels/kernel_support.h"
#include "kernels/ops.h"

namespace foundry::ops {
namespace {

// The products of one element: y = silu(g)·u; dg = dy·u·silu'(g), du = dy·silu(g), with
// silu'(g) = s·(1 + g·(1 − s)) and s = sigmoid(g).
template <typename T>
inline T swiglu_value(T g, T u) {
  return g * (T(1) / (T(1) + detail::exp_fast(-g))) * u;
}
template <typename T>
inline void swiglu_grads(T g, T u, T dy, T& dg, T& du) {
  const T sigmoid = T(1) / (T(1) + detail::exp_fast(-g));
  dg = dy * u * sigmoid * (T(1) + g * (T(1) - sigmoid));
  du = dy * g * sigmoid;
}

// Columns per piece of a row computed in fp32 on the stack before the bf16 rounding.
constexpr int64_t kPiece = 256;

}  // namespace

template <typename T>
void swiglu_forward(T* out, const T* h, int64_t n, int64_t f) {
#pragma omp parallel for schedule(static) if (n * f >= detail::kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    const T* gate = h + i * 2 * f;
    const T* up = gate + f;
    T* y = out + i * f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) y[j] = swiglu_value(gate[j], up[j]);
  }
}

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
    for (int64_t j = 0; j < f; ++j) swiglu_grads(gate[j], up[j], dy[j], dgate[j], dup[j]);
  }
}

void swiglu_forward_bf16(bf16* out, const float* h, int64_t n, int64_t f) {
#pragma omp parallel for schedule(static) if (n * f >= detail::kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    const float* gate = h + i * 2 * f;
    const float* up = gate + f;
    float y[kPiece];
    for (int64_t j0 = 0; j0 < f; j0 += kPiece) {
      const int64_t m = std::min(kPiece, f - j0);
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) y[j] = swiglu_value(gate[j0 + j], up[j0 + j]);
      detail::to_bf16_serial(y, out + i * f + j0, m);
    }
  }
}

void swiglu_backward_bf16(bf16* dh, const float* dout, const float* h, int64_t n, int64_t f) {
#pragma omp parallel for schedule(static) if (n * f >= detail::kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    const float* gate = h + i * 2 * f;
    const float* up = gate + f;
    const float* dy = dout + i * f;
    float dg[kPiece], du[kPiece];
    for (int64_t j0 = 0; j0 < f; j0 += kPiece) {
      const int64_t m = std::min(kPiece, f - j0);
#pragma omp simd
      for (int64_t j = 0; j < m; ++j)
        swiglu_grads(gate[j0 + j], up[j0 + j], dy[j0 + j], dg[j], du[j]);
      detail::to_bf16_serial(dg, dh + i * 2 * f + j0, m);
      detail::to_bf16_serial(du, dh + i * 2 * f + f + j0, m);
    }
  }
}

template void swiglu_forward<float>(float*, const float*, int64_t, int64_t);
template void swiglu_forward<double>(double*, const double*, int64_t, int64_t);
template void swiglu_backward<float>(float*, const float*, const float*, int64_t, int64_t);
template void swiglu_backward<double>(double*, const double*, const double*, int64_t, int64_t);

}  // namespace foundry::ops
