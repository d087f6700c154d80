// cca.h's kernels. Elementwise work goes by rows and columns (rows_launch), up to 4 columns a
// thread; the reductions over tokens write one partial per fixed chunk of rows, then one thread
// per parameter sums the chunks in order. The grouped convolution is cuBLASLt products (fp32)
// over stacked rows.
#include <cuda_runtime.h>

#include <cmath>
#include <initializer_list>

#include "cuda/cca.h"
#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/launch.cuh"
#include "cuda/lt_matmul.h"
#include "cuda/zaya.h"

namespace foundry::gpu::ops {

namespace {

constexpr int kThreads = kBlockThreads;
constexpr int64_t kRowsPerChunk = 32;  // depthwise conv and temperature partials

template <int W>
__device__ inline Lanes<W> zero_lanes() {
  Lanes<W> l;
  for (int i = 0; i < W; ++i) l.v[i] = 0.0f;
  return l;
}

// ---- means ----

// Rows of [N, C] by rows_launch, W dims x a thread at a time, for each KV head j: the group's g
// query heads and the key. Rounded as nvcc compiled the thread per (row, j, x) this replaced:
// mq = (q + k)·0.5 never rounded alone, fused into both its sums (FMAs), and mk's sum·(1/g)
// fused with its addition.
template <int W>
__global__ void means_forward_kernel(float* qk, const float* c, int64_t n, int64_t hq, int64_t hk,
                                     int64_t d) {
  const int64_t g = hq / hk, channels = (hq + hk) * d;
  const float inv_g = 1.0f / static_cast<float>(g);
  FOUNDRY_FOR_EACH_ROW(row, n) {
    const float* q0 = c + row * channels;
    float* out_q = qk + row * channels;
    FOUNDRY_FOR_EACH_COL(xq, d / W) {
      const int64_t x = xq * W;
      for (int64_t j = 0; j < hk; ++j) {
        const Lanes<W> kj = load_lanes<W>(q0 + hq * d + j * d + x);
        Lanes<W> sum = zero_lanes<W>();
        for (int64_t h = j * g; h < (j + 1) * g; ++h) {
          const Lanes<W> qh = load_lanes<W>(q0 + h * d + x);
          Lanes<W> out = load_lanes<W>(out_q + h * d + x);
          for (int l = 0; l < W; ++l) {
            const float q_plus_k = qh.v[l] + kj.v[l];
            out.v[l] = __fmaf_rn(q_plus_k, 0.5f, out.v[l]);
            sum.v[l] = __fmaf_rn(q_plus_k, 0.5f, sum.v[l]);
          }
          store_lanes<W>(out_q + h * d + x, out);
        }
        Lanes<W> out = load_lanes<W>(out_q + hq * d + j * d + x);
        for (int l = 0; l < W; ++l) out.v[l] = __fmaf_rn(sum.v[l], inv_g, out.v[l]);
        store_lanes<W>(out_q + hq * d + j * d + x, out);
      }
    }
  }
}

// As nvcc compiled the thread per (row, j, x): dmq·0.5 fused with dmk·(1/2g) (rounded), that
// added to dq0; (Σ dmq + dmk)·0.5 fused with its addition. dc and dqk are separate arrays.
template <int W>
__global__ void means_backward_kernel(float* dc, const float* dqk, int64_t n, int64_t hq,
                                      int64_t hk, int64_t d) {
  const int64_t g = hq / hk, channels = (hq + hk) * d;
  const float half_inv_g = 0.5f / static_cast<float>(g);
  FOUNDRY_FOR_EACH_ROW(row, n) {
    const float* dmq = dqk + row * channels;
    float* dq0 = dc + row * channels;
    FOUNDRY_FOR_EACH_COL(xq, d / W) {
      const int64_t x = xq * W;
      for (int64_t j = 0; j < hk; ++j) {
        const Lanes<W> dmk = load_lanes<W>(dmq + hq * d + j * d + x);
        Lanes<W> from_mk, sum = zero_lanes<W>();
        for (int l = 0; l < W; ++l) from_mk.v[l] = dmk.v[l] * half_inv_g;
        for (int64_t h = j * g; h < (j + 1) * g; ++h) {
          const Lanes<W> dm = load_lanes<W>(dmq + h * d + x);
          Lanes<W> out = load_lanes<W>(dq0 + h * d + x);
          for (int l = 0; l < W; ++l) {
            out.v[l] += __fmaf_rn(dm.v[l], 0.5f, from_mk.v[l]);
            sum.v[l] += dm.v[l];
          }
          store_lanes<W>(dq0 + h * d + x, out);
        }
        Lanes<W> out = load_lanes<W>(dq0 + hq * d + j * d + x);
        for (int l = 0; l < W; ++l)
          out.v[l] = __fmaf_rn(sum.v[l] + dmk.v[l], 0.5f, out.v[l]);
        store_lanes<W>(dq0 + hq * d + j * d + x, out);
      }
    }
  }
}

// ---- depthwise convolution ----

// Rows of [B·T, C] by rows_launch, W channels k a thread at a time; acc += w·x as one FMA per
// tap, as nvcc compiled the thread per element.
template <int W>
__global__ void depthwise_forward_kernel(float* y, const float* c, const float* w0,
                                         const float* b0, int64_t b, int64_t t, int64_t ch,
                                         int64_t taps) {
  FOUNDRY_FOR_EACH_ROW(row, b * t) {
    const int64_t pos = row % t;
    FOUNDRY_FOR_EACH_COL(q, ch / W) {
      const int64_t k = q * W;
      Lanes<W> acc = load_lanes<W>(b0 + k);
      for (int64_t i = 0; i < taps; ++i) {
        const int64_t src = pos - (taps - 1) + i;
        if (src >= 0) {
          const Lanes<W> x = load_lanes<W>(c + (row - pos + src) * ch + k);
          for (int l = 0; l < W; ++l)
            acc.v[l] = __fmaf_rn(w0[(k + l) * taps + i], x.v[l], acc.v[l]);
        }
      }
      store_lanes<W>(y + row * ch + k, acc);
    }
  }
}

// dc: position s receives w0[k, i]·dy at s + (taps−1) − i (FMAs into acc, then one addition).
template <int W>
__global__ void depthwise_input_grad_kernel(float* dc, const float* dy, const float* w0, int64_t b,
                                            int64_t t, int64_t ch, int64_t taps) {
  FOUNDRY_FOR_EACH_ROW(row, b * t) {
    const int64_t pos = row % t;
    FOUNDRY_FOR_EACH_COL(q, ch / W) {
      const int64_t k = q * W;
      Lanes<W> acc = zero_lanes<W>();
      for (int64_t i = 0; i < taps; ++i) {
        const int64_t dst = pos + (taps - 1) - i;
        if (dst < t) {
          const Lanes<W> g = load_lanes<W>(dy + (row - pos + dst) * ch + k);
          for (int l = 0; l < W; ++l)
            acc.v[l] = __fmaf_rn(w0[(k + l) * taps + i], g.v[l], acc.v[l]);
        }
      }
      Lanes<W> out = load_lanes<W>(dc + row * ch + k);
      for (int l = 0; l < W; ++l) out.v[l] += acc.v[l];
      store_lanes<W>(dc + row * ch + k, out);
    }
  }
}

// partials [chunks, ch·(taps + 1)]: per channel, the taps' weight gradients then the bias's.
// Chunks by rows_launch, an element e a thread; the position within the sequence advances with
// the row (no remainder per row), acc += g·x as one FMA as nvcc compiled it.
__global__ void depthwise_param_partials_kernel(float* partials, const float* dy, const float* c,
                                                int64_t n, int64_t t, int64_t ch, int64_t taps) {
  const int64_t per_chunk = ch * (taps + 1), chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
  FOUNDRY_FOR_EACH_ROW(chunk, chunks) {
    const int64_t first = chunk * kRowsPerChunk, end = min(n, first + kRowsPerChunk);
    const int64_t first_pos = first % t;
    FOUNDRY_FOR_EACH_COL(e, per_chunk) {
      const int64_t k = e / (taps + 1), i = e % (taps + 1);  // i == taps: the bias
      float acc = 0;
      int64_t pos = first_pos;  // row % t
      for (int64_t row = first; row < end; ++row) {
        const float g = dy[row * ch + k];
        if (i == taps) {
          acc += g;
        } else {
          const int64_t src = pos - (taps - 1) + i;
          if (src >= 0) acc = __fmaf_rn(g, c[(row - pos + src) * ch + k], acc);
        }
        if (++pos == t) pos = 0;
      }
      partials[chunk * per_chunk + e] = acc;
    }
  }
}

// params[e] += Σ_chunk partials[chunk, e] for e < count, into the weight (e's first part) and
// bias arrays as `split` says: element e = k·(taps+1) + i goes to w[k·taps + i] (i < taps) or
// bias[k] (i == taps).
__global__ void depthwise_param_sum_kernel(float* dw0, float* db0, const float* partials,
                                           int64_t chunks, int64_t ch, int64_t taps) {
  const int64_t per_chunk = ch * (taps + 1);
  FOUNDRY_FOR_EACH(e, per_chunk) {
    float acc = 0;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) acc += partials[chunk * per_chunk + e];
    const int64_t k = e / (taps + 1), i = e % (taps + 1);
    if (i == taps) db0[k] += acc;
    else dw0[k * taps + i] += acc;
  }
}

// ---- grouped convolution: products through cuBLASLt, one per group with the taps stacked in K
// (as the CPU's cca_gemm.cpp does) ----

// One group's rows [N, taps·d]: tap i of row r holds input row r − (taps−1) + i (the forward's
// window), or r + (taps−1) − i when `ahead` (the input gradient's); where that falls before
// r's sequence, the group's `before` [d] (zero where null), and after it zero. `in` is the
// group's first column, its rows ld apart. Rows r by rows_launch, W columns of every tap a
// thread at a time.
template <int W>
__global__ void stack_taps_kernel(float* out, const float* in, const float* before, int64_t ld,
                                  int64_t n, int64_t t, int64_t d, int64_t taps, bool ahead) {
  FOUNDRY_FOR_EACH_ROW(row, n) {
    const int64_t pos = row % t;
    float* out_row = out + row * taps * d;
    FOUNDRY_FOR_EACH_COL(q, d / W) {
      const int64_t col = q * W;
      for (int64_t i = 0; i < taps; ++i) {
        const int64_t src = ahead ? pos + (taps - 1) - i : pos - (taps - 1) + i;
        store_lanes<W>(out_row + i * d + col,
                       src >= 0 && src < t ? load_lanes<W>(in + (row - pos + src) * ld + col)
                       : src < 0 && before ? load_lanes<W>(before + col)
                                           : zero_lanes<W>());
      }
    }
  }
}

// dbefore[grp, ci] += Σ_{p<P} Σ_{i < taps−1−p} Σ_o w1[grp, o, ci, i] · Σ_b dz[b, p, grp, o]
// (P = min(T, taps−1)), in ops::cca_grouped_conv_before_backward's order: a thread per
// channel, the sums over the sequences redone for each (P·d·B reads: the first rows only).
__global__ void before_gradient_kernel(float* dbefore, const float* dz, const float* w1,
                                       int64_t b, int64_t t, int64_t groups, int64_t d,
                                       int64_t taps) {
  const int64_t ch = groups * d, rows = min(t, taps - 1);
  FOUNDRY_FOR_EACH(e, ch) {
    const int64_t grp = e / d, ci = e % d;
    float acc = 0;
    for (int64_t p = 0; p < rows; ++p)
      for (int64_t i = 0; i < taps - 1 - p; ++i)
        for (int64_t o = 0; o < d; ++o) {
          float sum = 0;
          for (int64_t s = 0; s < b; ++s) sum += dz[(s * t + p) * ch + grp * d + o];
          acc += w1[((grp * d + o) * d + ci) * taps + i] * sum;
        }
    dbefore[e] += acc;
  }
}

// The three kernels over w1 go by rows oc of [G·d (out)], columns ci (in) a thread, every tap.
// w1 [G·d (out), d (in), taps] as [G][out][tap][in]: each group's forward operand, K = (tap, in).
__global__ void weights_out_major_kernel(float* r, const float* w1, int64_t groups, int64_t d,
                                         int64_t taps) {
  FOUNDRY_FOR_EACH_ROW(oc, groups * d) {
    FOUNDRY_FOR_EACH_COL(ci, d) {
      for (int64_t i = 0; i < taps; ++i) r[(oc * taps + i) * d + ci] = w1[(oc * d + ci) * taps + i];
    }
  }
}

// w1 as [G][tap][out][in]: each group's operand of the input gradient, K = (tap, out).
__global__ void weights_tap_major_kernel(float* r, const float* w1, int64_t groups, int64_t d,
                                         int64_t taps) {
  FOUNDRY_FOR_EACH_ROW(oc, groups * d) {
    const int64_t g = oc / d, o = oc % d;
    FOUNDRY_FOR_EACH_COL(ci, d) {
      for (int64_t i = 0; i < taps; ++i)
        r[((g * taps + i) * d + o) * d + ci] = w1[((g * d + o) * d + ci) * taps + i];
    }
  }
}

// dw1 [G·d, d, taps] += the products' [G][out][tap][in].
__global__ void add_weight_grads_kernel(float* dw1, const float* by_tap, int64_t groups, int64_t d,
                                        int64_t taps) {
  FOUNDRY_FOR_EACH_ROW(oc, groups * d) {
    FOUNDRY_FOR_EACH_COL(ci, d) {
      for (int64_t i = 0; i < taps; ++i)
        dw1[(oc * d + ci) * taps + i] += by_tap[(oc * taps + i) * d + ci];
    }
  }
}

template <int W>
__global__ void broadcast_rows_kernel(float* z, const float* bias, int64_t n, int64_t ch) {
  FOUNDRY_FOR_EACH_ROW(r, n) {
    FOUNDRY_FOR_EACH_COL(q, ch / W) store_lanes<W>(z + r * ch + q * W, load_lanes<W>(bias + q * W));
  }
}

// stack_taps_kernel's launch: W = 4 where d, ld and the pointers allow.
void launch_stack_taps(float* out, const float* in, const float* before, int64_t ld, int64_t n,
                       int64_t t, int64_t d, int64_t taps, bool ahead) {
  launch_rows(lanes_for(d, ld, {out, in, before}) == 4, n, d, stack_taps_kernel<4>,
              stack_taps_kernel<1>, out, in, before, ld, n, t, d, taps, ahead);
}

__global__ void value_shift_forward_kernel(float* v, float* last_out, int64_t b, int64_t t,
                                           int64_t half) {
  FOUNDRY_FOR_EACH(index, b * half) {
    const int64_t seq = index / half, j = index % half;
    float* col = v + seq * t * 2 * half + half + j;  // second half, position 0
    if (last_out) last_out[seq * half + j] = t > 0 ? col[(t - 1) * 2 * half] : 0.0f;
    for (int64_t pos = t - 1; pos > 0; --pos) col[pos * 2 * half] = col[(pos - 1) * 2 * half];
    if (t > 0) col[0] = 0;
  }
}

__global__ void value_shift_backward_kernel(float* dv, int64_t b, int64_t t, int64_t half) {
  FOUNDRY_FOR_EACH(index, b * half) {
    const int64_t seq = index / half, j = index % half;
    float* col = dv + seq * t * 2 * half + half + j;
    for (int64_t pos = 0; pos + 1 < t; ++pos) col[pos * 2 * half] = col[(pos + 1) * 2 * half];
    if (t > 0) col[(t - 1) * 2 * half] = 0;
  }
}

// ---- QK norm: one warp per (row, head) ----

__global__ void qk_norm_forward_kernel(float* q, float* k, float* rnorm, const float* qk,
                                       const float* temp, int64_t n, int64_t hq, int64_t hk,
                                       int64_t d, float eps) {
  const int64_t heads = hq + hk, channels = heads * d;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= n * heads) return;
  const int64_t row = warp / heads, h = warp % heads;
  const float* x = qk + row * channels + h * d;
  float sum_sq = 0;
  for (int64_t j = lane; j < d; j += 32) sum_sq += x[j] * x[j];
  sum_sq = warp_sum(sum_sq);
  const float r = 1.0f / sqrtf(sum_sq + eps);
  if (lane == 0) rnorm[row * heads + h] = r;
  const bool is_key = h >= hq;
  const float scale = sqrtf(static_cast<float>(d)) * r * (is_key ? temp[h - hq] : 1.0f);
  float* out = is_key ? k + (row * hk + (h - hq)) * d : q + (row * hq + h) * d;
  for (int64_t j = lane; j < d; j += 32) out[j] = x[j] * scale;
}

