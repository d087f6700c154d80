#include "kernels/cca.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "kernels/gemm.h"
#include "kernels/kernel_support.h"

namespace foundry::ops {
namespace {

bool is_parallel(int64_t elements) { return elements >= detail::kParallelMinElements; }

// Register tiles for the grouped convolution: kTileRows rows × kTileCols<T> columns of
// accumulators, four 512-bit registers per row (64 floats or 32 doubles), 16 registers in all.
constexpr int kTileRows = 4;
template <typename T>
constexpr int kTileCols = static_cast<int>(256 / sizeof(T));

// Rows of the sequence handled by one task of the grouped convolution (forward and dy).
constexpr int64_t kRowsPerTask = 64;
// Rows summed in registers before a tile is added to its running total (dw1): a two-level
// sum keeps float rounding error proportional to kRowsPerBlock + rows/kRowsPerBlock.
constexpr int64_t kRowsPerBlock = 128;
// Output channels of w1 per dw1 task.
constexpr int64_t kOutputsPerTask = 16;

// acc[r][:] += Σ_{k<count} x[r][k·x_stride] · w[k·w_stride + :], R rows × V columns held in
// registers.
template <typename T, int R, int V>
inline void tile_multiply_add(T (&acc)[R][V], const T* const (&x)[R], int64_t x_stride, const T* w,
                              int64_t w_stride, int64_t count) {
  for (int64_t k = 0; k < count; ++k) {
    const T* wk = w + k * w_stride;
    for (int r = 0; r < R; ++r) {
      const T xv = x[r][k * x_stride];
#pragma omp simd
      for (int v = 0; v < V; ++v) acc[r][v] += xv * wk[v];
    }
  }
}

// acc[:cols] += Σ_{k<count} x[k·x_stride] · w[k·w_stride + :cols]: the columns a full tile
// does not cover.
template <typename T>
inline void row_multiply_add(T* acc, int64_t cols, const T* x, int64_t x_stride, const T* w,
                             int64_t w_stride, int64_t count) {
  for (int64_t k = 0; k < count; ++k) {
    const T xv = x[k * x_stride];
    const T* wk = w + k * w_stride;
#pragma omp simd
    for (int64_t v = 0; v < cols; ++v) acc[v] += xv * wk[v];
  }
}

// The multi-tap grouped product shared by the grouped conv's forward and its dy:
//   out[b, t, grp, :] (= bias[grp, :] when bias is set, else +=)
//       Σ_{i<taps} Σ_{j<d} in[b, t + shift[i], grp, j] · packed[grp, i, j, :]
// for out, in [B, T, G·d] and packed [G, taps, d, d]; a source row before the sequence's start
// reads `before` [G·d] (zero where it is null), one after its end contributes nothing. Tasks
// are (sequence, block of rows, group); each output element is computed by one task in a fixed
// order.
template <typename T>
void grouped_taps(T* out, const T* in, const T* packed, const T* bias, const T* before,
                  const std::vector<int64_t>& shift, int64_t b, int64_t t, int64_t groups,
                  int64_t d, int64_t taps) {
  constexpr int V = kTileCols<T>;
  const int64_t channels = groups * d;
  const int64_t row_blocks = (t + kRowsPerTask - 1) / kRowsPerTask;
  // Stands in for a source row outside the sequence.
  const std::vector<T> zero_row(channels, T(0));
  const T* zeros = zero_row.data();
  const T* start = before ? before : zeros;
  const bool parallel = b * t * channels * d * taps >= 64 * detail::kParallelMinElements;

  // Rows [t_row, t_row + R) of sequence bi, output columns [o0, o0 + V) of group grp.
  auto tile = [&]<int R>(int64_t bi, int64_t t_row, int64_t grp, int64_t o0) {
    T acc[R][V];
    T* out_rows[R];
    for (int r = 0; r < R; ++r) {
      out_rows[r] = out + (bi * t + t_row + r) * channels + grp * d + o0;
      const T* init = bias ? bias + grp * d + o0 : out_rows[r];
      for (int v = 0; v < V; ++v) acc[r][v] = init[v];
    }
    for (int64_t i = 0; i < taps; ++i) {
      const T* x[R];
      for (int r = 0; r < R; ++r) {
        const int64_t src = t_row + r + shift[i];
        x[r] = src < 0   ? start + grp * d
               : src < t ? in + (bi * t + src) * channels + grp * d
                         : zeros;
      }
      tile_multiply_add<T, R, V>(acc, x, 1, packed + ((grp * taps + i) * d) * d + o0, d, d);
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) out_rows[r][v] = acc[r][v];
  };

#pragma omp parallel for collapse(3) schedule(static) if (parallel)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t blk = 0; blk < row_blocks; ++blk)
      for (int64_t grp = 0; grp < groups; ++grp) {
        const int64_t t_begin = blk * kRowsPerTask, t_end = std::min(t, t_begin + kRowsPerTask);
        int64_t o0 = 0;
        for (; o0 + V <= d; o0 += V) {
          int64_t t_row = t_begin;
          for (; t_row + kTileRows <= t_end; t_row += kTileRows)
            tile.template operator()<kTileRows>(bi, t_row, grp, o0);
          for (; t_row < t_end; ++t_row) tile.template operator()<1>(bi, t_row, grp, o0);
        }
        if (o0 < d) {
          const int64_t cols = d - o0;
          T acc[V];
          for (int64_t t_row = t_begin; t_row < t_end; ++t_row) {
            T* out_row = out + (bi * t + t_row) * channels + grp * d + o0;
            const T* init = bias ? bias + grp * d + o0 : out_row;
            std::copy(init, init + cols, acc);
            for (int64_t i = 0; i < taps; ++i) {
              const int64_t src = t_row + shift[i];
              if (src >= t || (src < 0 && !before)) continue;
              const T* x = src < 0 ? before + grp * d : in + (bi * t + src) * channels + grp * d;
              row_multiply_add(acc, cols, x, 1, packed + ((grp * taps + i) * d) * d + o0, d, d);
            }
            std::copy(acc, acc + cols, out_row);
          }
        }
      }
}

// w1 [G·d, d, taps] repacked for grouped_taps: packed [G, taps, d, d] with
//   forward (transpose = false): packed[grp, i, ci, o] = w1[grp, o, ci, i]   (rows: inputs y)
//   dy      (transpose = true):  packed[grp, i, o, ci] = w1[grp, o, ci, i]   (rows: inputs dz)
template <typename T>
const T* pack_grouped_weight(const T* w1, int64_t groups, int64_t d, int64_t taps, bool transpose) {
  thread_local detail::ScratchBuffer<T> buffer;
  T* packed = buffer.get(groups * taps * d * d);
#pragma omp parallel for collapse(2) schedule(static) if (is_parallel(groups * taps * d * d))
  for (int64_t grp = 0; grp < groups; ++grp)
    for (int64_t i = 0; i < taps; ++i) {
      T* dst = packed + (grp * taps + i) * d * d;
      for (int64_t o = 0; o < d; ++o) {
        const T* src = w1 + ((grp * d + o) * d) * taps + i;
        if (transpose)
          for (int64_t ci = 0; ci < d; ++ci) dst[o * d + ci] = src[ci * taps];
        else
          for (int64_t ci = 0; ci < d; ++ci) dst[ci * d + o] = src[ci * taps];
      }
    }
  return packed;
}

void check_heads(int64_t hq, int64_t hk, int64_t d) {
  FOUNDRY_CHECK(hq > 0 && hk > 0 && d > 0 && hq % hk == 0);
}

}  // namespace

// ---- dims ----------------------------------------------------------------------------------

void CcaDims::validate() const {
  if (hq <= 0 || hk <= 0 || d <= 0)
    fail(fmt::format("CCA: heads and head dim must be positive (hq {}, hk {}, d {})", hq, hk, d));
  if (hq % hk != 0)
    fail(fmt::format("CCA: query heads {} are not a multiple of KV heads {}", hq, hk),
         "choose hq = g·hk for an integer group size g");
  if ((hk * d) % 2 != 0)
    fail(fmt::format("CCA: hk·d = {} must be even (the values split into two halves)", hk * d));
  if (t0 < 1 || t1 < 1)
    fail(fmt::format("CCA: convolution kernel sizes must be ≥ 1 (t0 {}, t1 {})", t0, t1));
}

// ---- means ---------------------------------------------------------------------------------

// One row of each: qk_row += [mq ‖ mk] from c_row; dc_row += the means' gradient of dqk_row.
// Both go through a KV head's channels kMeanLanes at a time, the query heads of its group one
// after another (each span contiguous, so every loop is a vector loop).
constexpr int64_t kMeanLanes = 16;

template <typename T>
inline void means_forward_row(T* qk_row, const T* c_row, int64_t hq, int64_t hk, int64_t d) {
  const int64_t g = hq / hk;
  const T inv_g = T(1) / static_cast<T>(g);
  const T* k0 = c_row + hq * d;
  T* out_k = qk_row + hq * d;
  for (int64_t j = 0; j < hk; ++j)
    for (int64_t x0 = 0; x0 < d; x0 += kMeanLanes) {
      const int64_t lanes = std::min(kMeanLanes, d - x0);
      const T* kj = k0 + j * d + x0;
      T sum[kMeanLanes] = {};
      for (int64_t h = j * g; h < (j + 1) * g; ++h) {
        const T* qh = c_row + h * d + x0;
        T* out = qk_row + h * d + x0;
#pragma omp simd
        for (int64_t x = 0; x < lanes; ++x) {
          const T mq = (qh[x] + kj[x]) * T(0.5);
          out[x] += mq;
          sum[x] += mq;
        }
      }
      T* out = out_k + j * d + x0;
#pragma omp simd
      for (int64_t x = 0; x < lanes; ++x) out[x] += sum[x] * inv_g;
    }
}

template <typename T>
inline void means_backward_row(T* dc_row, const T* dqk_row, int64_t hq, int64_t hk, int64_t d) {
  const int64_t g = hq / hk;
  const T half_inv_g = T(0.5) / static_cast<T>(g);
  const T* dmk = dqk_row + hq * d;
  T* dk0 = dc_row + hq * d;
  for (int64_t j = 0; j < hk; ++j)
    for (int64_t x0 = 0; x0 < d; x0 += kMeanLanes) {
      const int64_t lanes = std::min(kMeanLanes, d - x0);
      const T* dm = dmk + j * d + x0;
      T sum[kMeanLanes] = {};
      for (int64_t h = j * g; h < (j + 1) * g; ++h) {
        const T* dq = dqk_row + h * d + x0;
        T* out = dc_row + h * d + x0;
#pragma omp simd
        for (int64_t x = 0; x < lanes; ++x) {
          out[x] += dq[x] * T(0.5) + dm[x] * half_inv_g;
          sum[x] += dq[x];
        }
      }
      T* out = dk0 + j * d + x0;
#pragma omp simd
      for (int64_t x = 0; x < lanes; ++x) out[x] += (sum[x] + dm[x]) * T(0.5);
    }
}

template <typename T>
void cca_means_forward(T* qk, const T* c, int64_t n, int64_t hq, int64_t hk, int64_t d) {
  check_heads(hq, hk, d);
  const int64_t channels = (hq + hk) * d;
#pragma omp parallel for schedule(static) if (is_parallel(n * channels))
  for (int64_t row = 0; row < n; ++row)
    means_forward_row(qk + row * channels, c + row * channels, hq, hk, d);
}

template <typename T>
void cca_means_backward(T* dc, const T* dqk, int64_t n, int64_t hq, int64_t hk, int64_t d) {
  check_heads(hq, hk, d);
  const int64_t channels = (hq + hk) * d;
#pragma omp parallel for schedule(static) if (is_parallel(n * channels))
  for (int64_t row = 0; row < n; ++row)
    means_backward_row(dc + row * channels, dqk + row * channels, hq, hk, d);
}

// ---- depthwise convolution -----------------------------------------------------------------

template <typename T>
void cca_depthwise_conv_forward(T* y, const T* c, const T* w0, const T* b0, int64_t b, int64_t t,
                                int64_t channels, int64_t taps) {
  FOUNDRY_CHECK(taps >= 1 && channels > 0);
  thread_local detail::ScratchBuffer<T> weight_buffer;
  T* wt = weight_buffer.get(taps * channels);
  detail::cca_depthwise_taps_major(wt, w0, channels, taps);
#pragma omp parallel for collapse(2) schedule(static) if (is_parallel(b * t * channels))
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti)
      detail::cca_depthwise_row(y + (bi * t + ti) * channels, c + bi * t * channels, wt, b0, ti,
                                channels, taps);
}

