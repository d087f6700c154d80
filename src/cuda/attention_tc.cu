// ops.h's bf16 attention: FlashAttention-2's schedule on tensor cores through mma.sync
// (m16n8k16: bf16 inputs, fp32 accumulation) with operands loaded by ldmatrix. A block of 4
// warps takes 64 query rows of one head (forward, dQ) or 64 keys of one KV head (dK, dV); each
// warp owns 16 of them. A warp's scores, probabilities and accumulators stay in its registers:
// m16n8k16's accumulator layout is fixed (a thread holds rows lane/4 and lane/4 + 8, columns
// 2·(lane % 4) and the next of each 8-column tile), so the online softmax rescales its rows in
// place, and two adjacent 8-column tiles of probabilities are, rounded to bf16, exactly the A
// operand of the next product over those 16 keys: nothing goes back through shared memory.
// Tiles are read from the fp32 tensors and rounded to bf16 into shared memory as they load.
// Each output element is summed by one thread in a fixed order: the bits repeat run to run.
// A chunk of the queries (context parallelism) walks fewer query rows with a shifted mask.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/ops.h"

namespace foundry::gpu::ops {

namespace {

using bf16_t = __nv_bfloat16;

constexpr int kTile = 64;     // rows a block owns (queries or keys), and keys of a forward/dQ tile
constexpr int kQTile = 32;    // query rows of a dK/dV tile (fewer live accumulators per thread)
constexpr int kWarps = 4;     // each warp: 16 of the block's rows
constexpr int kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// As attention.cu's: t key rows; tq query rows of which [q_begin, q_end) are computed, row r
// seeing keys 0 … r + shift; keys from keys_end on neither read nor written; dk and dv
// accumulated for a chunk.
struct Dims {
  int64_t b, t, h, kvh;
  int64_t tq, q_begin, q_end, shift, keys_end;
  bool accumulate;
  float scale;
};

// Row stride (elements) of a bf16 tile in shared memory: D + 8 puts consecutive rows 16 bytes
// (D = 128, 64) or 80 bytes (D = 32) past each other modulo 128, so the eight 16-byte rows one
// ldmatrix phase reads fall in distinct banks.
template <int D>
__host__ __device__ constexpr int ld() {
  return D + 8;
}
template <int D>
__host__ __device__ constexpr size_t tile_bytes(int rows) {
  return static_cast<size_t>(rows) * ld<D>() * sizeof(bf16_t);
}

// ---- warp-level matrix primitives ---------------------------------------------------------

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}
// c (16 × 8, fp32) += a (16 × 16, bf16) · b (16 × 8, bf16).
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two fp32 values rounded to bf16 into one register, `lo` in the low half (the lower column).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The A operand of rows r0 … r0 + 15, columns c0 … c0 + 15 of a row-major tile.
template <int D>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16_t* tile, int r0, int c0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(a, tile + (r0 + lane % 16) * ld<D>() + c0 + (lane / 16) * 8);
}
// B operands over k0 … k0 + 15 for the 8-column tiles n0 and n0 + 8, from a tile whose row n
// holds B's column n (K in Q·Kᵀ): b[0], b[1] for tile n0; b[2], b[3] for tile n0 + 8.
template <int D>
__device__ __forceinline__ void load_b_from_rows(uint32_t (&b)[4], const bf16_t* tile, int n0,
                                                 int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(b, tile + (n0 + lane % 8 + (lane / 16) * 8) * ld<D>() + k0 + (lane / 8 % 2) * 8);
}
// The same from a tile whose row k holds B's row k (V in P·V), transposed as it loads.
template <int D>
__device__ __forceinline__ void load_b_from_cols(uint32_t (&b)[4], const bf16_t* tile, int k0,
                                                 int n0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4_trans(b, tile + (k0 + lane % 16) * ld<D>() + n0 + (lane / 16) * 8);
}

