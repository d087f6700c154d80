#include <algorithm>
#include <cmath>
#include <limits>

#include "base/error.h"
#include "kernels/kernel_support.h"
#include "kernels/ops.h"

namespace foundry::ops {

template <typename T>
double cross_entropy(T* dlogits, T* losses, const T* logits, const int32_t* targets, int64_t n,
                     int64_t v, int64_t vp, T grad_scale) {
  FOUNDRY_CHECK(v >= 1 && v <= vp);
  for (int64_t i = 0; i < n; ++i)
    if (targets[i] < 0 || targets[i] >= v)
      fail(fmt::format("cross_entropy: target {} at row {} is outside the vocabulary [0, {})",
                       targets[i], i, v));
#pragma omp parallel for schedule(static) if (n * vp >= detail::kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    const T* z = logits + i * vp;
    // Read before anything is written: dlogits may alias logits.
    const T target_logit = z[targets[i]];
    const T max_z = detail::max_of(z, v);
    T sum = 0;
    if (dlogits) {
      T* d = dlogits + i * vp;
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
      d[targets[i]] -= grad_scale;
    } else {
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < v; ++j) sum += detail::exp_fast(z[j] - max_z);
    }
    losses[i] = static_cast<T>(static_cast<double>(max_z) + std::log(static_cast<double>(sum)) -
                               static_cast<double>(target_logit));
  }
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(losses[i]);
  return n > 0 ? total / static_cast<double>(n) : 0.0;
}

template double cross_entropy<float>(float*, float*, const float*, const int32_t*, int64_t,
                                     int64_t, int64_t, float);
template double cross_entropy<double>(double*, double*, const double*, const int32_t*, int64_t,
                                      int64_t, int64_t, double);

}  // namespace foundry::ops