// dqk +=; dtemp_rows [N, Hk] (writes) = √d·r·<x, dk> per row and KV head, summed later.
__global__ void qk_norm_backward_kernel(float* dqk, float* dtemp_rows, const float* dq,
                                        const float* dk, const float* qk, const float* rnorm,
                                        const float* temp, int64_t n, int64_t hq, int64_t hk,
                                        int64_t d) {
  const int64_t heads = hq + hk, channels = heads * d;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= n * heads) return;
  const int64_t row = warp / heads, h = warp % heads;
  const bool is_key = h >= hq;
  const float* x = qk + row * channels + h * d;
  const float* g = is_key ? dk + (row * hk + (h - hq)) * d : dq + (row * hq + h) * d;
  float* dx = dqk + row * channels + h * d;
  float x_dot_g = 0;
  for (int64_t j = lane; j < d; j += 32) x_dot_g += x[j] * g[j];
  x_dot_g = warp_sum(x_dot_g);
  const float sqrt_d = sqrtf(static_cast<float>(d));
  const float r = rnorm[row * heads + h];
  const float s_r = sqrt_d * r * (is_key ? temp[h - hq] : 1.0f);
  const float coef = s_r * r * r * x_dot_g;
  for (int64_t j = lane; j < d; j += 32) dx[j] += s_r * g[j] - coef * x[j];
  if (is_key && lane == 0) dtemp_rows[row * hk + (h - hq)] = sqrt_d * r * x_dot_g;
}