// dc[b, t, ch] += Σ_i w0[ch, i] · dy[b, t + (t0−1) − i, ch]   (positions < T)
// dw0[ch, i]   += Σ_{b,t} dy[b, t, ch] · c[b, t − (t0−1) + i, ch]
// db0[ch]      += Σ_{b,t} dy[b, t, ch]
// One pass over contiguous rows, tasks by (sequence, block of kCcaRowsPerBlock rows): each task
// owns its rows of dc and sums its rows in order into its own partial sums; the partials are
// then added per channel in task order. The order depends only on the shape. dy's rows are
// read as `segments` spans of `len` channels (dy_at(row, s): channels [s·len, (s+1)·len)),
// so any layout of dy gives the same bits.
namespace {

// One task: rows [r0, r1) of sequence bi. dc's rows +=; `partial` [taps + 1, C] (written):
// the per-tap weight sums, then the bias sum last. wt: the weights tap-major.
template <typename T, typename DyAt>
void depthwise_backward_rows(T* dc, T* partial, DyAt dy_at, int64_t segments, int64_t len,
                             const T* c, const T* wt, int64_t bi, int64_t t, int64_t r0, int64_t r1,
                             int64_t taps) {
  const int64_t channels = segments * len;
  std::fill(partial, partial + (taps + 1) * channels, T(0));
  T* bias_sum = partial + taps * channels;
  for (int64_t ti = r0; ti < r1; ++ti) {
    for (int64_t s = 0; s < segments; ++s) {
      const T* g = dy_at(bi * t + ti, s);
      const int64_t j0 = s * len;
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) bias_sum[j0 + j] += g[j];
      for (int64_t i = 0; i < taps; ++i) {
        const int64_t src = ti - (taps - 1) + i;
        if (src < 0) continue;
        const T* in = c + (bi * t + src) * channels + j0;
        T* w_sum = partial + i * channels + j0;
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) w_sum[j] += g[j] * in[j];
      }
    }
    T* din = dc + (bi * t + ti) * channels;
    for (int64_t i = 0; i < taps; ++i) {
      const int64_t dst = ti + (taps - 1) - i;
      if (dst >= t) continue;
      for (int64_t s = 0; s < segments; ++s) {
        const T* g_later = dy_at(bi * t + dst, s);
        const T* w = wt + i * channels + s * len;
        T* out = din + s * len;
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) out[j] += w[j] * g_later[j];
      }
    }
  }
}

