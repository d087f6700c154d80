// decode.h's kernels. Attention runs one block per (row, query head): its scores, softmax and
// weighted sum in three passes, the block's reductions through shared memory in a fixed tree.
// The CCA state kernels give each thread whole channels of every row in row order, so rows
// that share a state see each other's updates without any synchronization.
#include <cuda_runtime.h>

#include <cmath>

#include "cuda/check.h"
#include "cuda/decode.h"
#include "cuda/device_math.cuh"
#include "cuda/launch.cuh"

namespace foundry::gpu::ops {

namespace {

constexpr int kThreads = kBlockThreads;
constexpr int kAttentionThreads = 128;  // a decode row's positions are few: small blocks
constexpr int64_t kDecodeBlock = 16;    // kernels/attention.h's key blocks

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  FOUNDRY_FOR_EACH(i, n) y[i] += x[i];
}

// ---- KV cache stores ----

// Floats of one KV head in a span: whole blocks of positions (DecodeSpan::head_floats).
__device__ int64_t span_head_floats(int64_t capacity, int64_t d) {
  return (capacity + kDecodeBlock - 1) / kDecodeBlock * kDecodeBlock * d;
}

// Rows by rows_launch, one thread per (KV head, dimension) of the row's k and v.
__global__ void kv_store_kernel(const DecodeSpan* spans, const int64_t* store_at, const float* k,
                                const float* v, int64_t rows, int64_t kvh, int64_t d) {
  FOUNDRY_FOR_EACH_ROW(r, rows) {
    const DecodeSpan s = spans[r];
    const int64_t at = store_at[r], head = span_head_floats(s.capacity, d);
    FOUNDRY_FOR_EACH_COL(j, kvh * d) {
      const int64_t g = j / d, i = j % d;
      s.k[g * head + (at / kDecodeBlock) * kDecodeBlock * d + i * kDecodeBlock +
          at % kDecodeBlock] = k[r * kvh * d + j];
      s.v[g * head + at * d + i] = v[r * kvh * d + j];
    }
  }
}

// ---- attention over a row's spans ----

// Block (row r, query head j) of kAttentionThreads threads; its scores at
// scores[(r·h + j)·max_len + p] for the row's positions p in chain order. Thread x takes
// positions x, x + blockDim, … for the scores (each summed over the dimensions in order) and
// the exponentials (summed in that order, then over the block in the tree); the weighted sum
// takes dimensions, each summing the positions in order.
__global__ void attention_rows_kernel(float* out, float* scores, int64_t max_len, const float* q,
                                      const DecodeSpan* spans, const int64_t* first, int64_t h,
                                      int64_t kvh, int64_t d, float scale) {
  __shared__ float shared[kAttentionThreads];
  const int64_t r = blockIdx.x, j = blockIdx.y, g = j / (h / kvh);
  const int64_t span_begin = first[r], span_end = first[r + 1];
  const float* qj = q + (r * h + j) * d;
  float* sj = scores + (r * h + j) * max_len;

  // Scores, walking the chain once: a thread's positions only increase.
  int64_t len = 0;
  for (int64_t s = span_begin; s < span_end; ++s) len += spans[s].len;
  float max_score = -INFINITY;
  {
    int64_t s = span_begin, base = 0;
    for (int64_t p = threadIdx.x; p < len; p += kAttentionThreads) {
      while (p >= base + spans[s].len) base += spans[s++].len;
      const DecodeSpan span = spans[s];
      const int64_t t = p - base;
      const float* kb = span.k + g * span_head_floats(span.capacity, d) +
                        (t / kDecodeBlock) * kDecodeBlock * d + t % kDecodeBlock;
      float acc = 0;
      for (int64_t i = 0; i < d; ++i) acc = fmaf(qj[i], kb[i * kDecodeBlock], acc);
      const float score = acc * scale;
      sj[p] = score;
      max_score = fmaxf(max_score, score);
    }
  }
  max_score = block_max<kAttentionThreads>(max_score, shared);

  float sum = 0;
  for (int64_t p = threadIdx.x; p < len; p += kAttentionThreads) {
    const float e = expf(sj[p] - max_score);
    sj[p] = e;
    sum += e;
  }
  // block_sum's barriers also make every thread's exponentials visible to the whole block.
  const float inv_sum = 1.0f / block_sum<kAttentionThreads>(sum, shared);

  float* oj = out + (r * h + j) * d;
  for (int64_t i = threadIdx.x; i < d; i += kAttentionThreads) {
    float acc = 0;
    int64_t p = 0;
    for (int64_t s = span_begin; s < span_end; ++s) {
      const DecodeSpan span = spans[s];
      const float* vi = span.v + g * span_head_floats(span.capacity, d) + i;
      for (int64_t t = 0; t < span.len; ++t, ++p) acc = fmaf(sj[p], vi[t * d], acc);
    }
    oj[i] = acc * inv_sum;
  }
}

// ---- CCA decode states ----

// One thread per channel ch of C, rows in order: the depthwise step (bias, then the taps
// oldest first, the new row last) into window [rows, C, t1] = (y_hist's column, y_new), then
// both histories advance by one row. A row sharing its state with an earlier one reads the
// channel as that row left it: the same thread wrote it.
__global__ void cca_depthwise_decode_kernel(float* window, float* const* states, int64_t rows,
                                            int64_t channels, int64_t t0, int64_t t1,
                                            const float* c_new, const float* w0, const float* b0) {
  FOUNDRY_FOR_EACH(ch, channels) {
    const float* w = w0 + ch * t0;
    for (int64_t r = 0; r < rows; ++r) {
      float* c_hist = states[r] + ch;
      float* y_hist = states[r] + (t0 - 1) * channels + ch;
      const float c = c_new[r * channels + ch];
      float y_new = b0[ch];
      for (int64_t i = 0; i < t0 - 1; ++i) y_new = fmaf(w[i], c_hist[i * channels], y_new);
      y_new = fmaf(w[t0 - 1], c, y_new);
      float* win = window + (r * channels + ch) * t1;
      for (int64_t i = 0; i < t1 - 1; ++i) win[i] = y_hist[i * channels];
      win[t1 - 1] = y_new;
      if (t0 > 1) {
        for (int64_t i = 0; i < t0 - 2; ++i) c_hist[i * channels] = c_hist[(i + 1) * channels];
        c_hist[(t0 - 2) * channels] = c;
      }
      if (t1 > 1) {
        for (int64_t i = 0; i < t1 - 2; ++i) y_hist[i * channels] = y_hist[(i + 1) * channels];
        y_hist[(t1 - 2) * channels] = y_new;
      }
    }
  }
}

// Σ over the warp, every lane getting it, in a fixed butterfly.
__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// One warp per (row r, output o): qk[r, o] = b1[o] + w1[o, :]·window[r, group of o, :], the
// d·t1 contiguous floats of each (the CPU's rows); lane x sums k ≡ x (mod 32) in order, then
// the warp's butterfly. Lanes read consecutive floats.
__global__ void cca_grouped_decode_kernel(float* qk, const float* window, int64_t rows,
                                          int64_t channels, int64_t d, int64_t t1,
                                          const float* w1, const float* b1) {
  const int lane = threadIdx.x % 32;
  const int64_t row_len = d * t1, warps = gridDim.x * int64_t{blockDim.x} / 32;
  for (int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
       warp < rows * channels; warp += warps) {
    const int64_t r = warp / channels, o = warp % channels;
    const float* w = w1 + o * row_len;
    const float* x = window + r * channels * t1 + (o / d) * row_len;
    float sum = 0;
    for (int64_t k = lane; k < row_len; k += 32) sum = fmaf(w[k], x[k], sum);
    sum = warp_sum(sum);
    if (lane == 0) qk[warp] = b1[o] + sum;
  }
}

// One thread per j < half, rows in order (rows sharing a state swap through it in turn).
__global__ void cca_value_shift_decode_kernel(float* v, float* const* states, int64_t rows,
                                              int64_t half, int64_t v_prev_at) {
  FOUNDRY_FOR_EACH(j, half) {
    for (int64_t r = 0; r < rows; ++r) {
      float* current = v + r * 2 * half + half + j;
      float* previous = states[r] + v_prev_at + j;
      const float x = *current;
      *current = *previous;
      *previous = x;
    }
  }
}

}  // namespace