// dtemp[j] += Σ over chunks (in order) of the chunk's rows (in order).
__global__ void temp_sum_kernel(float* dtemp, const float* rows, int64_t n, int64_t hk) {
  FOUNDRY_FOR_EACH(j, hk) {
    float total = dtemp[j];
    for (int64_t c0 = 0; c0 < n; c0 += kRowsPerChunk) {
      float partial = 0;
      for (int64_t row = c0; row < min(n, c0 + kRowsPerChunk); ++row) partial += rows[row * hk + j];
      total += partial;
    }
    dtemp[j] = total;
  }
}

}  // namespace

void cca_means_forward(float* qk, const float* c, int64_t n, int64_t hq, int64_t hk, int64_t d) {
  launch_rows(lanes_for(d, (hq + hk) * d, {qk, c}) == 4, n, d, means_forward_kernel<4>,
              means_forward_kernel<1>, qk, c, n, hq, hk, d);
}

void cca_means_backward(float* dc, const float* dqk, int64_t n, int64_t hq, int64_t hk, int64_t d) {
  launch_rows(lanes_for(d, (hq + hk) * d, {dc, dqk}) == 4, n, d, means_backward_kernel<4>,
              means_backward_kernel<1>, dc, dqk, n, hq, hk, d);
}

void cca_depthwise_conv_forward(float* y, const float* c, const float* w0, const float* b0,
                                int64_t b, int64_t t, int64_t channels, int64_t taps) {
  launch_rows(lanes_for(channels, channels, {y, c, b0}) == 4, b * t, channels,
              depthwise_forward_kernel<4>, depthwise_forward_kernel<1>, y, c, w0, b0, b, t,
              channels, taps);
}

