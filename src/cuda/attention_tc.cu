// ops.h's bf16 attention: FlashAttention's schedule on tensor cores (WMMA, 16×16×16 bf16
// products into fp32). A block of 4 warps takes 64 query rows of one head (forward, dQ) or
// 64 keys of one KV head (dK, dV); each warp owns 16 rows of the tile it computes scores for.
// Tiles are read from the fp32 tensors and rounded to bf16 into shared memory as they are
// loaded. Scores go through shared memory in fp32: the softmax (and the rescaling of the
// forward's output rows, which live in shared memory for that reason) is plain fp32 code over
// known (row, column) positions, never over a fragment's private layout.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/check.h"
#include "cuda/ops.h"

namespace foundry::gpu::ops {

namespace {

namespace wmma = nvcuda::wmma;
using bf16_t = __nv_bfloat16;

constexpr int kRows = 64;   // query rows of a block (forward, dQ) and of a query tile (dK, dV)
constexpr int kKeys = 64;   // keys of a tile (forward, dQ) and of a block (dK, dV)
constexpr int kWarps = 4;   // each warp: 16 of the rows
constexpr int kThreads = 32 * kWarps;
constexpr int kLdS = kKeys + 4;  // fp32 score rows (16-byte multiple, off the bank stride)
constexpr int kLdP = kKeys + 8;  // bf16 probability rows

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

struct Dims {
  int64_t b, t, h, kvh;
  float scale;
};

// Shared-memory layout of one kernel: regions carved in order, each 128-byte aligned.
struct Carver {
  unsigned char* base;
  size_t used = 0;
  template <typename T>
  __device__ T* take(size_t count) {
    T* p = reinterpret_cast<T*>(base + used);
    used += (count * sizeof(T) + 127) / 128 * 128;
    return p;
  }
};
template <typename T>
__host__ __device__ constexpr size_t region(size_t count) {
  return (count * sizeof(T) + 127) / 128 * 128;
}
// The fp32 score and score-gradient tiles (2 × 64 rows), which hold 64 rows of staged D-wide
// gradients at the end of a backward kernel.
template <int D>
__host__ __device__ constexpr size_t score_region() {
  return region<float>(2 * 64 * kLdS) > region<float>(64 * (D + 4)) ? region<float>(2 * 64 * kLdS)
                                                                       : region<float>(64 * (D + 4));
}

// rows × D of a [B, T, heads, D] fp32 tensor from position `first`, rounded to bf16 into
// shared memory (row stride D + 8); rows past T read as zeros.
template <int D>
__device__ void load_tile(bf16_t* dst, const float* src, const Dims& s, int64_t heads, int64_t b,
                          int64_t first, int64_t head, int rows) {
  constexpr int kLd = D + 8, kQuads = D / 4;
  for (int e = threadIdx.x; e < rows * kQuads; e += kThreads) {
    const int r = e / kQuads, c = (e % kQuads) * 4;
    const int64_t t = first + r;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < s.t) x = *reinterpret_cast<const float4*>(src + ((b * s.t + t) * heads + head) * D + c);
    bf16_t* d = dst + r * kLd + c;
    d[0] = __float2bfloat16_rn(x.x);
    d[1] = __float2bfloat16_rn(x.y);
    d[2] = __float2bfloat16_rn(x.z);
    d[3] = __float2bfloat16_rn(x.w);
  }
}

// The saved log-sum-exp and Δ of query rows q0 … q0 + 63 of head h (0 past T).
__device__ void load_row_stats(float* row_lse, float* row_delta, const float* lse,
                               const float* delta, const Dims& s, int64_t b, int64_t h,
                               int64_t q0) {
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const int64_t qi = q0 + r;
    row_lse[r] = qi < s.t ? lse[(b * s.h + h) * s.t + qi] : 0.0f;
    row_delta[r] = qi < s.t ? delta[(b * s.h + h) * s.t + qi] : 0.0f;
  }
}

// This warp's 16 rows of A·Bᵀ into fp32 rows of `c` (stride kLdS): A rows `a` (stride
// D + 8), B = 64 rows `bt` (stride D + 8), so column j of the result is row j of `bt`.
template <int D>
__device__ void rows_times_rows_t(float* c, const bf16_t* a, const bf16_t* bt) {
  constexpr int kLd = D + 8;
#pragma unroll
  for (int j = 0; j < kKeys / 16; ++j) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      FragA fa;
      FragBT fb;
      wmma::load_matrix_sync(fa, a + kk * 16, kLd);
      wmma::load_matrix_sync(fb, bt + j * 16 * kLd + kk * 16, kLd);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + j * 16, acc, kLdS, wmma::mem_row_major);
  }
}