// The tasks' partials [tasks][taps + 1, C] added per channel in task order into dw0, db0.
template <typename T>
void depthwise_backward_sums(T* dw0, T* db0, const T* partials, int64_t tasks, int64_t channels,
                             int64_t taps) {
  const int64_t sums = (taps + 1) * channels;
#pragma omp parallel for schedule(static) if (is_parallel(tasks * sums))
  for (int64_t j = 0; j < sums; ++j) {
    T total = 0;
    for (int64_t task = 0; task < tasks; ++task) total += partials[task * sums + j];
    const int64_t i = j / channels, ch = j % channels;
    if (i < taps)
      dw0[ch * taps + i] += total;
    else
      db0[ch] += total;
  }
}

template <typename T, typename DyAt>
void depthwise_conv_backward(T* dc, T* dw0, T* db0, DyAt dy_at, int64_t segments, int64_t len,
                             const T* c, const T* w0, int64_t b, int64_t t, int64_t taps) {
  const int64_t channels = segments * len;
  FOUNDRY_CHECK(taps >= 1 && channels > 0);
  thread_local detail::ScratchBuffer<T> weight_buffer, partial_buffer;
  T* wt = weight_buffer.get(taps * channels);
  detail::cca_depthwise_taps_major(wt, w0, channels, taps);

  constexpr int64_t kTaskRows = detail::kCcaRowsPerBlock;  // the blocked step's blocks too
  const int64_t blocks = (t + kTaskRows - 1) / kTaskRows, tasks = b * blocks;
  const int64_t sums = (taps + 1) * channels;
  T* partials = partial_buffer.get(tasks * sums);
#pragma omp parallel for schedule(static) if (is_parallel(b * t * channels) && tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t bi = task / blocks, r0 = task % blocks * kTaskRows;
    depthwise_backward_rows(dc, partials + task * sums, dy_at, segments, len, c, wt, bi, t, r0,
                            std::min(t, r0 + kTaskRows), taps);
  }
  depthwise_backward_sums(dw0, db0, partials, tasks, channels, taps);
}

}  // namespace

template <typename T>
void cca_depthwise_conv_backward(T* dc, T* dw0, T* db0, const T* dy, const T* c, const T* w0,
                                 int64_t b, int64_t t, int64_t channels, int64_t taps) {
  auto rows = [=](int64_t row, int64_t) { return dy + row * channels; };
  depthwise_conv_backward(dc, dw0, db0, rows, 1, channels, c, w0, b, t, taps);
}

void cca_depthwise_conv_backward_grouped(float* dc, float* dw0, float* db0,
                                         const float* dy_groups, const float* c,
                                         const float* w0, int64_t b, int64_t t, int64_t groups,
                                         int64_t d, int64_t taps) {
  const int64_t rows = b * t;
  auto group_major = [=](int64_t row, int64_t g) { return dy_groups + (g * rows + row) * d; };
  depthwise_conv_backward(dc, dw0, db0, group_major, groups, d, c, w0, b, t, taps);
}