int64_t cca_depthwise_conv_scratch(int64_t b, int64_t t, int64_t channels, int64_t taps) {
  return (b * t + kRowsPerChunk - 1) / kRowsPerChunk * channels * (taps + 1);
}

void cca_depthwise_conv_backward(float* dc, float* dw0, float* db0, const float* dy,
                                 const float* c, const float* w0, int64_t b, int64_t t,
                                 int64_t channels, int64_t taps, float* scratch) {
  const int64_t n = b * t;
  if (n == 0) return;
  launch_rows(lanes_for(channels, channels, {dc, dy}) == 4, n, channels,
              depthwise_input_grad_kernel<4>, depthwise_input_grad_kernel<1>, dc, dy, w0, b, t,
              channels, taps);
  const RowsLaunch partials =
      rows_launch((n + kRowsPerChunk - 1) / kRowsPerChunk, channels * (taps + 1));
  depthwise_param_partials_kernel<<<partials.grid, partials.block>>>(scratch, dy, c, n, t,
                                                                      channels, taps);
  check_launch();
  depthwise_param_sum_kernel<<<blocks_for(channels * (taps + 1)), kThreads>>>(
      dw0, db0, scratch, (n + kRowsPerChunk - 1) / kRowsPerChunk, channels, taps);
  check_launch();
}

