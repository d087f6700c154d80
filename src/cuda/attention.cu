// ops.h's attention: FlashAttention's schedule on CUDA cores, in fp32. A block takes a tile
// of BR query rows of one head (forward, dQ) or BC key rows of one KV head (dK, dV) and walks
// the tiles of the other side that the causal mask lets it see. Scores live in shared
// memory one tile at a time; the running max and sum of each row make the softmax online.
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

struct Dims {
  int64_t b, t, h, kvh, d;
  float scale;
};

// Element (batch b, position t, head h, dim d) of a [B, T, heads, D] tensor.
__device__ __forceinline__ int64_t at(const Dims& s, int64_t heads, int64_t b, int64_t t,
                                      int64_t h) {
  return ((b * s.t + t) * heads + h) * s.d;
}

// rows × D of a [B, T, heads, D] tensor from position `first` into shared memory; rows past
// T read as zeros.
__device__ void load_rows(float* dst, const float* src, const Dims& s, int64_t heads, int64_t b,
                          int64_t first, int64_t head, int rows) {
  for (int e = threadIdx.x; e < rows * s.d; e += kThreads) {
    const int r = e / static_cast<int>(s.d), d = e % static_cast<int>(s.d);
    const int64_t t = first + r;
    dst[e] = t < s.t ? src[at(s, heads, b, t, head) + d] : 0.0f;
  }
}