void detail::cca_depthwise_backward_rows_grouped(float* dc, float* partial, const float* dy_groups,
                                                 int64_t group_rows, int64_t first_row,
                                                 const float* c, const float* wt, int64_t bi,
                                                 int64_t t, int64_t r0, int64_t r1, int64_t groups,
                                                 int64_t d, int64_t taps) {
  auto group_major = [=](int64_t row, int64_t g) {
    return dy_groups + (g * group_rows + row - first_row) * d;
  };
  depthwise_backward_rows(dc, partial, group_major, groups, d, c, wt, bi, t, r0, r1, taps);
}

void detail::cca_depthwise_backward_sums(float* dw0, float* db0, const float* partials,
                                         int64_t tasks, int64_t channels, int64_t taps) {
  depthwise_backward_sums(dw0, db0, partials, tasks, channels, taps);
}

// ---- grouped convolution -------------------------------------------------------------------

template <typename T>
void cca_grouped_conv_forward(T* z, const T* y, const T* w1, const T* b1, const T* before,
                              int64_t b, int64_t t, int64_t groups, int64_t d, int64_t taps) {
  FOUNDRY_CHECK(taps >= 1 && groups > 0 && d > 0);
  const T* packed = pack_grouped_weight(w1, groups, d, taps, /*transpose=*/false);
  std::vector<int64_t> shift(taps);
  for (int64_t i = 0; i < taps; ++i) shift[i] = i - (taps - 1);
  grouped_taps(z, y, packed, b1, before, shift, b, t, groups, d, taps);
}

namespace {

// sum [P, C] (written) = Σ_b dz[b, p] for the positions p < P that read before position 0,
// P = min(T, t1−1), the sequences in order from zero (cca_grouped_conv_before_backward's
// first step). Sequence bi's row p of dz at dz + (bi·stride + p)·C.
template <typename T>
std::vector<T> first_rows_sums(const T* dz, int64_t stride, int64_t b, int64_t t, int64_t channels,
                               int64_t taps) {
  const int64_t rows = std::min(t, taps - 1);
  std::vector<T> sum(rows * channels, T(0));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t p = 0; p < rows; ++p) {
      const T* g = dz + (bi * stride + p) * channels;
      T* s = sum.data() + p * channels;
      for (int64_t ch = 0; ch < channels; ++ch) s[ch] += g[ch];
    }
  return sum;
}

// cca_grouped_conv_before_backward from the first rows' sums.
template <typename T>
void before_gradient(T* dbefore, const std::vector<T>& sum, const T* w1, int64_t groups, int64_t d,
                     int64_t taps) {
  const int64_t rows = static_cast<int64_t>(sum.size()) / (groups * d);
  for (int64_t grp = 0; grp < groups; ++grp)
    for (int64_t ci = 0; ci < d; ++ci) {
      T acc = 0;
      for (int64_t p = 0; p < rows; ++p)
        for (int64_t i = 0; i < taps - 1 - p; ++i)
          for (int64_t o = 0; o < d; ++o)
            acc += w1[((grp * d + o) * d + ci) * taps + i] * sum[p * groups * d + grp * d + o];
      dbefore[grp * d + ci] += acc;
    }
}

}  // namespace

template <typename T>
void cca_grouped_conv_before_backward(T* dbefore, const T* dz, int64_t stride, const T* w1,
                                      int64_t b, int64_t t, int64_t groups, int64_t d,
                                      int64_t taps) {
  before_gradient(dbefore, first_rows_sums(dz, stride, b, t, groups * d, taps), w1, groups, d,
                  taps);
}