// acc[dt] += A·B over 64 inner positions: A = this warp's 16 rows of `p` (stride kLdP) or,
// with `transpose_a`, columns 16w … 16w + 15 of `p` read as rows; B = 64 rows of `b` (stride
// D + 8).
template <int D, bool kTransposeA>
__device__ void accumulate_products(FragC (&acc)[D / 16], const bf16_t* p, const bf16_t* b) {
  constexpr int kLd = D + 8;
#pragma unroll
  for (int kk = 0; kk < 64 / 16; ++kk) {
    typename std::conditional<kTransposeA, FragAT, FragA>::type fa;
    wmma::load_matrix_sync(fa, kTransposeA ? p + kk * 16 * kLdP : p + kk * 16, kLdP);
#pragma unroll
    for (int dt = 0; dt < D / 16; ++dt) {
      FragB fb;
      wmma::load_matrix_sync(fb, b + kk * 16 * kLd + dt * 16, kLd);
      wmma::mma_sync(acc[dt], fa, fb, acc[dt]);
    }
  }
}

// ---- forward ----------------------------------------------------------------------------

template <int D>
size_t forward_shared() {
  return 3 * region<bf16_t>(64 * (D + 8)) + region<float>(kRows * kLdS) +
         region<bf16_t>(kRows * kLdP) + region<float>(kRows * (D + 4));
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v,
                   Dims s) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kLd = D + 8, kLdO = D + 4;
  Carver carve{smem};
  bf16_t* qs = carve.take<bf16_t>(kRows * kLd);
  bf16_t* ks = carve.take<bf16_t>(kKeys * kLd);
  bf16_t* vs = carve.take<bf16_t>(kKeys * kLd);
  float* ss = carve.take<float>(kRows * kLdS);
  bf16_t* ps = carve.take<bf16_t>(kRows * kLdP);
  float* os = carve.take<float>(kRows * kLdO);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.y / s.h, h = blockIdx.y % s.h, kv = h / (s.h / s.kvh);
  // The longest rows first: the last query tiles see the most keys.
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kRows;
  load_tile<D>(qs, q, s, s.h, b, q0, h, kRows);
  for (int e = threadIdx.x; e < kRows * D; e += kThreads) os[(e / D) * kLdO + e % D] = 0.0f;

  // Lanes 2r and 2r + 1 of a warp share row r of its 16: columns [32·half, 32·half + 32) of
  // the scores, [D/2·half, D/2·half + D/2) of the output.
  const int row = warp * 16 + lane / 2, half = lane % 2;
  const int64_t qi = q0 + row;
  float row_max = -INFINITY, row_sum = 0.0f;
  const int64_t q_last = min(q0 + kRows, s.t) - 1;
  for (int64_t k0 = 0; k0 <= q_last; k0 += kKeys) {
    __syncthreads();  // the previous tile's K and V are read (and, at first, Q and O are set)
    load_tile<D>(ks, k, s, s.kvh, b, k0, kv, kKeys);
    load_tile<D>(vs, v, s, s.kvh, b, k0, kv, kKeys);
    __syncthreads();
    rows_times_rows_t<D>(ss + warp * 16 * kLdS, qs + warp * 16 * kLd, ks);
    __syncwarp();

    float* srow = ss + row * kLdS + half * 32;
    float tile_max = -INFINITY;
    for (int c = 0; c < 32; ++c) {
      const int64_t kj = k0 + half * 32 + c;
      const float x = (qi < s.t && kj <= qi) ? srow[c] * s.scale : -INFINITY;
      srow[c] = x;
      tile_max = fmaxf(tile_max, x);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float new_max = fmaxf(row_max, tile_max);
    bf16_t* prow = ps + row * kLdP + half * 32;
    float correction = 1.0f, sum = 0.0f;
    if (new_max == -INFINITY) {  // nothing seen yet (a row past T)
      for (int c = 0; c < 32; ++c) prow[c] = __float2bfloat16_rn(0.0f);
    } else {
      correction = expf(row_max - new_max);
      for (int c = 0; c < 32; ++c) {
        const float p = expf(srow[c] - new_max);
        prow[c] = __float2bfloat16_rn(p);
        sum += p;
      }
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    row_sum = row_sum * correction + sum;
    row_max = new_max;
    float* orow = os + row * kLdO + half * (D / 2);
    for (int c = 0; c < D / 2; ++c) orow[c] *= correction;
    __syncwarp();

    // O (this warp's 16 rows) += P·V, through its fp32 rows in shared memory.
    FragC acc[D / 16];
#pragma unroll
    for (int dt = 0; dt < D / 16; ++dt)
      wmma::load_matrix_sync(acc[dt], os + warp * 16 * kLdO + dt * 16, kLdO, wmma::mem_row_major);
    accumulate_products<D, false>(acc, ps + warp * 16 * kLdP, vs);
#pragma unroll
    for (int dt = 0; dt < D / 16; ++dt)
      wmma::store_matrix_sync(os + warp * 16 * kLdO + dt * 16, acc[dt], kLdO, wmma::mem_row_major);
    __syncwarp();
  }
  if (qi < s.t) {
    const float inv = 1.0f / row_sum;
    auto* dst = reinterpret_cast<float4*>(out + ((b * s.t + qi) * s.h + h) * D + half * (D / 2));
    const auto* src = reinterpret_cast<const float4*>(os + row * kLdO + half * (D / 2));
    for (int c = 0; c < D / 8; ++c) {
      const float4 x = src[c];
      dst[c] = make_float4(x.x * inv, x.y * inv, x.z * inv, x.w * inv);
    }
    if (half == 0) lse[(b * s.h + h) * s.t + qi] = row_max + logf(row_sum);
  }
}

// ---- backward ---------------------------------------------------------------------------

// P = exp(S·scale − lse) and dS = P ∘ (dP − Δ)·scale of row `row` (lanes 2r, 2r + 1 of its
// warp, 32 columns each), both rounded to bf16 (P only when `ps` is set).
__device__ void probabilities_and_score_grads(bf16_t* ps, bf16_t* dss, const float* ss,
                                              const float* dps, const float* row_lse,
                                              const float* row_delta, const Dims& s, int row,
                                              int half, int64_t qi, int64_t k0) {
  const float* srow = ss + row * kLdS + half * 32;
  const float* dprow = dps + row * kLdS + half * 32;
  for (int c = 0; c < 32; ++c) {
    const int64_t kj = k0 + half * 32 + c;
    float p = 0.0f, ds = 0.0f;
    if (qi < s.t && kj <= qi) {
      p = expf(srow[c] * s.scale - row_lse[row]);
      ds = p * (dprow[c] - row_delta[row]) * s.scale;
    }
    if (ps) ps[row * kLdP + half * 32 + c] = __float2bfloat16_rn(p);
    dss[row * kLdP + half * 32 + c] = __float2bfloat16_rn(ds);
  }
}

// A warp's 16 × D accumulators to rows [16w, 16w + 16) of a [T, heads, D] tensor: staged at
// rows of `stage` (stride D + 4), then copied out by the lane pair of each row (`row`, `half`);
// rows at or past `rows_left` are not written.
template <int D>
__device__ void write_rows(float* dst, int64_t row_stride, int64_t rows_left, float* stage,
                           FragC (&acc)[D / 16], int warp, int row, int half) {
#pragma unroll
  for (int dt = 0; dt < D / 16; ++dt)
    wmma::store_matrix_sync(stage + warp * 16 * (D + 4) + dt * 16, acc[dt], D + 4,
                            wmma::mem_row_major);
  __syncwarp();
  if (row < rows_left) {
    auto* d = reinterpret_cast<float4*>(dst + row * row_stride + half * (D / 2));
    const auto* src = reinterpret_cast<const float4*>(stage + row * (D + 4) + half * (D / 2));
    for (int c = 0; c < D / 8; ++c) d[c] = src[c];
  }
  __syncwarp();
}

template <int D>
size_t dq_shared() {
  return 4 * region<bf16_t>(64 * (D + 8)) + score_region<D>() + region<bf16_t>(kRows * kLdP) +
         2 * region<float>(kRows);
}

// dQ for 64 query rows of one head: Σ over key tiles of dS·K.
template <int D>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(float* dq, const float* dout, const float* lse, const float* delta,
              const float* q, const float* k, const float* v, Dims s) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kLd = D + 8;
  Carver carve{smem};
  bf16_t* qs = carve.take<bf16_t>(kRows * kLd);
  bf16_t* dos = carve.take<bf16_t>(kRows * kLd);
  bf16_t* ks = carve.take<bf16_t>(kKeys * kLd);
  bf16_t* vs = carve.take<bf16_t>(kKeys * kLd);
  float* scores = carve.take<float>(score_region<D>() / sizeof(float));
  float* ss = scores;
  float* dps = scores + kRows * kLdS;
  bf16_t* dss = carve.take<bf16_t>(kRows * kLdP);
  float* row_lse = carve.take<float>(kRows);
  float* row_delta = carve.take<float>(kRows);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.y / s.h, h = blockIdx.y % s.h, kv = h / (s.h / s.kvh);
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kRows;
  load_tile<D>(qs, q, s, s.h, b, q0, h, kRows);
  load_tile<D>(dos, dout, s, s.h, b, q0, h, kRows);
  load_row_stats(row_lse, row_delta, lse, delta, s, b, h, q0);
  const int row = warp * 16 + lane / 2, half = lane % 2;
  const int64_t qi = q0 + row;

  FragC acc[D / 16];
#pragma unroll
  for (int dt = 0; dt < D / 16; ++dt) wmma::fill_fragment(acc[dt], 0.0f);
  const int64_t q_last = min(q0 + kRows, s.t) - 1;
  for (int64_t k0 = 0; k0 <= q_last; k0 += kKeys) {
    __syncthreads();
    load_tile<D>(ks, k, s, s.kvh, b, k0, kv, kKeys);
    load_tile<D>(vs, v, s, s.kvh, b, k0, kv, kKeys);
    __syncthreads();
    rows_times_rows_t<D>(ss + warp * 16 * kLdS, qs + warp * 16 * kLd, ks);
    rows_times_rows_t<D>(dps + warp * 16 * kLdS, dos + warp * 16 * kLd, vs);
    __syncwarp();
    probabilities_and_score_grads(nullptr, dss, ss, dps, row_lse, row_delta, s, row, half, qi,
                                  k0);
    __syncwarp();
    accumulate_products<D, false>(acc, dss + warp * 16 * kLdP, ks);
  }
  __syncthreads();  // every warp is done with the score buffers: they stage dQ
  write_rows<D>(dq + ((b * s.t + q0) * s.h + h) * D, s.h * D, s.t - q0, scores, acc, warp, row,
                half);
}