void add(float* y, const float* x, int64_t n) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads>>>(y, x, n);
  check_launch();
}

void decode_kv_store(const DecodeSpan* spans, const int64_t* store_at, const float* k,
                     const float* v, int64_t rows, int64_t kvh, int64_t d) {
  if (rows == 0 || kvh * d == 0) return;
  const RowsLaunch l = rows_launch(rows, kvh * d);
  kv_store_kernel<<<l.grid, l.block>>>(spans, store_at, k, v, rows, kvh, d);
  check_launch();
}

void attention_decode_rows(float* out, float* scores, int64_t max_len, const float* q,
                           const DecodeSpan* spans, const int64_t* first, int64_t rows, int64_t h,
                           int64_t kvh, int64_t d) {
  if (rows * h * d == 0) return;
  FOUNDRY_GPU_CHECK(kvh > 0 && h % kvh == 0 && h <= 65535);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));  // the CPU's
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(h));
  attention_rows_kernel<<<grid, kAttentionThreads>>>(out, scores, max_len, q, spans, first, h,
                                                     kvh, d, scale);
  check_launch();
}

void cca_conv_decode(float* qk, float* window, float* const* states, int64_t rows, int64_t hq,
                     int64_t hk, int64_t d, int64_t t0, int64_t t1, const float* c_new,
                     const float* w0, const float* b0, const float* w1, const float* b1) {
  const int64_t channels = (hq + hk) * d;
  if (rows == 0 || channels == 0) return;
  cca_depthwise_decode_kernel<<<blocks_for(channels), kThreads>>>(window, states, rows, channels,
                                                                 t0, t1, c_new, w0, b0);
  check_launch();
  cca_grouped_decode_kernel<<<blocks_for(rows * channels * 32), kThreads>>>(
      qk, window, rows, channels, d, t1, w1, b1);
  check_launch();
}

void cca_value_shift_decode(float* v, float* const* states, int64_t rows, int64_t hq, int64_t hk,
                            int64_t d, int64_t t0, int64_t t1) {
  const int64_t half = hk * d / 2;
  if (rows == 0 || half == 0) return;
  const int64_t v_prev_at = (t0 - 1 + t1 - 1) * (hq + hk) * d;  // kernels/cca.h's decode_v_prev
  cca_value_shift_decode_kernel<<<blocks_for(half), kThreads>>>(v, states, rows, half, v_prev_at);
  check_launch();
}

}  // namespace foundry::gpu::ops
