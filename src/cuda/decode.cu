// decode.h's kernels. Attention runs one block per (row, query head): its scores, softmax and
// weighted sum in three passes, the block's reductions through shared memory in a fixed tree.
// Grouped attention (flash decoding) runs one block per (work item, KV head), then a merge.
// The CCA state kernels give each thread whole channels of every row in row order, so rows
// that share a state see each other's updates without any synchronization.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

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

// ---- grouped attention (decode.h: DecodePlan) ----

constexpr int kTile = static_cast<int>(kDecodeTile);  // a warp's lanes in the scores
constexpr int kTileRow = kTile + 4;  // a query's tile of probabilities, padded (below)
constexpr int kGroupThreads = kBlockThreads;
constexpr int kGroupWarps = kGroupThreads / 32;
constexpr int kQuads = 4;  // queries a thread's scores and weighted sums take at once
constexpr int kKeyBlock = static_cast<int>(kDecodeBlock);

// A block's shared memory for qp queries (a multiple of kQuads) of d dimensions, dp = d rounded
// up to a multiple of 4: the tile's keys transposed [dp, kTile] and values [kTile, d], the
// queries [qp, dp], the outputs [qp, d], the tile's probabilities [qp, kTileRow], per query
// the running max, sum and this tile's rescaling, and where its positions end (ints).
int64_t group_shared_floats(int64_t qp, int64_t d) {
  const int64_t dp = (d + 3) / 4 * 4;
  return kTile * (dp + d) + qp * (dp + d + kTileRow + 4);
}
// The bytes for `queries` queries, rounded up to whole quads.
int64_t group_shared_bytes(int64_t queries, int64_t d) {
  const int64_t qp = (queries + kQuads - 1) / kQuads * kQuads;
  return group_shared_floats(qp, d) * static_cast<int64_t>(sizeof(float));
}