namespace {

// dw1[grp, o, ci, i] += Σ_{b,t} dz[b, t, grp, o] · y[b, t − (t1−1) + i, grp, ci] over the rows
// whose tap reads inside the sequence.
template <typename T>
void grouped_weight_gradient(T* dw1, const T* dz, const T* y, int64_t b, int64_t t, int64_t groups,
                             int64_t d, int64_t taps) {
  const int64_t channels = groups * d;
  // Tasks (group, tap, block of kOutputsPerTask outputs), each a [outputs, d] block of
  // dz^T·y_shifted summed over rows in a fixed order: tiles of kTileRows outputs × kTileCols
  // input channels over kRowsPerBlock rows in registers, then added to the task's total.
  constexpr int V = kTileCols<T>;
  const int64_t output_blocks = (d + kOutputsPerTask - 1) / kOutputsPerTask;
  const bool parallel = b * t * channels * d * taps >= 64 * detail::kParallelMinElements;
#pragma omp parallel for collapse(3) schedule(static) if (parallel)
  for (int64_t grp = 0; grp < groups; ++grp)
    for (int64_t i = 0; i < taps; ++i)
      for (int64_t ob = 0; ob < output_blocks; ++ob) {
        const int64_t o_begin = ob * kOutputsPerTask;
        const int64_t o_end = std::min(d, o_begin + kOutputsPerTask);
        const int64_t shift_i = i - (taps - 1);  // y row = dz row + shift_i
        thread_local detail::ScratchBuffer<T> total_buffer;
        T* total = total_buffer.get(kOutputsPerTask * d);  // [outputs, d]
        std::fill(total, total + kOutputsPerTask * d, T(0));

        // Outputs [o, o + R) × all input channels over dz rows [r0, r0 + count) of sequence bi.
        auto block = [&]<int R>(int64_t bi, int64_t r0, int64_t count, int64_t o) {
          const T* x[R];
          for (int r = 0; r < R; ++r) x[r] = dz + (bi * t + r0) * channels + grp * d + o + r;
          const T* y_rows = y + (bi * t + r0 + shift_i) * channels + grp * d;
          int64_t c0 = 0;
          for (; c0 + V <= d; c0 += V) {
            T acc[R][V] = {};
            tile_multiply_add<T, R, V>(acc, x, channels, y_rows + c0, channels, count);
            for (int r = 0; r < R; ++r) {
              T* dst = total + (o - o_begin + r) * d + c0;
              for (int v = 0; v < V; ++v) dst[v] += acc[r][v];
            }
          }
          if (c0 < d) {
            const int64_t cols = d - c0;
            for (int r = 0; r < R; ++r) {
              T acc[V] = {};
              row_multiply_add(acc, cols, x[r], channels, y_rows + c0, channels, count);
              T* dst = total + (o - o_begin + r) * d + c0;
              for (int64_t v = 0; v < cols; ++v) dst[v] += acc[v];
            }
          }
        };

        for (int64_t bi = 0; bi < b; ++bi)
          for (int64_t r0 = std::max<int64_t>(0, -shift_i); r0 < t; r0 += kRowsPerBlock) {
            const int64_t count = std::min(t, r0 + kRowsPerBlock) - r0;
            int64_t o = o_begin;
            for (; o + kTileRows <= o_end; o += kTileRows)
              block.template operator()<kTileRows>(bi, r0, count, o);
            for (; o < o_end; ++o) block.template operator()<1>(bi, r0, count, o);
          }
        for (int64_t o = o_begin; o < o_end; ++o) {
          const T* src = total + (o - o_begin) * d;
          T* dst = dw1 + ((grp * d + o) * d) * taps + i;
          for (int64_t ci = 0; ci < d; ++ci) dst[ci * taps] += src[ci];
        }
      }
}

// dw1's part from the taps that read `before`: tap i at positions p < t1−1−i, whose dz rows
// `first_sums` holds summed over the sequences.
template <typename T>
void before_weight_gradient(T* dw1, const std::vector<T>& first_sums, const T* before,
                            int64_t channels, int64_t d, int64_t taps) {
  const int64_t rows = static_cast<int64_t>(first_sums.size()) / channels;
  for (int64_t i = 0; i < taps - 1; ++i)
    for (int64_t out = 0; out < channels; ++out) {  // output channel grp·d + o
      T acc = 0;  // Σ of dz over the rows whose tap i reads before the sequence
      for (int64_t p = 0; p < std::min(rows, taps - 1 - i); ++p)
        acc += first_sums[p * channels + out];
      const T* in = before + out / d * d;
      for (int64_t ci = 0; ci < d; ++ci) dw1[(out * d + ci) * taps + i] += acc * in[ci];
    }
}

}  // namespace

// dy[b, t', grp, ci] += Σ_i Σ_o w1[grp, o, ci, i] · dz[b, t' + (t1−1) − i, grp, o]
// dw1[grp, o, ci, i] += Σ_{b,t} dz[b, t, grp, o] · y[b, t − (t1−1) + i, grp, ci]
//                       (y before position 0: `before`)
// db1[grp, o]        += Σ_{b,t} dz[b, t, grp, o]
template <typename T>
void cca_grouped_conv_backward(T* dy, T* dw1, T* db1, T* dbefore, const T* dz, const T* y,
                               const T* w1, const T* before, int64_t b, int64_t t, int64_t groups,
                               int64_t d, int64_t taps) {
  FOUNDRY_CHECK(taps >= 1 && groups > 0 && d > 0);
  const int64_t channels = groups * d;

  // dy: the forward's product with transposed weights and the shifts reversed.
  const T* packed = pack_grouped_weight(w1, groups, d, taps, /*transpose=*/true);
  std::vector<int64_t> shift(taps);
  for (int64_t i = 0; i < taps; ++i) shift[i] = (taps - 1) - i;
  grouped_taps(dy, dz, packed, static_cast<const T*>(nullptr), static_cast<const T*>(nullptr),
               shift, b, t, groups, d, taps);
  // The rows that read `before`, summed over the sequences once for dbefore and dw1.
  const std::vector<T> first_sums = first_rows_sums(dz, t, b, t, channels, taps);
  if (dbefore) before_gradient(dbefore, first_sums, w1, groups, d, taps);

  grouped_weight_gradient(dw1, dz, y, b, t, groups, d, taps);
  if (before) before_weight_gradient(dw1, first_sums, before, channels, d, taps);
  detail::add_column_sums(db1, dz, b * t, channels);
}

// ---- value shift ---------------------------------------------------------------------------

template <typename T>
void cca_value_shift_inplace_forward(T* v, T* last_out, int64_t b, int64_t t, int64_t half) {
  const int64_t width = 2 * half;
#pragma omp parallel for schedule(static) if (is_parallel(b * t * half))
  for (int64_t bi = 0; bi < b; ++bi) {
    T* seq = v + bi * t * width + half;
    if (last_out) {
      if (t > 0)
        std::copy(seq + (t - 1) * width, seq + (t - 1) * width + half, last_out + bi * half);
      else
        std::fill(last_out + bi * half, last_out + (bi + 1) * half, T(0));
    }
    for (int64_t ti = t - 1; ti > 0; --ti)
      std::copy(seq + (ti - 1) * width, seq + (ti - 1) * width + half, seq + ti * width);
    if (t > 0) std::fill(seq, seq + half, T(0));
  }
}

template <typename T>
void cca_value_shift_inplace_backward(T* dv, int64_t b, int64_t t, int64_t half) {
  const int64_t width = 2 * half;
#pragma omp parallel for schedule(static) if (is_parallel(b * t * half))
  for (int64_t bi = 0; bi < b; ++bi) {
    T* seq = dv + bi * t * width + half;
    for (int64_t ti = 0; ti + 1 < t; ++ti)
      std::copy(seq + (ti + 1) * width, seq + (ti + 1) * width + half, seq + ti * width);
    if (t > 0) std::fill(seq + (t - 1) * width, seq + (t - 1) * width + half, T(0));
  }
}

