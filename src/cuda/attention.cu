// ops.h's attention: FlashAttention's schedule on CUDA cores, in fp32. A block takes a tile
// of BR query rows of one head (forward, dQ) or BC key rows of one KV head (dK, dV) and walks
// the tiles of the other side that the causal mask lets it see. Scores live in shared
// memory one tile at a time; the running max and sum of each row make the softmax online.
// A chunk of the queries (context parallelism) is the same walk over fewer query rows, whose
// mask is shifted by the chunk's position.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "cuda/check.h"
#include "cuda/ops.h"

namespace foundry::gpu::ops {

namespace {

constexpr int BR = 16;       // query rows per tile
constexpr int BC = 32;       // key rows per tile
constexpr int kThreads = 128;
constexpr int kMaxD = 256;

// t key rows (k, v, dk, dv [B, t, KVH, D]); tq query rows (q, out, dq, dout [B, tq, H, D],
// lse and Δ [B, H, tq]) of which rows [q_begin, q_end) are computed; query row r sees keys
// 0 … r + shift, so keys from keys_end = q_end + shift on are neither read nor written (with
// context parallelism they may not have arrived yet). The whole sequence: tq = t, [0, t),
// shift 0, dk and dv written; a chunk accumulates them.
struct Dims {
  int64_t b, t, h, kvh, d;
  int64_t tq, q_begin, q_end, shift, keys_end;
  bool accumulate;
  float scale;
};

// Element (batch b, row t, head h, dim 0) of a [B, rows, heads, D] tensor.
__device__ __forceinline__ int64_t at(const Dims& s, int64_t rows, int64_t heads, int64_t b,
                                      int64_t t, int64_t h) {
  return ((b * rows + t) * heads + h) * s.d;
}

// count × D of a [B, rows, heads, D] tensor from row `first` into shared memory; rows at or
// past `end` read as zeros.
__device__ void load_rows(float* dst, const float* src, const Dims& s, int64_t rows,
                          int64_t end, int64_t heads, int64_t b, int64_t first, int64_t head,
                          int count) {
  for (int e = threadIdx.x; e < count * s.d; e += kThreads) {
    const int r = e / static_cast<int>(s.d), d = e % static_cast<int>(s.d);
    const int64_t t = first + r;
    dst[e] = t < end ? src[at(s, rows, heads, b, t, head) + d] : 0.0f;
  }
}
__device__ void load_query_rows(float* dst, const float* src, const Dims& s, int64_t b,
                                int64_t first, int64_t head) {
  load_rows(dst, src, s, s.tq, s.q_end, s.h, b, first, head, BR);
}
__device__ void load_key_rows(float* dst, const float* src, const Dims& s, int64_t b,
                              int64_t first, int64_t head) {
  load_rows(dst, src, s, s.t, s.keys_end, s.kvh, b, first, head, BC);
}

// Whether query row qi (of the computed ones) sees key kj.
__device__ __forceinline__ bool sees(int64_t qi, int64_t kj, const Dims& s) {
  return qi < s.q_end && kj <= qi + s.shift;
}

// The saved log-sum-exp and Δ of query rows q0 … q0+BR−1 of head h (0 past the computed rows).
__device__ void load_row_stats(float* row_lse, float* row_delta, const float* lse,
                               const float* delta, const Dims& s, int64_t b, int64_t h,
                               int64_t q0) {
  if (threadIdx.x < BR) {
    const int64_t qi = q0 + threadIdx.x;
    row_lse[threadIdx.x] = qi < s.q_end ? lse[(b * s.h + h) * s.tq + qi] : 0.0f;
    row_delta[threadIdx.x] = qi < s.q_end ? delta[(b * s.h + h) * s.tq + qi] : 0.0f;
  }
}

__device__ __forceinline__ float dot(const float* x, const float* y, int64_t d) {
  float acc = 0;
  for (int64_t i = 0; i < d; ++i) acc += x[i] * y[i];
  return acc;
}

__global__ void forward_kernel(float* out, float* lse, const float* q, const float* k,
                               const float* v, Dims s) {
  extern __shared__ float smem[];
  const int D = static_cast<int>(s.d);
  float* qs = smem;                // BR × D
  float* ks = qs + BR * D;         // BC × D
  float* vs = ks + BC * D;         // BC × D
  float* ss = vs + BC * D;         // BR × BC scores, then probabilities
  float* row_m = ss + BR * BC;     // running max
  float* row_l = row_m + BR;       // running sum
  float* row_c = row_l + BR;       // this tile's rescaling of the row's output
  const int64_t b = blockIdx.y / s.h, h = blockIdx.y % s.h, kv = h / (s.h / s.kvh);
  const int64_t q0 = s.q_begin + static_cast<int64_t>(blockIdx.x) * BR;
  load_query_rows(qs, q, s, b, q0, h);
  if (threadIdx.x < BR) row_m[threadIdx.x] = -INFINITY, row_l[threadIdx.x] = 0;
  // Output: thread (r, lane) holds dims lane, lane + 8, ... of row r.
  const int r_own = threadIdx.x / 8, lane = threadIdx.x % 8;
  float o[kMaxD / 8];
  for (int i = 0; i < kMaxD / 8; ++i) o[i] = 0;
  const int64_t q_last = min(q0 + BR, s.q_end) - 1;
  for (int64_t k0 = 0; k0 <= q_last + s.shift; k0 += BC) {
    __syncthreads();  // the previous tile's readers are done
    load_key_rows(ks, k, s, b, k0, kv);
    load_key_rows(vs, v, s, b, k0, kv);
    __syncthreads();
    for (int p = threadIdx.x; p < BR * BC; p += kThreads) {
      const int r = p / BC, c = p % BC;
      const int64_t qi = q0 + r, kj = k0 + c;
      ss[p] = sees(qi, kj, s) ? dot(qs + r * D, ks + c * D, D) * s.scale : -INFINITY;
    }
    __syncthreads();
    if (threadIdx.x < BR) {
      const int r = threadIdx.x;
      float* row = ss + r * BC;
      float mx = row_m[r];
      for (int c = 0; c < BC; ++c) mx = fmaxf(mx, row[c]);
      if (mx == -INFINITY) {  // nothing seen yet (a row past the computed ones)
        for (int c = 0; c < BC; ++c) row[c] = 0;
        row_c[r] = 1;
      } else {
        const float correction = expf(row_m[r] - mx);
        float sum = 0;
        for (int c = 0; c < BC; ++c) {
          row[c] = expf(row[c] - mx);
          sum += row[c];
        }
        row_l[r] = row_l[r] * correction + sum;
        row_m[r] = mx;
        row_c[r] = correction;
      }
    }
    __syncthreads();
    const float correction = row_c[r_own];
    const float* pr = ss + r_own * BC;
    for (int i = 0; i < kMaxD / 8; ++i) {
      const int d = lane + 8 * i;
      if (d >= D) break;
      float acc = o[i] * correction;
      for (int c = 0; c < BC; ++c) acc += pr[c] * vs[c * D + d];
      o[i] = acc;
    }
  }
  const int64_t qi = q0 + r_own;
  if (qi < s.q_end) {
    const float inv_l = 1.0f / row_l[r_own];
    for (int i = 0; i < kMaxD / 8; ++i) {
      const int d = lane + 8 * i;
      if (d >= D) break;
      out[at(s, s.tq, s.h, b, qi, h) + d] = o[i] * inv_l;
    }
    if (lane == 0) lse[(b * s.h + h) * s.tq + qi] = row_m[r_own] + logf(row_l[r_own]);
  }
}

// delta [B, H, tq] = rowsum(dO ∘ O) over the computed query rows.
__global__ void delta_kernel(float* delta, const float* dout, const float* out, Dims s) {
  const int64_t count = s.q_end - s.q_begin, rows = s.b * count * s.h;
  for (int64_t row = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; row < rows;
       row += int64_t{gridDim.x} * blockDim.x) {
    const int64_t h = row % s.h, t = s.q_begin + (row / s.h) % count, b = row / (s.h * count);
    const int64_t e = at(s, s.tq, s.h, b, t, h);
    delta[(b * s.h + h) * s.tq + t] = dot(dout + e, out + e, s.d);
  }
}

// dQ for a tile of query rows of one head: Σ over key tiles of dS·K·scale.
__global__ void dq_kernel(float* dq, const float* dout, const float* lse, const float* delta,
                          const float* q, const float* k, const float* v, Dims s) {
  extern __shared__ float smem[];
  const int D = static_cast<int>(s.d);
  float* qs = smem;             // BR × D
  float* dos = qs + BR * D;     // BR × D
  float* ks = dos + BR * D;     // BC × D
  float* vs = ks + BC * D;      // BC × D
  float* ds = vs + BC * D;      // BR × BC
  float* row_lse = ds + BR * BC;
  float* row_delta = row_lse + BR;
  const int64_t b = blockIdx.y / s.h, h = blockIdx.y % s.h, kv = h / (s.h / s.kvh);
  const int64_t q0 = s.q_begin + static_cast<int64_t>(blockIdx.x) * BR;
  load_query_rows(qs, q, s, b, q0, h);
  load_query_rows(dos, dout, s, b, q0, h);
  load_row_stats(row_lse, row_delta, lse, delta, s, b, h, q0);
  const int r_own = threadIdx.x / 8, lane = threadIdx.x % 8;
  float acc[kMaxD / 8];
  for (int i = 0; i < kMaxD / 8; ++i) acc[i] = 0;
  const int64_t q_last = min(q0 + BR, s.q_end) - 1;
  for (int64_t k0 = 0; k0 <= q_last + s.shift; k0 += BC) {
    __syncthreads();
    load_key_rows(ks, k, s, b, k0, kv);
    load_key_rows(vs, v, s, b, k0, kv);
    __syncthreads();
    for (int p = threadIdx.x; p < BR * BC; p += kThreads) {
      const int r = p / BC, c = p % BC;
      const int64_t qi = q0 + r, kj = k0 + c;
      float value = 0;
      if (sees(qi, kj, s)) {
        const float prob = expf(dot(qs + r * D, ks + c * D, D) * s.scale - row_lse[r]);
        value = prob * (dot(dos + r * D, vs + c * D, D) - row_delta[r]);
      }
      ds[p] = value;
    }
    __syncthreads();
    const float* dr = ds + r_own * BC;
    for (int i = 0; i < kMaxD / 8; ++i) {
      const int d = lane + 8 * i;
      if (d >= D) break;
      float sum = 0;
      for (int c = 0; c < BC; ++c) sum += dr[c] * ks[c * D + d];
      acc[i] += sum * s.scale;
    }
  }
  const int64_t qi = q0 + r_own;
  if (qi < s.q_end)
    for (int i = 0; i < kMaxD / 8; ++i) {
      const int d = lane + 8 * i;
      if (d >= D) break;
      dq[at(s, s.tq, s.h, b, qi, h) + d] = acc[i];
    }
}

// dK and dV for a tile of key rows of one KV head: Σ over the group's query heads (in order)
// and the query tiles that see the keys of Pᵀ·dO and dSᵀ·Q·scale.
__global__ void dkdv_kernel(float* dk, float* dv, const float* dout, const float* lse,
                            const float* delta, const float* q, const float* k, const float* v,
                            Dims s) {
  extern __shared__ float smem[];
  const int D = static_cast<int>(s.d);
  float* ks = smem;             // BC × D
  float* vs = ks + BC * D;      // BC × D
  float* dks = vs + BC * D;     // BC × D accumulators
  float* dvs = dks + BC * D;    // BC × D accumulators
  float* qs = dvs + BC * D;     // BR × D
  float* dos = qs + BR * D;     // BR × D
  float* ps = dos + BR * D;     // BR × BC
  float* ds = ps + BR * BC;     // BR × BC
  float* row_lse = ds + BR * BC;
  float* row_delta = row_lse + BR;
  const int64_t b = blockIdx.y / s.kvh, kv = blockIdx.y % s.kvh, group = s.h / s.kvh;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * BC;
  load_key_rows(ks, k, s, b, k0, kv);
  load_key_rows(vs, v, s, b, k0, kv);
  for (int e = threadIdx.x; e < BC * D; e += kThreads) dks[e] = 0, dvs[e] = 0;
  // Query tiles before the first query that sees k0 see none of the keys.
  const int64_t q_first = s.q_begin + max(int64_t{0}, k0 - s.shift - s.q_begin) / BR * BR;
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kv * group + g;
    for (int64_t q0 = q_first; q0 < s.q_end; q0 += BR) {
      __syncthreads();
      load_query_rows(qs, q, s, b, q0, h);
      load_query_rows(dos, dout, s, b, q0, h);
      load_row_stats(row_lse, row_delta, lse, delta, s, b, h, q0);
      __syncthreads();
      for (int p = threadIdx.x; p < BR * BC; p += kThreads) {
        const int r = p / BC, c = p % BC;
        const int64_t qi = q0 + r, kj = k0 + c;
        float prob = 0, grad = 0;
        if (sees(qi, kj, s)) {
          prob = expf(dot(qs + r * D, ks + c * D, D) * s.scale - row_lse[r]);
          grad = prob * (dot(dos + r * D, vs + c * D, D) - row_delta[r]);
        }
        ps[p] = prob;
        ds[p] = grad;
      }
      __syncthreads();
      for (int e = threadIdx.x; e < BC * D; e += kThreads) {
        const int c = e / D, d = e % D;
        float sum_v = 0, sum_k = 0;
        for (int r = 0; r < BR; ++r) {
          sum_v += ps[r * BC + c] * dos[r * D + d];
          sum_k += ds[r * BC + c] * qs[r * D + d];
        }
        dvs[e] += sum_v;
        dks[e] += sum_k * s.scale;
      }
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < BC * D; e += kThreads) {
    const int c = e / D, d = e % D;
    const int64_t kj = k0 + c;
    if (kj < s.keys_end) {
      const int64_t i = at(s, s.t, s.kvh, b, kj, kv) + d;
      dk[i] = s.accumulate ? dk[i] + dks[e] : dks[e];
      dv[i] = s.accumulate ? dv[i] + dvs[e] : dvs[e];
    }
  }
}

Dims dims_of(const AttentionDims& a) {
  FOUNDRY_GPU_CHECK(a.d >= 1 && a.d <= kMaxD);
  const AttentionRows r = attention_rows(a);
  return {a.b,      a.t,         a.h,          a.kvh,
          a.d,      r.tq,        r.q_begin,    r.q_end,
          r.shift,  r.q_end + r.shift, r.accumulate,
          static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.d)))};
}