// Block (work item w, KV head g) of kGroupThreads threads; query a of the item is its row
// a / group's query head g·group + a % group. Per tile of positions t0 … t0 + 31:
//   - the keys and values of the tile's positions before the item's end, each read once,
//     zeros after it (16-position key blocks lie whole in a tile: t0 is a multiple of 32);
//   - scores: warp x takes quads of queries x, x + kGroupWarps, …, lane t position t0 + t;
//     each score summed over the dimensions in order (dimensions past d are zeros), then
//     per query (past its row's end a score is −∞ and its probability 0) the tile's max and
//     sum in the warp's butterflies: m' = max(m, tile max), p = e^{s−m'}, l' = l·e^{m−m'} +
//     Σ p;
//   - weighted sums: thread x takes (quad, dimension) pairs x, x + kGroupThreads, …:
//     o' = o·e^{m−m'} + Σ_t p_t·v_t, the positions in order.
// Then each of the item's (row, query head) writes its partial, m, l and o [d], at record
// (slot·h + head)·(d + 2) of `partials`. Queries past the item's (up to a whole quad) compute
// on zero queries and write nothing. Probability rows are kTileRow apart so that a warp whose
// pairs span two quads reads their float4s from different banks.
__global__ void attention_group_kernel(float* partials, const float* q, const DecodeWork* work,
                                       const DecodeWorkRow* work_rows, int64_t h, int group, int d,
                                       int qp, float scale) {
  extern __shared__ float4 shared4[];
  const int dp = (d + 3) / 4 * 4;
  float* const ks = reinterpret_cast<float*>(shared4);
  float* const vs = ks + kTile * dp;
  float* const qs = vs + kTile * d;
  float* const os = qs + qp * dp;
  float* const ps = os + qp * d;
  float* const ms = ps + qp * kTileRow;
  float* const ls = ms + qp;
  float* const as = ls + qp;
  int* const ends = reinterpret_cast<int*>(as + qp);

  const DecodeWork w = work[blockIdx.x];
  const int g = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int queries = w.rows * group, quads = (queries + kQuads - 1) / kQuads;
  const int64_t head = span_head_floats(w.span.capacity, d);
  const float* const kh = w.span.k + g * head;
  const float* const vh = w.span.v + g * head;

  for (int f = tid; f < quads * kQuads * dp; f += kGroupThreads) {
    const int a = f / dp, i = f - a * dp;
    float x = 0;
    if (a < queries && i < d) {
      const int64_t r = work_rows[w.rows_at + a / group].row, j = g * group + a % group;
      x = q[(r * h + j) * d + i];
    }
    qs[f] = x;
  }
  for (int f = tid; f < quads * kQuads * d; f += kGroupThreads) os[f] = 0;
  for (int f = tid; f < (dp - d) * kTile; f += kGroupThreads) ks[d * kTile + f] = 0;
  for (int a = tid; a < quads * kQuads; a += kGroupThreads) {
    ms[a] = -INFINITY;
    ls[a] = 0;
    ends[a] = a < queries ? work_rows[w.rows_at + a / group].end : w.end;
  }

  for (int t0 = w.begin; t0 < w.end; t0 += kTile) {
    // Keys: the tile's two blocks are kTile·d floats from kh + t0·d, block by block.
    const int n = min(kTile, w.end - t0);
    const float* const kt = kh + int64_t{t0} * d;
    const float* const vt = vh + int64_t{t0} * d;
    for (int f = tid; f < kTile * d; f += kGroupThreads) {
      const int half = f >= kKeyBlock * d ? 1 : 0, rest = f - half * kKeyBlock * d;
      const int t = half * kKeyBlock + rest % kKeyBlock;
      ks[rest / kKeyBlock * kTile + t] = t < n ? kt[f] : 0.0f;
      vs[f] = f < n * d ? vt[f] : 0.0f;
    }
    __syncthreads();  // also orders the set-up above before the tile's reads

    for (int quad = warp; quad < quads; quad += kGroupWarps) {
      const int a0 = quad * kQuads;
      const float4* const qa = reinterpret_cast<const float4*>(qs + a0 * dp);
      float acc[kQuads] = {};
      for (int i = 0; i < dp; i += 4) {
        const float k0 = ks[i * kTile + lane], k1 = ks[(i + 1) * kTile + lane],
                    k2 = ks[(i + 2) * kTile + lane], k3 = ks[(i + 3) * kTile + lane];
#pragma unroll
        for (int a = 0; a < kQuads; ++a) {
          const float4 x = qa[(a * dp + i) / 4];
          acc[a] = fmaf(x.x, k0, acc[a]);
          acc[a] = fmaf(x.y, k1, acc[a]);
          acc[a] = fmaf(x.z, k2, acc[a]);
          acc[a] = fmaf(x.w, k3, acc[a]);
        }
      }
#pragma unroll
      for (int a = 0; a < kQuads; ++a) {
        // Every lane reads m before the butterflies, lane 0 writes it after them.
        const bool valid = lane < ends[a0 + a] - t0;
        const float s = valid ? acc[a] * scale : -INFINITY;
        const float m_old = ms[a0 + a], m = fmaxf(m_old, warp_max(s));
        const float p = valid ? expf(s - m) : 0.0f;
        const float sum = warp_sum(p);
        ps[(a0 + a) * kTileRow + lane] = p;
        __syncwarp();  // every lane has read m_old
        if (lane == 0) {
          const float rescale = expf(m_old - m);  // 0 at the first tile (m_old = −∞)
          ms[a0 + a] = m;
          ls[a0 + a] = fmaf(ls[a0 + a], rescale, sum);
          as[a0 + a] = rescale;
        }
      }
    }
    __syncthreads();

    // Positions n … of the tile have p = 0 and v = 0 (a finite product): whole float4s.
    for (int u = tid; u < quads * d; u += kGroupThreads) {
      const int quad = u / d, i = u - quad * d, a0 = quad * kQuads;
      float acc[kQuads];
#pragma unroll
      for (int a = 0; a < kQuads; ++a) acc[a] = os[(a0 + a) * d + i] * as[a0 + a];
      for (int t = 0; t < n; t += 4) {
        const float v0 = vs[t * d + i], v1 = vs[(t + 1) * d + i], v2 = vs[(t + 2) * d + i],
                    v3 = vs[(t + 3) * d + i];
#pragma unroll
        for (int a = 0; a < kQuads; ++a) {
          const float4 p = *reinterpret_cast<const float4*>(ps + (a0 + a) * kTileRow + t);
          acc[a] = fmaf(p.x, v0, acc[a]);
          acc[a] = fmaf(p.y, v1, acc[a]);
          acc[a] = fmaf(p.z, v2, acc[a]);
          acc[a] = fmaf(p.w, v3, acc[a]);
        }
      }
#pragma unroll
      for (int a = 0; a < kQuads; ++a) os[(a0 + a) * d + i] = acc[a];
    }
    __syncthreads();  // before the next tile's loads overwrite keys, values and probabilities
  }

  for (int f = tid; f < queries * d; f += kGroupThreads) {
    const int a = f / d, i = f - a * d;
    const int64_t slot = work_rows[w.rows_at + a / group].slot, j = g * group + a % group;
    float* const rec = partials + (slot * h + j) * (d + 2);
    rec[2 + i] = os[f];
    if (i == 0) {
      rec[0] = ms[a];
      rec[1] = ls[a];
    }
  }
}