template <typename T>
void cca_value_shift_forward(T* v, const T* vcur, const T* vprev_in, int64_t b, int64_t t,
                             int64_t half) {
#pragma omp parallel for collapse(2) schedule(static) if (is_parallel(b * t * half))
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti) {
      const int64_t row = bi * t + ti;
      T* out = v + row * 2 * half;
      std::copy(vcur + row * half, vcur + (row + 1) * half, out);
      if (ti > 0)
        std::copy(vprev_in + (row - 1) * half, vprev_in + row * half, out + half);
      else
        std::fill(out + half, out + 2 * half, T(0));
    }
}

template <typename T>
void cca_value_shift_backward(T* dvcur, T* dvprev_in, const T* dv, int64_t b, int64_t t,
                              int64_t half) {
#pragma omp parallel for collapse(2) schedule(static) if (is_parallel(b * t * half))
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti) {
      const int64_t row = bi * t + ti;
      const T* g = dv + row * 2 * half;
      T* dcur = dvcur + row * half;
#pragma omp simd
      for (int64_t j = 0; j < half; ++j) dcur[j] += g[j];
      if (ti + 1 < t) {
        const T* g_next = dv + (row + 1) * 2 * half + half;
        T* dprev = dvprev_in + row * half;
#pragma omp simd
        for (int64_t j = 0; j < half; ++j) dprev[j] += g_next[j];
      }
    }
}

// ---- QK-norm -------------------------------------------------------------------------------

// Σ a[j]·b[j] over n: element j into lane j % kDotLanes, the lanes added pairwise; the order
// is the code's, not the vector width's.
constexpr int64_t kDotLanes = 16;

template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  T lane[kDotLanes] = {};
  int64_t j = 0;
  for (; j + kDotLanes <= n; j += kDotLanes)
#pragma omp simd
    for (int64_t l = 0; l < kDotLanes; ++l) lane[l] += a[j + l] * b[j + l];
  for (int64_t l = 0; j + l < n; ++l) lane[l] += a[j + l] * b[j + l];
  for (int64_t width = kDotLanes / 2; width > 0; width /= 2)
    for (int64_t l = 0; l < width; ++l) lane[l] += lane[l + width];
  return lane[0];
}

// One row of each (the row's G heads). Forward: q_row [Hq·d], k_row [Hk·d], rnorm_row [G]
// from qk_row [C]. Backward: dqk_row [C] +=, and each key head's dτ added to dtemp_part [Hk].
template <typename T>
inline void qk_norm_forward_row(T* q_row, T* k_row, T* rnorm_row, const T* qk_row,
                                const T* temp, int64_t hq, int64_t hk, int64_t d, T eps) {
  const T sqrt_d = std::sqrt(static_cast<T>(d));
  for (int64_t h = 0; h < hq + hk; ++h) {
    const T* x = qk_row + h * d;
    const T r = T(1) / std::sqrt(dot(x, x, d) + eps);
    rnorm_row[h] = r;
    const bool is_key = h >= hq;
    const T scale = sqrt_d * r * (is_key ? temp[h - hq] : T(1));
    T* out = is_key ? k_row + (h - hq) * d : q_row + h * d;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) out[j] = x[j] * scale;
  }
}

// Per head with s = √d·τ (τ = temp[j] for keys, 1 for queries), r = 1/‖x‖, out = s·r·x:
//   dx = s·r·dout − s·r³·<x, dout>·x,   dτ = √d·r·<x, dout>.
template <typename T>
inline void qk_norm_backward_row(T* dqk_row, T* dtemp_part, const T* dq_row, const T* dk_row,
                                 const T* qk_row, const T* rnorm_row, const T* temp, int64_t hq,
                                 int64_t hk, int64_t d) {
  const T sqrt_d = std::sqrt(static_cast<T>(d));
  for (int64_t h = 0; h < hq + hk; ++h) {
    const bool is_key = h >= hq;
    const T* x = qk_row + h * d;
    const T* g = is_key ? dk_row + (h - hq) * d : dq_row + h * d;
    T* dx = dqk_row + h * d;
    const T x_dot_g = dot(x, g, d);
    const T r = rnorm_row[h];
    const T s_r = sqrt_d * r * (is_key ? temp[h - hq] : T(1));
    const T coef = s_r * r * r * x_dot_g;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) dx[j] += s_r * g[j] - coef * x[j];
    if (is_key) dtemp_part[h - hq] += sqrt_d * r * x_dot_g;
  }
}

template <typename T>
void cca_qk_norm_forward(T* q, T* k, T* rnorm, const T* qk, const T* temp, int64_t n, int64_t hq,
                         int64_t hk, int64_t d, T eps) {
  check_heads(hq, hk, d);
  const int64_t heads = hq + hk, channels = heads * d;
#pragma omp parallel for schedule(static) if (is_parallel(n * channels))
  for (int64_t row = 0; row < n; ++row)
    qk_norm_forward_row(q + row * hq * d, k + row * hk * d, rnorm + row * heads,
                        qk + row * channels, temp, hq, hk, d, eps);
}

template <typename T>
void cca_means_qk_norm_forward(T* q, T* k, T* rnorm, T* qk, const T* c, const T* b1,
                               const T* temp, int64_t n, int64_t hq, int64_t hk, int64_t d,
                               T eps) {
  check_heads(hq, hk, d);
  const int64_t heads = hq + hk, channels = heads * d;
#pragma omp parallel for schedule(static) if (is_parallel(n * channels))
  for (int64_t row = 0; row < n; ++row) {
    T* qk_row = qk + row * channels;
    if (b1)
#pragma omp simd
      for (int64_t j = 0; j < channels; ++j) qk_row[j] += b1[j];
    means_forward_row(qk_row, c + row * channels, hq, hk, d);
    qk_norm_forward_row(q + row * hq * d, k + row * hk * d, rnorm + row * heads, qk_row, temp, hq,
                        hk, d, eps);
  }
}

