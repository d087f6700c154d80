#include <cmath>

#include "base/error.h"
#include "kernels/kernel_support.h"
#include "kernels/ops.h"

namespace foundry::ops {

template <typename T>
void rope_apply(T* x, int64_t b, int64_t t, int64_t h, int64_t d, int64_t rotary_dim,
                int64_t pos_offset, double theta, bool inverse) {
  FOUNDRY_CHECK(rotary_dim % 2 == 0 && rotary_dim <= d);
  const int64_t half = rotary_dim / 2;
  if (half == 0) return;
  // cos/sin table [t, half], angles in double: pos·theta^(-2i/rotary_dim) reaches ~1e5
  // radians at long contexts, where float angles would lose most of their digits.
  thread_local detail::ScratchBuffer<T> table_buffer;
  T* cos_table = table_buffer.get(2 * t * half);
  T* sin_table = cos_table + t * half;
  const double sign = inverse ? -1.0 : 1.0;
  const bool parallel = b * t * h * rotary_dim >= detail::kParallelMinElements;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t ti = 0; ti < t; ++ti) {
    const double pos = static_cast<double>(pos_offset + ti);
    for (int64_t i = 0; i < half; ++i) {
      const double angle =
          pos * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
      cos_table[ti * half + i] = static_cast<T>(std::cos(angle));
      sin_table[ti * half + i] = static_cast<T>(sign * std::sin(angle));
    }
  }
#pragma omp parallel for collapse(2) schedule(static) if (parallel)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti) {
      const T* cs = cos_table + ti * half;
      const T* sn = sin_table + ti * half;
      for (int64_t hi = 0; hi < h; ++hi) {
        T* head = x + ((bi * t + ti) * h + hi) * d;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const T x1 = head[i], x2 = head[i + half];
          head[i] = x1 * cs[i] - x2 * sn[i];
          head[i + half] = x2 * cs[i] + x1 * sn[i];
        }
      }
    }
}

template void rope_apply<float>(float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                double, bool);
template void rope_apply<double>(double*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                 double, bool);

}  // namespace foundry::ops