// acc (16 × N) += A·Bᵀ over D: A = rows a0 … a0 + 15 of `a`, B = rows 0 … N − 1 of `bt`.
template <int D, int N>
__device__ __forceinline__ void rows_times_rows_t(float (&acc)[N / 8][4], const bf16_t* a, int a0,
                                                  const bf16_t* bt) {
#pragma unroll
  for (int k = 0; k < D; k += 16) {
    uint32_t fa[4];
    load_a<D>(fa, a, a0, k);
#pragma unroll
    for (int n = 0; n < N / 8; n += 2) {
      uint32_t fb[4];
      load_b_from_rows<D>(fb, bt, n * 8, k);
      mma(acc[n], fa, fb[0], fb[1]);
      mma(acc[n + 1], fa, fb[2], fb[3]);
    }
  }
}

// acc (16 × D) += P·B: P = 16 × N accumulators (rounded to bf16 here), B = rows 0 … N − 1 of
// `b`, D wide.
template <int D, int N>
__device__ __forceinline__ void probs_times_rows(float (&acc)[D / 8][4], const float (&p)[N / 8][4],
                                                 const bf16_t* b) {
#pragma unroll
  for (int k = 0; k < N / 16; ++k) {
    const uint32_t fa[4] = {
        pack_bf16(p[2 * k][0], p[2 * k][1]), pack_bf16(p[2 * k][2], p[2 * k][3]),
        pack_bf16(p[2 * k + 1][0], p[2 * k + 1][1]), pack_bf16(p[2 * k + 1][2], p[2 * k + 1][3])};
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t fb[4];
      load_b_from_cols<D>(fb, b, k * 16, n * 8);
      mma(acc[n], fa, fb[0], fb[1]);
      mma(acc[n + 1], fa, fb[2], fb[3]);
    }
  }
}

// Whether query row `query` attends to key `key`: causal, and the query is a computed row
// (rows past q_end are padding).
__device__ __forceinline__ bool sees(int64_t query, int64_t key, const Dims& s) {
  return query < s.q_end && key <= query + s.shift;
}

// Column of element i of 8-column accumulator tile n, and the row (0: lane/4, 1: lane/4 + 8).
__device__ __forceinline__ int column_of(int n, int i) {
  return n * 8 + 2 * (threadIdx.x % 4) + i % 2;
}

// ---- tiles in and out ---------------------------------------------------------------------

// count × D of a [B, rows, heads, D] fp32 tensor from row `first`, rounded to bf16 into shared
// memory; rows at or past `end` read as zeros.
template <int D>
__device__ void load_tile(bf16_t* dst, const float* src, int64_t rows, int64_t end,
                          int64_t heads, int64_t b, int64_t first, int64_t head, int count) {
  constexpr int kQuads = D / 4;
  for (int e = threadIdx.x; e < count * kQuads; e += kThreads) {
    const int r = e / kQuads, c = (e % kQuads) * 4;
    const int64_t t = first + r;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < end) x = *reinterpret_cast<const float4*>(src + ((b * rows + t) * heads + head) * D + c);
    *reinterpret_cast<uint2*>(dst + r * ld<D>() + c) =
        make_uint2(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w));
  }
}
template <int D>
__device__ void load_query_tile(bf16_t* dst, const float* src, const Dims& s, int64_t b,
                                int64_t first, int64_t head, int count) {
  load_tile<D>(dst, src, s.tq, s.q_end, s.h, b, first, head, count);
}
template <int D>
__device__ void load_key_tile(bf16_t* dst, const float* src, const Dims& s, int64_t b,
                              int64_t first, int64_t head) {
  load_tile<D>(dst, src, s.t, s.keys_end, s.kvh, b, first, head, kTile);
}