template <int D>
size_t dkdv_shared() {
  return 4 * region<bf16_t>(64 * (D + 8)) + score_region<D>() + 2 * region<bf16_t>(kRows * kLdP) +
         2 * region<float>(kRows);
}

// dK and dV for 64 keys of one KV head: Σ over the group's query heads (in order) and the
// query tiles that see the keys of Pᵀ·dO and dSᵀ·Q. Warp w computes scores for query rows
// [16w, 16w + 16) of a tile and accumulates the gradients of keys [16w, 16w + 16).
template <int D>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(float* dk, float* dv, const float* dout, const float* lse, const float* delta,
                const float* q, const float* k, const float* v, Dims s) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kLd = D + 8;
  Carver carve{smem};
  bf16_t* ks = carve.take<bf16_t>(kKeys * kLd);
  bf16_t* vs = carve.take<bf16_t>(kKeys * kLd);
  bf16_t* qs = carve.take<bf16_t>(kRows * kLd);
  bf16_t* dos = carve.take<bf16_t>(kRows * kLd);
  float* scores = carve.take<float>(score_region<D>() / sizeof(float));
  float* ss = scores;
  float* dps = scores + kRows * kLdS;
  bf16_t* ps = carve.take<bf16_t>(kRows * kLdP);
  bf16_t* dss = carve.take<bf16_t>(kRows * kLdP);
  float* row_lse = carve.take<float>(kRows);
  float* row_delta = carve.take<float>(kRows);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.y / s.kvh, kv = blockIdx.y % s.kvh, group = s.h / s.kvh;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kKeys;
  load_tile<D>(ks, k, s, s.kvh, b, k0, kv, kKeys);
  load_tile<D>(vs, v, s, s.kvh, b, k0, kv, kKeys);
  const int row = warp * 16 + lane / 2, half = lane % 2;

  FragC dk_acc[D / 16], dv_acc[D / 16];
