#include <algorithm>
#include <cmath>
#include <limits>

#include "base/error.h"
#include "kernels/kernel_support.h"
#include "kernels/ops.h"

namespace foundry::ops {
namespace {

void check_targets(const int32_t* targets, int64_t n, int64_t v, int64_t vp) {
  FOUNDRY_CHECK(v >= 1 && v <= vp);
  for (int64_t i = 0; i < n; ++i)
    if (targets[i] < 0 || targets[i] >= v)
      fail(fmt::format("cross_entropy: target {} at row {} is outside the vocabulary [0, {})",
                       targets[i], i, v));
}

// One row z [Vp]: returns its loss; when d is set, writes d [Vp] = (softmax − onehot) ·
// grad_scale (0 in padded columns). d may alias z.
template <typename T>
T cross_entropy_row(T* d, const T* z, int32_t target, int64_t v, int64_t vp, T grad_scale) {
  // Read before anything is written: d may alias z.
  const T target_logit = z[target];
  const T max_z = detail::max_of(z, v);
  T sum = 0;
  if (d) {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < v; ++j) {
      const T ex = detail::exp_fast(z[j] - max_z);
      d[j] = ex;
      sum += ex;
    }
    const T scale = grad_scale / sum;
#pragma omp simd
    for (int64_t j = 0; j < v; ++j) d[j] *= scale;
    std::fill(d + v, d + vp, T(0));
    d[target] -= grad_scale;
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < v; ++j) sum += detail::exp_fast(z[j] - max_z);
  }
  return static_cast<T>(static_cast<double>(max_z) + std::log(static_cast<double>(sum)) -
                        static_cast<double>(target_logit));
}

template <typename T>
double mean_loss(const T* losses, int64_t n) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(losses[i]);
  return n > 0 ? total / static_cast<double>(n) : 0.0;
}

}  // namespace

template <typename T>
double cross_entropy(T* dlogits, T* losses, const T* logits, const int32_t* targets, int64_t n,
                     int64_t v, int64_t vp, T grad_scale) {
  check_targets(targets, n, v, vp);
#pragma omp parallel for schedule(static) if (n * vp >= detail::kParallelMinElements)
  for (int64_t i = 0; i < n; ++i)
    losses[i] = cross_entropy_row(dlogits ? dlogits + i * vp : nullptr, logits + i * vp,
                                  targets[i], v, vp, grad_scale);
  return mean_loss(losses, n);
}

double cross_entropy(bf16* dlogits, int64_t ld, float* losses, const float* logits,
                     const int32_t* targets, int64_t n, int64_t v, int64_t vp, float grad_scale) {
  check_targets(targets, n, v, vp);
  FOUNDRY_CHECK(ld >= vp);
#pragma omp parallel for schedule(static) if (n * vp >= detail::kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    // The row's float gradient, from cache, then rounded into dlogits (the row's logits are
    // read in full before its gradient is written).
    thread_local detail::ScratchBuffer<float> row;
    float* d = row.get(vp);
    losses[i] = cross_entropy_row(d, logits + i * vp, targets[i], v, vp, grad_scale);
    to_bf16_serial(d, dlogits + i * ld, vp);
  }
  return mean_loss(losses, n);
}

template double cross_entropy<float>(float*, float*, const float*, const int32_t*, int64_t,
                                     int64_t, int64_t, float);
template double cross_entropy<double>(double*, double*, const double*, const int32_t*, int64_t,
                                      int64_t, int64_t, double);

}  // namespace foundry::ops