void detail::cca_means_qk_norm_grouped_rows(float* q, float* k, float* rnorm, float* qk,
                                            const float* qk_groups, int64_t group_rows,
                                            const float* c, const float* b1, const float* temp,
                                            int64_t row_begin, int64_t row_end, int64_t hq,
                                            int64_t hk, int64_t d, float eps) {
  const int64_t heads = hq + hk, channels = heads * d;
  for (int64_t row = row_begin; row < row_end; ++row) {
    float* qk_row = qk + row * channels;
    detail::cca_group_row(qk_row, qk_groups, b1, row - row_begin, heads, group_rows, d);
    means_forward_row(qk_row, c + row * channels, hq, hk, d);
    qk_norm_forward_row(q + row * hq * d, k + row * hk * d, rnorm + row * heads, qk_row, temp, hq,
                        hk, d, eps);
  }
}

namespace {

// dtemp: each row's dτ [Hk] on its own (row(r, part) adds row r's into a zeroed part), then
// summed by detail::cca_sum_row_dtemp: the same bits with any thread count, and with the rows
// in any tasks (the blocked backward, kernels/cca_gemm.cpp, keeps each row's dτ and sums them
// so). The zeroed part is what makes that possible: added straight into a running sum, a
// row's product would be contracted into a fused multiply-add with it and rounded once, not
// twice.
template <typename T, typename Row>
void rows_with_dtemp(T* dtemp, int64_t n, int64_t hk, bool parallel, Row row) {
  thread_local detail::ScratchBuffer<T> row_buffer;
  T* rows = row_buffer.get(std::max<int64_t>(n * hk, 1));
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < n; ++r) {
    T* part = rows + r * hk;
    std::fill(part, part + hk, T(0));
    row(r, part);
  }
  detail::cca_sum_row_dtemp(dtemp, rows, n, hk);
}

}  // namespace

template <typename T>
void cca_qk_norm_backward(T* dqk, T* dtemp, const T* dq, const T* dk, const T* qk, const T* rnorm,
                          const T* temp, int64_t n, int64_t hq, int64_t hk, int64_t d) {
  check_heads(hq, hk, d);
  const int64_t heads = hq + hk, channels = heads * d;
  rows_with_dtemp(dtemp, n, hk, is_parallel(n * channels), [&](int64_t row, T* partial) {
    qk_norm_backward_row(dqk + row * channels, partial, dq + row * hq * d, dk + row * hk * d,
                         qk + row * channels, rnorm + row * heads, temp, hq, hk, d);
  });
}

template <typename T>
void cca_qk_norm_means_backward(T* dqk, T* dc, T* dtemp, const T* dq, const T* dk, const T* qk,
                                const T* rnorm, const T* temp, int64_t n, int64_t hq, int64_t hk,
                                int64_t d) {
  check_heads(hq, hk, d);
  const int64_t heads = hq + hk, channels = heads * d;
  rows_with_dtemp(dtemp, n, hk, is_parallel(n * channels), [&](int64_t row, T* partial) {
    T* dqk_row = dqk + row * channels;
    T* dc_row = dc + row * channels;
    std::fill(dqk_row, dqk_row + channels, T(0));
    qk_norm_backward_row(dqk_row, partial, dq + row * hq * d, dk + row * hk * d,
                         qk + row * channels, rnorm + row * heads, temp, hq, hk, d);
    std::fill(dc_row, dc_row + channels, T(0));
    means_backward_row(dc_row, dqk_row, hq, hk, d);
  });
}

void detail::cca_qk_norm_means_backward_row(float* dqk_row, float* dc_row, float* dtemp_part,
                                            const float* dq, const float* dk, const float* qk,
                                            const float* rnorm, const float* temp, int64_t row,
                                            int64_t hq, int64_t hk, int64_t d) {
  const int64_t heads = hq + hk, channels = heads * d;
  std::fill(dqk_row, dqk_row + channels, 0.0f);
  qk_norm_backward_row(dqk_row, dtemp_part, dq + row * hq * d, dk + row * hk * d,
                       qk + row * channels, rnorm + row * heads, temp, hq, hk, d);
  if (!dc_row) return;
  std::fill(dc_row, dc_row + channels, 0.0f);
  means_backward_row(dc_row, dqk_row, hq, hk, d);
}

// ---- decode --------------------------------------------------------------------------------

template <typename T>
CcaDecodeState<T>::CcaDecodeState(const CcaDims& dims_in, int64_t batch_in)
    : dims(dims_in), batch(batch_in) {
  dims.validate();
  FOUNDRY_CHECK(batch >= 0);
  data.assign(batch * decode_state_floats(dims), T(0));
}

template <typename T>
std::vector<T*> CcaDecodeState<T>::rows() {
  std::vector<T*> r;
  for (int64_t b = 0; b < batch; ++b) r.push_back(sequence(b));
  return r;
}

template <typename T>
void cca_decode_state_load(CcaDecodeState<T>& state, const T* c, const T* y, const T* b0,
                           const T* v_last, int64_t t) {
  FOUNDRY_CHECK(t >= 0);
  const CcaDims& dims = state.dims;
  const int64_t channels = dims.channels(), half = dims.value_half();
  // hist [window, C] = rows t − window … t − 1 of seq [T, C] less `bias` when set (zero
  // before position 0).
  auto load_window = [&](T* hist, const T* seq, int64_t window, const T* bias) {
    for (int64_t i = 0; i < window; ++i) {
      const int64_t src = t - window + i;
      T* dst = hist + i * channels;
      if (src < 0) {
        std::fill(dst, dst + channels, T(0));
        continue;
      }
      for (int64_t ch = 0; ch < channels; ++ch)
        dst[ch] = seq[src * channels + ch] - (bias ? bias[ch] : T(0));
    }
  };
  for (int64_t bi = 0; bi < state.batch; ++bi) {
    T* s = state.sequence(bi);
    load_window(decode_c_hist(s, dims), c + bi * t * channels, dims.t0 - 1, nullptr);
    load_window(decode_y_hist(s, dims), y + bi * t * channels, dims.t1 - 1, b0);
    T* v_prev = decode_v_prev(s, dims);
    if (v_last)
      std::copy(v_last + bi * half, v_last + (bi + 1) * half, v_prev);
    else
      std::fill(v_prev, v_prev + half, T(0));
  }
}