#pragma unroll
  for (int dt = 0; dt < D / 16; ++dt) {
    wmma::fill_fragment(dk_acc[dt], 0.0f);
    wmma::fill_fragment(dv_acc[dt], 0.0f);
  }
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kv * group + g;
    for (int64_t q0 = k0; q0 < s.t; q0 += kRows) {  // tiles before k0 see none of the keys
      __syncthreads();  // the previous tile's Q, dO, P and dS are read
      load_tile<D>(qs, q, s, s.h, b, q0, h, kRows);
      load_tile<D>(dos, dout, s, s.h, b, q0, h, kRows);
      load_row_stats(row_lse, row_delta, lse, delta, s, b, h, q0);
      __syncthreads();
      rows_times_rows_t<D>(ss + warp * 16 * kLdS, qs + warp * 16 * kLd, ks);
      rows_times_rows_t<D>(dps + warp * 16 * kLdS, dos + warp * 16 * kLd, vs);
      __syncwarp();
      probabilities_and_score_grads(ps, dss, ss, dps, row_lse, row_delta, s, row, half,
                                    q0 + row, k0);
      __syncthreads();  // the products below read every row of P and dS
      accumulate_products<D, true>(dv_acc, ps + warp * 16, dos);
      accumulate_products<D, true>(dk_acc, dss + warp * 16, qs);
    }
  }
  __syncthreads();  // every warp is done with the score buffers: they stage dK, then dV
  const int64_t first = ((b * s.t + k0) * s.kvh + kv) * D;
  write_rows<D>(dk + first, s.kvh * D, s.t - k0, scores, dk_acc, warp, row, half);
  write_rows<D>(dv + first, s.kvh * D, s.t - k0, scores, dv_acc, warp, row, half);
}