// Scratch layouts, in floats: forward [weights G·d·taps·d | stacked rows N·taps·d]; backward
// [weights | stacked rows | weight gradients G·d·taps·d | bias column sums].
int64_t cca_grouped_conv_forward_scratch(int64_t b, int64_t t, int64_t groups, int64_t d,
                                         int64_t taps) {
  return groups * d * taps * d + b * t * taps * d;
}

void cca_grouped_conv_forward(float* z, const float* y, const float* w1, const float* b1,
                              const float* before, int64_t b, int64_t t, int64_t groups, int64_t d,
                              int64_t taps, float* scratch) {
  const int64_t n = b * t, ch = groups * d, k = taps * d;
  if (n == 0) return;
  float* weights = scratch;
  float* rows = scratch + groups * d * k;
  const RowsLaunch by_weight_row = rows_launch(groups * d, d);
  weights_out_major_kernel<<<by_weight_row.grid, by_weight_row.block>>>(weights, w1, groups, d,
                                                                        taps);
  check_launch();
  if (b1) {
    launch_rows(lanes_for(ch, ch, {z, b1}) == 4, n, ch, broadcast_rows_kernel<4>,
                broadcast_rows_kernel<1>, z, b1, n, ch);
  }
  for (int64_t g = 0; g < groups; ++g) {
    launch_stack_taps(rows, y + g * d, before ? before + g * d : nullptr, ch, n, t, d, taps,
                      false);
    // z[:, g] (+)= rows · weights_gᵀ: [N, taps·d] × [taps·d, d], into columns g·d of z.
    detail::lt_matmul(rows, false, weights + g * d * k, true, z + g * d, n, d, k, false,
                      b1 != nullptr, k, ch);
  }
}