// A warp's 16 × D accumulators, scaled by `mul` per row, to rows `row[0]`, `row[1]` of a
// [T, heads, D] tensor whose row 0 is at `dst` (added to what is there when `add`); rows at or
// past `rows_left` are skipped.
template <int D>
__device__ void store_rows(float* dst, int64_t row_stride, int64_t rows_left,
                           const float (&acc)[D / 8][4], const int (&row)[2],
                           const float (&mul)[2], bool add = false) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= rows_left) continue;
    float* d = dst + row[r] * row_stride;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      float2* to = reinterpret_cast<float2*>(d + column_of(n, 0));
      float2 x = make_float2(acc[n][2 * r] * mul[r], acc[n][2 * r + 1] * mul[r]);
      if (add) x = make_float2(to->x + x.x, to->y + x.y);
      *to = x;
    }
  }
}

// The maximum over the four threads that share a row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---- forward ------------------------------------------------------------------------------

// One key tile of the online softmax for this thread's two rows: the scores `sc` (raw Q·Kᵀ)
// become unnormalized probabilities against the running maximum (log2 domain), and the output
// accumulators and running sums are rescaled for a raised maximum.
template <int D>
__device__ __forceinline__ void softmax_step(float (&sc)[kTile / 8][4], float (&o)[D / 8][4],
                                             float (&row_max)[2], float (&row_sum)[2],
                                             const int64_t (&qi)[2], int64_t k0, const Dims& s) {
  const float scale_log2 = s.scale * kLog2e;
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = i / 2;
      const int64_t kj = k0 + column_of(n, i);
      const float x = sees(qi[r], kj, s) ? sc[n][i] * scale_log2 : -INFINITY;
      sc[n][i] = x;
      tile_max[r] = fmaxf(tile_max[r], x);
    }
  float base[2], correction[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float new_max = fmaxf(row_max[r], quad_max(tile_max[r]));
    base[r] = new_max == -INFINITY ? 0.0f : new_max;  // a row that has seen no key yet
    correction[r] = exp2f(row_max[r] - base[r]);
    row_max[r] = new_max;
    row_sum[r] *= correction[r];
  }
#pragma unroll
  for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sc[n][i] = exp2f(sc[n][i] - base[i / 2]);
      row_sum[i / 2] += sc[n][i];
    }
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[n][i] *= correction[i / 2];
}

template <int D>
size_t forward_shared() {
  return 3 * tile_bytes<D>(kTile);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v,
                   Dims s) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* qs = reinterpret_cast<bf16_t*>(smem);
  bf16_t* ks = qs + kTile * ld<D>();
  bf16_t* vs = ks + kTile * ld<D>();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.y / s.h, h = blockIdx.y % s.h, kv = h / (s.h / s.kvh);
  // The longest rows first: the last query tiles see the most keys.
  const int64_t q0 = s.q_begin + static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kTile;
  load_query_tile<D>(qs, q, s, b, q0, h, kTile);
  const int row[2] = {warp * 16 + lane / 4, warp * 16 + lane / 4 + 8};
  const int64_t qi[2] = {q0 + row[0], q0 + row[1]};

  float o[D / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  const int64_t q_last = min(q0 + kTile, s.q_end) - 1;
  for (int64_t k0 = 0; k0 <= q_last + s.shift; k0 += kTile) {
    __syncthreads();  // the previous tile's K and V are read
    load_key_tile<D>(ks, k, s, b, k0, kv);
    load_key_tile<D>(vs, v, s, b, k0, kv);
    __syncthreads();
    float sc[kTile / 8][4] = {};
    rows_times_rows_t<D, kTile>(sc, qs, warp * 16, ks);
    softmax_step<D>(sc, o, row_max, row_sum, qi, k0, s);
    probs_times_rows<D, kTile>(o, sc, vs);
  }
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] = quad_sum(row_sum[r]);
    inv[r] = row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f;
    if (qi[r] < s.q_end && lane % 4 == 0)
      lse[(b * s.h + h) * s.tq + qi[r]] = row_max[r] * kLn2 + logf(row_sum[r]);
  }
  store_rows<D>(out + ((b * s.tq + q0) * s.h + h) * D, s.h * D, s.q_end - q0, o, row, inv);
}

// ---- backward -----------------------------------------------------------------------------