// Row rj = (r, j) of out [rows·h, d] by rows_launch: row r's partials, slots[r] … slots[r + 1]
// − 1, merged in slot order; each thread of a row computes m and l itself, the same sums.
__global__ void attention_merge_kernel(float* out, const float* partials, const int32_t* slots,
                                       int64_t rows, int64_t h, int64_t d) {
  FOUNDRY_FOR_EACH_ROW(rj, rows * h) {
    const int64_t r = rj / h, j = rj % h, s0 = slots[r], s1 = slots[r + 1];
    auto record = [&](int64_t s) { return partials + (s * h + j) * (d + 2); };
    float m = -INFINITY;
    for (int64_t s = s0; s < s1; ++s) m = fmaxf(m, record(s)[0]);
    float l = 0;
    for (int64_t s = s0; s < s1; ++s) l = fmaf(record(s)[1], expf(record(s)[0] - m), l);
    FOUNDRY_FOR_EACH_COL(i, d) {
      float o = 0;
      for (int64_t s = s0; s < s1; ++s) o = fmaf(record(s)[2 + i], expf(record(s)[0] - m), o);
      out[rj * d + i] = o / l;
    }
  }
}

// ---- CCA decode states ----

// One thread per channel ch of C, rows in order: the depthwise step (the taps oldest first,
// the new row last, from zero) into window [rows, C, t1] = b0 + (y_hist's column, the new
// sum), then both histories advance by one row (y_hist keeps the sums without b0, so a zero
// state reads b0 before position 0: kernels/cca.h). A row sharing its state with an earlier
// one reads the channel as that row left it: the same thread wrote it.
__global__ void cca_depthwise_decode_kernel(float* window, float* const* states, int64_t rows,
                                            int64_t channels, int64_t t0, int64_t t1,
                                            const float* c_new, const float* w0, const float* b0) {
  FOUNDRY_FOR_EACH(ch, channels) {
    const float* w = w0 + ch * t0;
    for (int64_t r = 0; r < rows; ++r) {
      float* c_hist = states[r] + ch;
      float* y_hist = states[r] + (t0 - 1) * channels + ch;
      const float c = c_new[r * channels + ch];
      float taps_sum = 0;
      for (int64_t i = 0; i < t0 - 1; ++i) taps_sum = fmaf(w[i], c_hist[i * channels], taps_sum);
      taps_sum = fmaf(w[t0 - 1], c, taps_sum);
      float* win = window + (r * channels + ch) * t1;
      for (int64_t i = 0; i < t1 - 1; ++i) win[i] = b0[ch] + y_hist[i * channels];
      win[t1 - 1] = b0[ch] + taps_sum;
      if (t0 > 1) {
        for (int64_t i = 0; i < t0 - 2; ++i) c_hist[i * channels] = c_hist[(i + 1) * channels];
        c_hist[(t0 - 2) * channels] = c;
      }
      if (t1 > 1) {
        for (int64_t i = 0; i < t1 - 2; ++i) y_hist[i * channels] = y_hist[(i + 1) * channels];
        y_hist[(t1 - 2) * channels] = taps_sum;
      }
    }
  }
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

int64_t attention_decode_query_cap(int64_t d) {
  if (d > (1 << 16)) return 0;
  int device = 0, most = 0;
  FOUNDRY_CUDA_CHECK(cudaGetDevice(&device));
  FOUNDRY_CUDA_CHECK(
      cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  int64_t queries = kDecodeGroupQueries;
  while (queries > 0 && group_shared_bytes(queries, d) > most) --queries;
  return queries;
}

void attention_decode_grouped(float* out, float* partials, const float* q, const DecodeWork* work,
                              int64_t works, const DecodeWorkRow* work_rows, const int32_t* slots,
                              int64_t rows, int64_t h, int64_t kvh, int64_t d, int64_t queries) {
  if (rows * h * d == 0) return;
  FOUNDRY_GPU_CHECK(kvh > 0 && h % kvh == 0 && kvh <= 65535 && works > 0 && works < INT_MAX);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));  // the CPU's
  const int64_t bytes = group_shared_bytes(queries, d);
  if (bytes > 48 * 1024)  // the most a launch gets without asking
    FOUNDRY_CUDA_CHECK(cudaFuncSetAttribute(attention_group_kernel,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(bytes)));
  const dim3 grid(static_cast<unsigned>(works), static_cast<unsigned>(kvh));
  const int qp = static_cast<int>((queries + kQuads - 1) / kQuads * kQuads);
  attention_group_kernel<<<grid, kGroupThreads, bytes>>>(
      partials, q, work, work_rows, h, static_cast<int>(h / kvh), static_cast<int>(d), qp, scale);
  check_launch();
  const RowsLaunch l = rows_launch(rows * h, d);
  attention_merge_kernel<<<l.grid, l.block>>>(out, partials, slots, rows, h, d);
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
