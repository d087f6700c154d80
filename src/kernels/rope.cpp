#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "kernels/kernel_support.h"
#include "kernels/ops.h"

namespace foundry::ops {
namespace {

// cos/sin of p·theta^(-2i/rotary_dim) for positions p in [0, positions) and pairs [0, half),
// each [positions, half]. Angles are computed in double: at long contexts they reach ~1e5
// radians, where float angles would lose most of their digits. The table is kept from call to
// call and grows when a later position is asked for (to that position, or by up to 4,096
// positions more, whichever is further): training rotates the same positions every step, and
// decoding asks for one more position a step, row by row.
template <typename T>
struct RopeTable {
  int64_t half = -1, positions = 0;
  double theta = 0;
  std::vector<double> inv_freq;
  std::vector<T> cos_values, sin_values;

  const T* cos_at(int64_t p) const { return cos_values.data() + p * half; }
  const T* sin_at(int64_t p) const { return sin_values.data() + p * half; }
};

template <typename T>
void start_table(RopeTable<T>& table, int64_t half, double theta) {
  table.half = half;
  table.theta = theta;
  table.positions = 0;
  table.cos_values.clear();
  table.sin_values.clear();
  table.inv_freq.resize(half);
  for (int64_t i = 0; i < half; ++i)
    table.inv_freq[i] = std::pow(theta, -static_cast<double>(i) / static_cast<double>(half));
}

// The table covering positions [0, end) for this half and theta; each entry depends only on
// its position, so how the table grew never changes a value.
template <typename T>
const RopeTable<T>& rope_table(int64_t end, int64_t half, double theta) {
  thread_local RopeTable<T> table;
  if (table.half != half || table.theta != theta) start_table(table, half, theta);
  if (end <= table.positions) return table;
  constexpr int64_t kGrowth = 4096;  // positions added at most beyond what is asked for
  const int64_t from = table.positions, to = std::max(end, std::min(2 * from, from + kGrowth));
  table.cos_values.resize(to * half);
  table.sin_values.resize(to * half);
  // Plain pointers: inside the parallel region the name `table` would be each thread's own.
  T* cos_values = table.cos_values.data();
  T* sin_values = table.sin_values.data();
  const double* inv_freq = table.inv_freq.data();
#pragma omp parallel for schedule(static) if ((to - from) * half >= detail::kParallelMinElements)
  for (int64_t p = from; p < to; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * inv_freq[i];
      cos_values[p * half + i] = static_cast<T>(std::cos(angle));
      sin_values[p * half + i] = static_cast<T>(std::sin(angle));
    }
  table.positions = to;
  return table;
}

// Rotates the h heads of one position (each d values, the first 2·half of them rotating).
template <typename T>
void rotate_position(T* x, const T* cs, const T* sn, T sin_sign, int64_t h, int64_t d,
                     int64_t half) {
  for (int64_t hi = 0; hi < h; ++hi) {
    T* head = x + hi * d;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const T x1 = head[i], x2 = head[i + half], s = sin_sign * sn[i];
      head[i] = x1 * cs[i] - x2 * s;
      head[i + half] = x2 * cs[i] + x1 * s;
    }
  }
}

}  // namespace

template <typename T>
void rope_apply(T* x, int64_t b, int64_t t, int64_t h, int64_t d, int64_t rotary_dim,
                int64_t pos_offset, double theta, bool inverse) {
  FOUNDRY_CHECK(rotary_dim % 2 == 0 && rotary_dim <= d && pos_offset >= 0);
  const int64_t half = rotary_dim / 2;
  if (half == 0 || t == 0) return;
  const RopeTable<T>& table = rope_table<T>(pos_offset + t, half, theta);
  // The inverse rotation is the rotation by the negative angle: sin flips sign.
  const T sin_sign = inverse ? T(-1) : T(1);
#pragma omp parallel for collapse(2) \
    schedule(static) if (b * t * h * rotary_dim >= detail::kParallelMinElements)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti) {
      const int64_t p = pos_offset + ti;
      rotate_position(x + (bi * t + ti) * h * d, table.cos_at(p), table.sin_at(p), sin_sign, h, d,
                      half);
    }
}

template <typename T>
void rope_apply_rows(T* x, const int64_t* pos, int64_t rows, int64_t h, int64_t d,
                     int64_t rotary_dim, double theta) {
  FOUNDRY_CHECK(rotary_dim % 2 == 0 && rotary_dim <= d);
  const int64_t half = rotary_dim / 2;
  if (half == 0 || rows == 0) return;
  int64_t end = 0;
  for (int64_t r = 0; r < rows; ++r) {
    FOUNDRY_CHECK(pos[r] >= 0);
    end = std::max(end, pos[r] + 1);
  }
  const RopeTable<T>& table = rope_table<T>(end, half, theta);
#pragma omp parallel for schedule(static) if (rows * h * rotary_dim >= detail::kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r)
    rotate_position(x + r * h * d, table.cos_at(pos[r]), table.sin_at(pos[r]), T(1), h, d, half);
}

template void rope_apply<float>(float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                double, bool);
template void rope_apply<double>(double*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                 double, bool);
template void rope_apply_rows<float>(float*, const int64_t*, int64_t, int64_t, int64_t, int64_t,
                                     double);
template void rope_apply_rows<double>(double*, const int64_t*, int64_t, int64_t, int64_t, int64_t,
                                      double);

}  // namespace foundry::ops