template <int D>
size_t dq_shared() {
  return 4 * tile_bytes<D>(kTile);
}

// dQ for 64 query rows of one head: Σ over key tiles of dS·K, with P and dP recomputed.
template <int D>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(float* dq, const float* dout, const float* lse, const float* delta, const float* q,
              const float* k, const float* v, Dims s) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* qs = reinterpret_cast<bf16_t*>(smem);
  bf16_t* dos = qs + kTile * ld<D>();
  bf16_t* ks = dos + kTile * ld<D>();
  bf16_t* vs = ks + kTile * ld<D>();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.y / s.h, h = blockIdx.y % s.h, kv = h / (s.h / s.kvh);
  const int64_t q0 = s.q_begin + static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kTile;
  load_query_tile<D>(qs, q, s, b, q0, h, kTile);
  load_query_tile<D>(dos, dout, s, b, q0, h, kTile);
  const int row[2] = {warp * 16 + lane / 4, warp * 16 + lane / 4 + 8};
  const int64_t qi[2] = {q0 + row[0], q0 + row[1]};
  float lse2[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse2[r] = qi[r] < s.q_end ? lse[(b * s.h + h) * s.tq + qi[r]] * kLog2e : 0.0f;
    row_delta[r] = qi[r] < s.q_end ? delta[(b * s.h + h) * s.tq + qi[r]] : 0.0f;
  }
  const float scale_log2 = s.scale * kLog2e;

  float acc[D / 8][4] = {};
  const int64_t q_last = min(q0 + kTile, s.q_end) - 1;
  for (int64_t k0 = 0; k0 <= q_last + s.shift; k0 += kTile) {
    __syncthreads();
    load_key_tile<D>(ks, k, s, b, k0, kv);
    load_key_tile<D>(vs, v, s, b, k0, kv);
    __syncthreads();
    float sc[kTile / 8][4] = {}, dp[kTile / 8][4] = {};
    rows_times_rows_t<D, kTile>(sc, qs, warp * 16, ks);
    rows_times_rows_t<D, kTile>(dp, dos, warp * 16, vs);
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = i / 2;
        const int64_t kj = k0 + column_of(n, i);
        const float p = sees(qi[r], kj, s) ? exp2f(sc[n][i] * scale_log2 - lse2[r]) : 0.0f;
        sc[n][i] = p * (dp[n][i] - row_delta[r]) * s.scale;  // dS
      }
    probs_times_rows<D, kTile>(acc, sc, ks);
  }
  const float one[2] = {1.0f, 1.0f};
  store_rows<D>(dq + ((b * s.tq + q0) * s.h + h) * D, s.h * D, s.q_end - q0, acc, row, one);
}

template <int D>
size_t dkdv_shared() {
  return 2 * tile_bytes<D>(kTile) + 2 * tile_bytes<D>(kQTile) + 2 * kQTile * sizeof(float);
}