// The depthwise step sums the taps oldest first, from zero (the state keeps the sums; the
// window adds b0 to each, so a zero state reads b0 before position 0). The grouped
// step: each output is the dot product of its row w1[grp, o, :, :] (d·t1 contiguous elements)
// with the window interleaved the same way, window[grp, ci, i], one row at a time, so a
// sequence's outputs are the same bits whatever other sequences share the step (a matmul
// batched over the rows rounds differently for different row counts).
template <typename T>
void cca_conv_decode(T* qk, const CcaDims& dims, T* const* states, int64_t rows, const T* c_new,
                     const T* w0, const T* b0, const T* w1, const T* b1) {
  const int64_t channels = dims.channels(), d = dims.d, t0 = dims.t0, t1 = dims.t1;
  thread_local detail::ScratchBuffer<T> window_buffer;
  T* window = window_buffer.get(std::max<int64_t>(rows * channels * t1, 1));  // [rows, C, t1]
  thread_local detail::ScratchBuffer<T> sums_buffer;
  T* sums = sums_buffer.get(channels);  // a row's depthwise taps' sums

  // In row order: a row that shares its state with an earlier one reads it as that row left it.
  for (int64_t bi = 0; bi < rows; ++bi) {
    T* c_hist = decode_c_hist(states[bi], dims);
    T* y_hist = decode_y_hist(states[bi], dims);
    const T* c_row = c_new + bi * channels;
    T* win = window + bi * channels * t1;
    for (int64_t ch = 0; ch < channels; ++ch) {
      T taps_sum = 0;
      for (int64_t i = 0; i < t0 - 1; ++i) taps_sum += w0[ch * t0 + i] * c_hist[i * channels + ch];
      taps_sum += w0[ch * t0 + t0 - 1] * c_row[ch];
      for (int64_t i = 0; i < t1 - 1; ++i) win[ch * t1 + i] = b0[ch] + y_hist[i * channels + ch];
      win[ch * t1 + t1 - 1] = b0[ch] + taps_sum;
      if (t1 > 1) sums[ch] = taps_sum;
    }
    // Advance both windows by one row.
    if (t0 > 1) {
      std::copy(c_hist + channels, c_hist + (t0 - 1) * channels, c_hist);
      std::copy(c_row, c_row + channels, c_hist + (t0 - 2) * channels);
    }
    if (t1 > 1) {
      std::copy(y_hist + channels, y_hist + (t1 - 1) * channels, y_hist);
      std::copy(sums, sums + channels, y_hist + (t1 - 2) * channels);
    }
  }

  {
    const int64_t row_len = d * t1;
    const bool parallel = is_parallel(rows * channels * row_len / 8);
#pragma omp parallel for collapse(2) schedule(static) if (parallel)
    for (int64_t bi = 0; bi < rows; ++bi)
      for (int64_t out = 0; out < channels; ++out) {
        const T* w = w1 + out * row_len;
        const T* x = window + bi * channels * t1 + (out / d) * row_len;
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t k = 0; k < row_len; ++k) sum += w[k] * x[k];
        qk[bi * channels + out] = b1[out] + sum;
      }
  }
}

template <typename T>
void cca_value_shift_decode(T* v, const CcaDims& dims, T* const* states, int64_t rows) {
  const int64_t half = dims.value_half();
  for (int64_t bi = 0; bi < rows; ++bi)
    std::swap_ranges(v + bi * 2 * half + half, v + (bi + 1) * 2 * half,
                     decode_v_prev(states[bi], dims));
}

#define FOUNDRY_INSTANTIATE(T)                                                                    \
  template void cca_means_forward<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t);           \
  template void cca_means_qk_norm_forward<T>(T*, T*, T*, T*, const T*, const T*, const T*,        \
                                             int64_t, int64_t, int64_t, int64_t, T);              \
  template void cca_qk_norm_means_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, \
                                              const T*, int64_t, int64_t, int64_t, int64_t);      \
  template void cca_means_backward<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t);          \
  template void cca_depthwise_conv_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, \
                                              int64_t, int64_t);                                  \
  template void cca_depthwise_conv_backward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, \
                                               int64_t, int64_t, int64_t);                        \
  template void cca_grouped_conv_forward<T>(T*, const T*, const T*, const T*, const T*, int64_t,  \
                                            int64_t, int64_t, int64_t, int64_t);                  \
  template void cca_grouped_conv_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*,        \
                                             const T*, int64_t, int64_t, int64_t, int64_t,        \
                                             int64_t);                                            \
  template void cca_grouped_conv_before_backward<T>(T*, const T*, int64_t, const T*, int64_t,     \
                                                    int64_t, int64_t, int64_t, int64_t);          \
  template void cca_value_shift_inplace_forward<T>(T*, T*, int64_t, int64_t, int64_t);            \
  template void cca_value_shift_inplace_backward<T>(T*, int64_t, int64_t, int64_t);               \
  template void cca_value_shift_forward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t);    \
  template void cca_value_shift_backward<T>(T*, T*, const T*, int64_t, int64_t, int64_t);         \
  template void cca_qk_norm_forward<T>(T*, T*, T*, const T*, const T*, int64_t, int64_t, int64_t, \
                                       int64_t, T);                                               \
  template void cca_qk_norm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                        int64_t, int64_t, int64_t, int64_t);                      \
  template struct CcaDecodeState<T>;                                                              \
  template void cca_decode_state_load<T>(CcaDecodeState<T>&, const T*, const T*, const T*,        \
                                         const T*, int64_t);                                      \
  template void cca_conv_decode<T>(T*, const CcaDims&, T* const*, int64_t, const T*, const T*,    \
                                   const T*, const T*, const T*);                                 \
  template void cca_value_shift_decode<T>(T*, const CcaDims&, T* const*, int64_t);
FOUNDRY_INSTANTIATE(float)
FOUNDRY_INSTANTIATE(double)
#undef FOUNDRY_INSTANTIATE

}  // namespace foundry::ops