int64_t cca_grouped_conv_scratch(int64_t b, int64_t t, int64_t groups, int64_t d, int64_t taps) {
  const int64_t ch = groups * d;
  return 2 * groups * d * taps * d + b * t * taps * d + column_sum_scratch(b * t, ch);
}

void cca_grouped_conv_backward(float* dy, float* dw1, float* db1, float* dbefore, const float* dz,
                               const float* y, const float* w1, const float* before, int64_t b,
                               int64_t t, int64_t groups, int64_t d, int64_t taps,
                               float* scratch) {
  const int64_t n = b * t, ch = groups * d, k = taps * d;
  if (n == 0) return;
  float* weights = scratch;
  float* rows = weights + groups * d * k;
  float* weight_grads = rows + n * k;
  float* column_scratch = weight_grads + groups * d * k;
  const RowsLaunch by_weight_row = rows_launch(groups * d, d);
  weights_tap_major_kernel<<<by_weight_row.grid, by_weight_row.block>>>(weights, w1, groups, d,
                                                                        taps);
  check_launch();
  for (int64_t g = 0; g < groups; ++g) {
    // dy[:, g] += dz's rows ahead, stacked, · weights_g: [N, taps·d] × [taps·d, d].
    launch_stack_taps(rows, dz + g * d, nullptr, ch, n, t, d, taps, true);
    detail::lt_matmul(rows, false, weights + g * d * k, false, dy + g * d, n, d, k, false, true, k,
                      ch);
    // The group's weight gradient [d, taps·d] = dz[:, g]ᵀ · y's rows behind, stacked.
    launch_stack_taps(rows, y + g * d, before ? before + g * d : nullptr, ch, n, t, d, taps,
                      false);
    detail::lt_matmul(dz + g * d, true, rows, false, weight_grads + g * d * k, d, k, n, false,
                      false, ch, k);
  }
  add_weight_grads_kernel<<<by_weight_row.grid, by_weight_row.block>>>(dw1, weight_grads, groups,
                                                                       d, taps);
  check_launch();
  bias_add_backward(db1, dz, n, ch, column_scratch);  // db1 += Σ rows of dz
  if (dbefore && taps > 1) {
    before_gradient_kernel<<<blocks_for(ch), kThreads>>>(dbefore, dz, w1, b, t, groups, d, taps);
    check_launch();
  }
}