unsigned tiles(int64_t n, int64_t per) { return static_cast<unsigned>((n + per - 1) / per); }

// Dynamic shared memory above 48 KiB needs the kernel's consent.
template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    FOUNDRY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(bytes)));
}

}  // namespace

AttentionRows attention_rows(const AttentionDims& a) {
  FOUNDRY_GPU_CHECK(a.kvh >= 1 && a.h % a.kvh == 0);
  FOUNDRY_GPU_CHECK(a.b * a.h <= 65535);  // the grid's y: one block row per (sequence, head)
  if (a.q_rows == 0) return {a.t, 0, a.t, 0, false};
  FOUNDRY_GPU_CHECK(0 <= a.q_begin && a.q_begin < a.q_end && a.q_end <= a.q_rows);
  FOUNDRY_GPU_CHECK(a.q_pos >= 0 && a.q_pos + (a.q_end - a.q_begin) <= a.t);
  return {a.q_rows, a.q_begin, a.q_end, a.q_pos - a.q_begin, true};
}

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionDims& a) {
  const Dims s = dims_of(a);
  if (s.b * s.t * s.h == 0) return;
  const size_t shared = sizeof(float) * ((BR + 2 * BC) * s.d + BR * BC + 3 * BR);
  allow_shared(forward_kernel, shared);
  const dim3 grid(tiles(s.q_end - s.q_begin, BR), static_cast<unsigned>(s.b * s.h));
  forward_kernel<<<grid, kThreads, shared>>>(out, lse, q, k, v, s);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

int64_t attention_backward_scratch(const AttentionDims& a) {
  return a.b * a.h * attention_rows(a).tq;
}

void attention_delta(float* delta, const float* dout, const float* out, const AttentionDims& a) {
  const Dims s = dims_of(a);
  const int64_t rows = s.b * (s.q_end - s.q_begin) * s.h;
  if (rows == 0) return;
  const int64_t blocks = std::min<int64_t>((rows + 255) / 256, 65535);
  delta_kernel<<<static_cast<unsigned>(blocks), 256>>>(delta, dout, out, s);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        const AttentionDims& a, float* scratch) {
  const Dims s = dims_of(a);
  if (s.b * s.t * s.h == 0) return;
  float* delta = scratch;
  attention_delta(delta, dout, out, a);

  const size_t dq_shared = sizeof(float) * ((2 * BR + 2 * BC) * s.d + BR * BC + 2 * BR);
  allow_shared(dq_kernel, dq_shared);
  dq_kernel<<<dim3(tiles(s.q_end - s.q_begin, BR), static_cast<unsigned>(s.b * s.h)), kThreads,
              dq_shared>>>(dq, dout, lse, delta, q, k, v, s);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());

  const size_t kv_shared = sizeof(float) * ((4 * BC + 2 * BR) * s.d + 2 * BR * BC + 2 * BR);
  allow_shared(dkdv_kernel, kv_shared);
  // Keys past the last query's position are seen by none: a chunk leaves their dk, dv as
  // they are.
  dkdv_kernel<<<dim3(tiles(s.keys_end, BC), static_cast<unsigned>(s.b * s.kvh)), kThreads,
                kv_shared>>>(dk, dv, dout, lse, delta, q, k, v, s);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace foundry::gpu::ops
