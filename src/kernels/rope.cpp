#include <cmath>
#include <vector>

#include "base/error.h"
#include "kernels/kernel_support.h"
#include "kernels/ops.h"

namespace foundry::ops {
namespace {

// cos/sin of pos·theta^(-2i/rotary_dim) for positions [pos_offset, pos_offset + t) and pairs
// [0, half), each [t, half]. Angles are computed in double: at long contexts they reach ~1e5
// radians, where float angles would lose most of their digits. The table is kept from call to
// call (training rotates q, k, dq and dk at the same positions every step).
template <typename T>
struct RopeTable {
  int64_t t = -1, half = -1, pos_offset = -1;
  double theta = 0;
  std::vector<T> cos_values, sin_values;
};

template <typename T>
const RopeTable<T>& rope_table(int64_t t, int64_t half, int64_t pos_offset, double theta,
                               bool parallel) {
  thread_local RopeTable<T> table;
  if (table.t == t && table.half == half && table.pos_offset == pos_offset &&
      table.theta == theta)
    return table;
  table.t = t;
  table.half = half;
  table.pos_offset = pos_offset;
  table.theta = theta;
  table.cos_values.resize(t * half);
  table.sin_values.resize(t * half);
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = std::pow(theta, -static_cast<double>(i) / static_cast<double>(half));
  // Plain pointers: inside the parallel region the name `table` would be each thread's own.
  T* cos_values = table.cos_values.data();
  T* sin_values = table.sin_values.data();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t ti = 0; ti < t; ++ti)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos_offset + ti) * inv_freq[i];
      cos_values[ti * half + i] = static_cast<T>(std::cos(angle));
      sin_values[ti * half + i] = static_cast<T>(std::sin(angle));
    }
  return table;
}

}  // namespace

template <typename T>
void rope_apply(T* x, int64_t b, int64_t t, int64_t h, int64_t d, int64_t rotary_dim,
                int64_t pos_offset, double theta, bool inverse) {
  FOUNDRY_CHECK(rotary_dim % 2 == 0 && rotary_dim <= d);
  const int64_t half = rotary_dim / 2;
  if (half == 0) return;
  const bool parallel = b * t * h * rotary_dim >= detail::kParallelMinElements;
  const RopeTable<T>& table = rope_table<T>(t, half, pos_offset, theta, parallel);
  // The inverse rotation is the rotation by the negative angle: sin flips sign.
  const T sin_sign = inverse ? T(-1) : T(1);
#pragma omp parallel for collapse(2) schedule(static) if (parallel)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti) {
      const T* cs = table.cos_values.data() + ti * half;
      const T* sn = table.sin_values.data() + ti * half;
      for (int64_t hi = 0; hi < h; ++hi) {
        T* head = x + ((bi * t + ti) * h + hi) * d;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const T x1 = head[i], x2 = head[i + half], s = sin_sign * sn[i];
          head[i] = x1 * cs[i] - x2 * s;
          head[i + half] = x2 * cs[i] + x1 * s;
        }
      }
    }
}

template void rope_apply<float>(float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                double, bool);
template void rope_apply<double>(double*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                 double, bool);

}  // namespace foundry::ops