void cca_value_shift_inplace_forward(float* v, float* last_out, int64_t b, int64_t t, int64_t half) {
  value_shift_forward_kernel<<<blocks_for(b * half), kThreads>>>(v, last_out, b, t, half);
  check_launch();
}

void cca_value_shift_inplace_backward(float* dv, int64_t b, int64_t t, int64_t half) {
  value_shift_backward_kernel<<<blocks_for(b * half), kThreads>>>(dv, b, t, half);
  check_launch();
}

void cca_qk_norm_forward(float* q, float* k, float* rnorm, const float* qk, const float* temp,
                         int64_t n, int64_t hq, int64_t hk, int64_t d, float eps) {
  qk_norm_forward_kernel<<<blocks_for(n * (hq + hk) * 32), kThreads>>>(q, k, rnorm, qk, temp, n,
                                                                       hq, hk, d, eps);
  check_launch();
}

int64_t cca_qk_norm_scratch(int64_t n, int64_t hk) { return n * hk; }

void cca_qk_norm_backward(float* dqk, float* dtemp, const float* dq, const float* dk,
                          const float* qk, const float* rnorm, const float* temp, int64_t n,
                          int64_t hq, int64_t hk, int64_t d, float* scratch) {
  qk_norm_backward_kernel<<<blocks_for(n * (hq + hk) * 32), kThreads>>>(
      dqk, scratch, dq, dk, qk, rnorm, temp, n, hq, hk, d);
  check_launch();
  temp_sum_kernel<<<1, 32>>>(dtemp, scratch, n, hk);
  check_launch();
}

}  // namespace foundry::gpu::ops