// dK and dV for 64 keys of one KV head: Σ over the group's query heads (in order) and the query
// tiles that see the keys of Pᵀ·dO and dSᵀ·Q. Warp w computes the transposed scores of keys
// [16w, 16w + 16) against each query tile, so Pᵀ and dSᵀ are its own accumulators.
template <int D>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(float* dk, float* dv, const float* dout, const float* lse, const float* delta,
                const float* q, const float* k, const float* v, Dims s) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* ks = reinterpret_cast<bf16_t*>(smem);
  bf16_t* vs = ks + kTile * ld<D>();
  bf16_t* qs = vs + kTile * ld<D>();
  bf16_t* dos = qs + kQTile * ld<D>();
  float* col_lse2 = reinterpret_cast<float*>(dos + kQTile * ld<D>());
  float* col_delta = col_lse2 + kQTile;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.y / s.kvh, kv = blockIdx.y % s.kvh, group = s.h / s.kvh;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kTile;
  load_key_tile<D>(ks, k, s, b, k0, kv);
  load_key_tile<D>(vs, v, s, b, k0, kv);
  const int row[2] = {warp * 16 + lane / 4, warp * 16 + lane / 4 + 8};
  const int64_t kj[2] = {k0 + row[0], k0 + row[1]};
  const float scale_log2 = s.scale * kLog2e;

  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kv * group + g;
    // Query rows before the first that sees k0 see none of the keys.
    for (int64_t q0 = max(s.q_begin, k0 - s.shift); q0 < s.q_end; q0 += kQTile) {
      __syncthreads();  // the previous tile's Q, dO and row statistics are read
      load_query_tile<D>(qs, q, s, b, q0, h, kQTile);
      load_query_tile<D>(dos, dout, s, b, q0, h, kQTile);
      for (int c = threadIdx.x; c < kQTile; c += kThreads) {
        const int64_t qi = q0 + c;
        col_lse2[c] = qi < s.q_end ? lse[(b * s.h + h) * s.tq + qi] * kLog2e : 0.0f;
        col_delta[c] = qi < s.q_end ? delta[(b * s.h + h) * s.tq + qi] : 0.0f;
      }
      __syncthreads();
      float pt[kQTile / 8][4] = {}, dst[kQTile / 8][4] = {};
      rows_times_rows_t<D, kQTile>(pt, ks, warp * 16, qs);    // Sᵀ = K·Qᵀ
      rows_times_rows_t<D, kQTile>(dst, vs, warp * 16, dos);  // dPᵀ = V·dOᵀ
#pragma unroll
      for (int n = 0; n < kQTile / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = column_of(n, i);
          const int64_t qi = q0 + c;
          const float p =
              sees(qi, kj[i / 2], s) ? exp2f(pt[n][i] * scale_log2 - col_lse2[c]) : 0.0f;
          pt[n][i] = p;
          dst[n][i] = p * (dst[n][i] - col_delta[c]) * s.scale;
        }
      probs_times_rows<D, kQTile>(dv_acc, pt, dos);  // dV += Pᵀ·dO
      probs_times_rows<D, kQTile>(dk_acc, dst, qs);  // dK += dSᵀ·Q
    }
  }
  const float one[2] = {1.0f, 1.0f};
  const int64_t first = ((b * s.t + k0) * s.kvh + kv) * D;
  store_rows<D>(dk + first, s.kvh * D, s.keys_end - k0, dk_acc, row, one, s.accumulate);
  store_rows<D>(dv + first, s.kvh * D, s.keys_end - k0, dv_acc, row, one, s.accumulate);
}

// ---- launches -----------------------------------------------------------------------------

Dims dims_of(const AttentionDims& a) {
  const AttentionRows r = attention_rows(a);
  return {a.b,     a.t,     a.h,     a.kvh,   r.tq, r.q_begin, r.q_end, r.shift,
          r.q_end + r.shift, r.accumulate,
          static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.d)))};
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
  forward_kernel<D><<<dim3(tiles(s.q_end - s.q_begin, kTile), static_cast<unsigned>(s.b * s.h)),
                      kThreads,
                      shared>>>(out, lse, q, k, v, s);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void backward(float* dq, float* dk, float* dv, const float* dout, const float* lse,
              const float* delta, const float* q, const float* k, const float* v,
              const Dims& s) {
  const size_t dq_bytes = dq_shared<D>();
  allow_shared(dq_kernel<D>, dq_bytes);
  dq_kernel<D><<<dim3(tiles(s.q_end - s.q_begin, kTile), static_cast<unsigned>(s.b * s.h)),
                 kThreads,
                 dq_bytes>>>(dq, dout, lse, delta, q, k, v, s);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
  const size_t kv_bytes = dkdv_shared<D>();
  allow_shared(dkdv_kernel<D>, kv_bytes);
  // Keys past the last query's position are seen by none: a chunk leaves their dk, dv as
  // they are.
  dkdv_kernel<D><<<dim3(tiles(s.keys_end, kTile), static_cast<unsigned>(s.b * s.kvh)), kThreads,
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