// The saved log-sum-exp and Δ of query rows q0 … q0+BR−1 of head h (0 past T).
__device__ void load_row_stats(float* row_lse, float* row_delta, const float* lse,
                               const float* delta, const Dims& s, int64_t b, int64_t h,
                               int64_t q0) {
  if (threadIdx.x < BR) {
    const int64_t qi = q0 + threadIdx.x;
    row_lse[threadIdx.x] = qi < s.t ? lse[(b * s.h + h) * s.t + qi] : 0.0f;
    row_delta[threadIdx.x] = qi < s.t ? delta[(b * s.h + h) * s.t + qi] : 0.0f;
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
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * BR;
  load_rows(qs, q, s, s.h, b, q0, h, BR);
  if (threadIdx.x < BR) row_m[threadIdx.x] = -INFINITY, row_l[threadIdx.x] = 0;
  // Output: thread (r, lane) holds dims lane, lane + 8, ... of row r.
  const int r_own = threadIdx.x / 8, lane = threadIdx.x % 8;
  float o[kMaxD / 8];
  for (int i = 0; i < kMaxD / 8; ++i) o[i] = 0;
  const int64_t q_last = min(q0 + BR, s.t) - 1;
  for (int64_t k0 = 0; k0 <= q_last; k0 += BC) {
    __syncthreads();  // the previous tile's readers are done
    load_rows(ks, k, s, s.kvh, b, k0, kv, BC);
    load_rows(vs, v, s, s.kvh, b, k0, kv, BC);
    __syncthreads();
    for (int p = threadIdx.x; p < BR * BC; p += kThreads) {
      const int r = p / BC, c = p % BC;
      const int64_t qi = q0 + r, kj = k0 + c;
      ss[p] = (qi < s.t && kj <= qi) ? dot(qs + r * D, ks + c * D, D) * s.scale : -INFINITY;
    }
    __syncthreads();
    if (threadIdx.x < BR) {
      const int r = threadIdx.x;
      float* row = ss + r * BC;
      float mx = row_m[r];
      for (int c = 0; c < BC; ++c) mx = fmaxf(mx, row[c]);
      if (mx == -INFINITY) {  // nothing seen yet (a row past T)
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
  if (qi < s.t) {
    const float inv_l = 1.0f / row_l[r_own];
    for (int i = 0; i < kMaxD / 8; ++i) {
      const int d = lane + 8 * i;
      if (d >= D) break;
      out[at(s, s.h, b, qi, h) + d] = o[i] * inv_l;
    }
    if (lane == 0) lse[(b * s.h + h) * s.t + qi] = row_m[r_own] + logf(row_l[r_own]);
  }
}

// delta [B, H, T] = rowsum(dO ∘ O).
__global__ void delta_kernel(float* delta, const float* dout, const float* out, Dims s) {
  const int64_t rows = s.b * s.t * s.h;
  for (int64_t row = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; row < rows;
       row += int64_t{gridDim.x} * blockDim.x) {
    const int64_t h = row % s.h, t = (row / s.h) % s.t, b = row / (s.h * s.t);
    delta[(b * s.h + h) * s.t + t] = dot(dout + row * s.d, out + row * s.d, s.d);
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
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * BR;
  load_rows(qs, q, s, s.h, b, q0, h, BR);
  load_rows(dos, dout, s, s.h, b, q0, h, BR);
  load_row_stats(row_lse, row_delta, lse, delta, s, b, h, q0);
  const int r_own = threadIdx.x / 8, lane = threadIdx.x % 8;
  float acc[kMaxD / 8];
  for (int i = 0; i < kMaxD / 8; ++i) acc[i] = 0;
  const int64_t q_last = min(q0 + BR, s.t) - 1;
  for (int64_t k0 = 0; k0 <= q_last; k0 += BC) {
    __syncthreads();
    load_rows(ks, k, s, s.kvh, b, k0, kv, BC);
    load_rows(vs, v, s, s.kvh, b, k0, kv, BC);
    __syncthreads();
    for (int p = threadIdx.x; p < BR * BC; p += kThreads) {
      const int r = p / BC, c = p % BC;
      const int64_t qi = q0 + r, kj = k0 + c;
      float value = 0;
      if (qi < s.t && kj <= qi) {
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
  if (qi < s.t)
    for (int i = 0; i < kMaxD / 8; ++i) {
      const int d = lane + 8 * i;
      if (d >= D) break;
      dq[at(s, s.h, b, qi, h) + d] = acc[i];
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
  load_rows(ks, k, s, s.kvh, b, k0, kv, BC);
  load_rows(vs, v, s, s.kvh, b, k0, kv, BC);
  for (int e = threadIdx.x; e < BC * D; e += kThreads) dks[e] = 0, dvs[e] = 0;
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kv * group + g;
    for (int64_t q0 = k0 / BR * BR; q0 < s.t; q0 += BR) {
      __syncthreads();
      load_rows(qs, q, s, s.h, b, q0, h, BR);
      load_rows(dos, dout, s, s.h, b, q0, h, BR);
      load_row_stats(row_lse, row_delta, lse, delta, s, b, h, q0);
      __syncthreads();
      for (int p = threadIdx.x; p < BR * BC; p += kThreads) {
        const int r = p / BC, c = p % BC;
        const int64_t qi = q0 + r, kj = k0 + c;
        float prob = 0, grad = 0;
        if (qi < s.t && kj <= qi) {
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
    if (kj < s.t) {
      dk[at(s, s.kvh, b, kj, kv) + d] = dks[e];
      dv[at(s, s.kvh, b, kj, kv) + d] = dvs[e];
    }
  }
}

Dims dims_of(const AttentionDims& a) {
  FOUNDRY_GPU_CHECK(a.d >= 1 && a.d <= kMaxD && a.kvh >= 1 && a.h % a.kvh == 0);
  FOUNDRY_GPU_CHECK(a.b * a.h <= 65535);  // the grid's y: one block row per (sequence, head)
  return {a.b, a.t, a.h, a.kvh, a.d, static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.d)))};
}

// Dynamic shared memory above 48 KiB needs the kernel's consent.
template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    FOUNDRY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(bytes)));
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionDims& a) {
  const Dims s = dims_of(a);
  if (s.b * s.t * s.h == 0) return;
  const size_t shared = sizeof(float) * ((BR + 2 * BC) * s.d + BR * BC + 3 * BR);
  allow_shared(forward_kernel, shared);
  const dim3 grid(static_cast<unsigned>((s.t + BR - 1) / BR), static_cast<unsigned>(s.b * s.h));
  forward_kernel<<<grid, kThreads, shared>>>(out, lse, q, k, v, s);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

int64_t attention_backward_scratch(const AttentionDims& a) { return a.b * a.h * a.t; }

void attention_delta(float* delta, const float* dout, const float* out, const AttentionDims& a) {
  const Dims s = dims_of(a);
  const int64_t rows = s.b * s.t * s.h;
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
  dq_kernel<<<dim3(static_cast<unsigned>((s.t + BR - 1) / BR), static_cast<unsigned>(s.b * s.h)),
              kThreads, dq_shared>>>(dq, dout, lse, delta, q, k, v, s);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());

  const size_t kv_shared = sizeof(float) * ((4 * BC + 2 * BR) * s.d + 2 * BR * BC + 2 * BR);
  allow_shared(dkdv_kernel, kv_shared);
  dkdv_kernel<<<dim3(static_cast<unsigned>((s.t + BC - 1) / BC), static_cast<unsigned>(s.b * s.kvh)),
                kThreads, kv_shared>>>(dk, dv, dout, lse, delta, q, k, v, s);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace foundry::gpu::ops