Dims dims_of(const AttentionDims& a) {
  FOUNDRY_GPU_CHECK(a.kvh >= 1 && a.h % a.kvh == 0);
  return {a.b, a.t, a.h, a.kvh, static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.d)))};
}

template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    FOUNDRY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(bytes)));
}

unsigned tiles(int64_t n, int64_t per) { return static_cast<unsigned>((n + per - 1) / per); }

template <int D>
void forward(float* out, float* lse, const float* q, const float* k, const float* v,
             const Dims& s) {
  const size_t shared = forward_shared<D>();
  allow_shared(forward_kernel<D>, shared);
  forward_kernel<D><<<dim3(tiles(s.t, kRows), static_cast<unsigned>(s.b * s.h)), kThreads,
                      shared>>>(out, lse, q, k, v, s);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void backward(float* dq, float* dk, float* dv, const float* dout, const float* lse,
              const float* delta, const float* q, const float* k, const float* v,
              const Dims& s) {
  const size_t dq_bytes = dq_shared<D>();
  allow_shared(dq_kernel<D>, dq_bytes);
  dq_kernel<D><<<dim3(tiles(s.t, kRows), static_cast<unsigned>(s.b * s.h)), kThreads,
                 dq_bytes>>>(dq, dout, lse, delta, q, k, v, s);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
  const size_t kv_bytes = dkdv_shared<D>();
  allow_shared(dkdv_kernel<D>, kv_bytes);
  dkdv_kernel<D><<<dim3(tiles(s.t, kKeys), static_cast<unsigned>(s.b * s.kvh)), kThreads,
                   kv_bytes>>>(dk, dv, dout, lse, delta, q, k, v, s);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool attention_on_tensor_cores(const AttentionDims& s, const void* q, const void* k,
                               const void* v, const void* out) {
  return (s.d == 32 || s.d == 64 || s.d == 128) && s.kvh >= 1 && s.h % s.kvh == 0 &&
         aligned16(q) && aligned16(k) && aligned16(v) && aligned16(out);
}

void attention_forward_bf16(float* out, float* lse, const float* q, const float* k,
                            const float* v, const AttentionDims& a) {
  FOUNDRY_GPU_CHECK(attention_on_tensor_cores(a, q, k, v, out));
  const Dims s = dims_of(a);
  if (s.b * s.t * s.h == 0) return;
  switch (a.d) {
    case 32: return forward<32>(out, lse, q, k, v, s);
    case 64: return forward<64>(out, lse, q, k, v, s);
    default: return forward<128>(out, lse, q, k, v, s);
  }
}

void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout,
                             const float* out, const float* lse, const float* q, const float* k,
                             const float* v, const AttentionDims& a, float* scratch) {
  FOUNDRY_GPU_CHECK(attention_on_tensor_cores(a, q, k, v, out) && aligned16(dout) &&
                    aligned16(dq) && aligned16(dk) && aligned16(dv));
  const Dims s = dims_of(a);
  if (s.b * s.t * s.h == 0) return;
  attention_delta(scratch, dout, out, a);
  switch (a.d) {
    case 32: return backward<32>(dq, dk, dv, dout, lse, scratch, q, k, v, s);
    case 64: return backward<64>(dq, dk, dv, dout, lse, scratch, q, k, v, s);
    default: return backward<128>(dq, dk, dv, dout, lse, scratch, q, k, v, s);
  }
}

}  // namespace foundry::gpu::ops
