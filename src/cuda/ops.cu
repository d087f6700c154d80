// ops.h's kernels. Rows go to blocks of kThreads threads; a block's reductions run through
// shared memory in a fixed tree, so a result never depends on timing.
#include <cuda_runtime.h>

#include <cmath>
#include <initializer_list>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"

namespace foundry::gpu::ops {

namespace {

constexpr int kThreads = kBlockThreads;
constexpr int64_t kRowsPerChunk = 32;  // rmsnorm_backward's dweight chunks (as on the CPU)

__device__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// ---- RMSNorm ----

__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* in,
                                       const float* weight, int64_t c, float eps) {
  __shared__ float shared[kThreads];
  const float* x = in + blockIdx.x * c;
  float* y = out + blockIdx.x * c;
  float sum_sq = 0;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) sum_sq += x[j] * x[j];
  sum_sq = block_sum<kThreads>(sum_sq, shared);
  const float r = 1.0f / sqrtf(sum_sq / static_cast<float>(c) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) y[j] = x[j] * r * weight[j];
}

// One block per chunk of kRowsPerChunk rows: dx for its rows, and the chunk's dweight partial.
// With a residual, dx = residual_scale ⊙ residual + the norm's gradient (written).
__global__ void rmsnorm_backward_kernel(float* din, float* partials, const float* dout,
                                        const float* in, const float* weight, const float* rstd,
                                        const float* residual, const float* residual_scale,
                                        int64_t n, int64_t c) {
  __shared__ float shared[kThreads];
  float* dw = partials + blockIdx.x * c;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) dw[j] = 0;
  const int64_t row_end = min(n, (static_cast<int64_t>(blockIdx.x) + 1) * kRowsPerChunk);
  const float inv_c = 1.0f / static_cast<float>(c);
  for (int64_t i = blockIdx.x * kRowsPerChunk; i < row_end; ++i) {
    const float* x = in + i * c;
    const float* dy = dout + i * c;
    float* dx = din + i * c;
    const float r = rstd[i];
    float dot = 0;
    for (int64_t j = threadIdx.x; j < c; j += kThreads) dot += dy[j] * weight[j] * x[j];
    dot = block_sum<kThreads>(dot, shared);
    const float coef = dot * r * r * r * inv_c;
    for (int64_t j = threadIdx.x; j < c; j += kThreads) {
      const float grad = r * weight[j] * dy[j] - coef * x[j];
      dx[j] = residual ? residual_scale[j] * residual[i * c + j] + grad : dx[j] + grad;
      dw[j] += dy[j] * x[j] * r;
    }
  }
}

// dweight [C] += the chunks' partials, in chunk order.
__global__ void sum_chunks_kernel(float* dweight, const float* partials, int64_t chunks, int64_t c) {
  FOUNDRY_FOR_EACH(j, c) {
    float acc = dweight[j];
    for (int64_t chunk = 0; chunk < chunks; ++chunk) acc += partials[chunk * c + j];
    dweight[j] = acc;
  }
}

// ---- RoPE ----

// x1·cs − x2·s and x2·cs + x1·s rounded as nvcc compiled them when a thread rotated one
// element: x1·cs and x2·cs fused into an FMA, the other product rounded first. Which product
// nvcc fuses depends on the code around it, so the FMAs are written out.
__device__ void rotate_pair(float* p1, float* p2, float cs, float s) {
  const float x1 = *p1, x2 = *p2;
  *p1 = __fmaf_rn(x1, cs, -__fmul_rn(x2, s));
  *p2 = __fmaf_rn(x2, cs, __fmul_rn(x1, s));
}

// One thread per (row of [B·T], pair), rotating that pair in every head: the angle's pow, cos
// and sin in double cost far more than the pair's memory traffic, and all heads share them.
// Row r sits at position pos_offset + r % t, or at positions[r] where given.
__global__ void rope_kernel(float* x, int64_t rows, int64_t t, int64_t h, int64_t d,
                            int64_t half, int64_t pos_offset, const int64_t* positions,
                            double theta, float sin_sign) {
  FOUNDRY_FOR_EACH(index, rows * half) {
    const int64_t i = index % half, row = index / half;
    const double inv_freq = pow(theta, -static_cast<double>(i) / static_cast<double>(half));
    const int64_t position = positions ? positions[row] : pos_offset + row % t;
    const double angle = static_cast<double>(position) * inv_freq;
    const float cs = static_cast<float>(cos(angle)), s = sin_sign * static_cast<float>(sin(angle));
    float* p = x + row * h * d;
    for (int64_t head = 0; head < h; ++head, p += d) rotate_pair(p + i, p + i + half, cs, s);
  }
}

// ---- SwiGLU ----

// Rows i of h [N, 2F] by launch_rows, W columns j a thread at a time (W = 4 where F and the
// pointers allow: launch_swiglu_forward); out (fp32) or out16 (bf16) [N, F].
template <int W>
__global__ void swiglu_forward_kernel(float* out, uint16_t* out16, const float* h, int64_t n,
                                      int64_t f) {
  FOUNDRY_FOR_EACH_ROW(i, n) {
    const float* gate = h + i * 2 * f;
    FOUNDRY_FOR_EACH_COL(q, f / W) {
      const int64_t j = q * W;
      const Lanes<W> g = load_lanes<W>(gate + j), u = load_lanes<W>(gate + f + j);
      Lanes<W> y;
      for (int l = 0; l < W; ++l) y.v[l] = g.v[l] * sigmoid(g.v[l]) * u.v[l];
      if (out16) store_lanes<W>(out16 + i * f + j, y);
      else store_lanes<W>(out + i * f + j, y);
    }
  }
}

template <int W>
__global__ void swiglu_backward_kernel(float* dh, uint16_t* dh16, const float* dout,
                                       const float* h, int64_t n, int64_t f) {
  FOUNDRY_FOR_EACH_ROW(i, n) {
    const float* gate = h + i * 2 * f;
    FOUNDRY_FOR_EACH_COL(q, f / W) {
      const int64_t j = q * W;
      const Lanes<W> g = load_lanes<W>(gate + j), u = load_lanes<W>(gate + f + j),
                     dy = load_lanes<W>(dout + i * f + j);
      Lanes<W> dg, du;
      for (int l = 0; l < W; ++l) {
        const float s = sigmoid(g.v[l]);
        dg.v[l] = dy.v[l] * u.v[l] * s * (1.0f + g.v[l] * (1.0f - s));
        du.v[l] = dy.v[l] * g.v[l] * s;
      }
      if (dh16) {
        store_lanes<W>(dh16 + i * 2 * f + j, dg);
        store_lanes<W>(dh16 + i * 2 * f + f + j, du);
      } else {
        store_lanes<W>(dh + i * 2 * f + j, dg);
        store_lanes<W>(dh + i * 2 * f + f + j, du);
      }
    }
  }
}

// ---- router ----

__global__ void router_forward_kernel(float* probs, int32_t* topk_idx, float* topk_w,
                                      const float* logits, int64_t n, int64_t e, int64_t k,
                                      bool renormalize) {
  FOUNDRY_FOR_EACH(i, n) {
    float* p = probs + i * e;
    softmax_row(p, logits + i * e, e);
    int32_t* idx = topk_idx + i * k;
    float* w = topk_w + i * k;
    float selected = 0;
    for (int64_t slot = 0; slot < k; ++slot) {
      int64_t best = -1;
      for (int64_t j = 0; j < e; ++j) {
        bool taken = false;
        for (int64_t s = 0; s < slot; ++s) taken |= idx[s] == j;
        if (!taken && (best < 0 || p[j] > p[best])) best = j;
      }
      idx[slot] = static_cast<int32_t>(best);
      w[slot] = p[best];
      selected += p[best];
    }
    if (renormalize)
      for (int64_t slot = 0; slot < k; ++slot) w[slot] /= selected;
  }
}

// ---- MoE gather / combine ----

// The kernels over [rows, C] below go by rows (launch_rows), W columns a thread at a time
// (lanes_for: W = 4 where C and the pointers allow).
template <int W>
__global__ void gather_kernel(float* xs, const float* x, const int32_t* slot_token, int64_t rows,
                              int64_t c) {
  FOUNDRY_FOR_EACH_ROW(r, rows) {
    const float* src = x + slot_token[r] * c;
    FOUNDRY_FOR_EACH_COL(q, c / W) store_lanes<W>(xs + r * c + q * W, load_lanes<W>(src + q * W));
  }
}

template <int W>
__global__ void combine_kernel(float* out, const float* ys, const float* topk_w,
                               const int32_t* assignment_slot, int64_t n, int64_t k, int64_t c) {
  FOUNDRY_FOR_EACH_ROW(i, n) {
    FOUNDRY_FOR_EACH_COL(q, c / W) {
      const int64_t j = q * W;
      Lanes<W> acc = load_lanes<W>(out + i * c + j);
      for (int64_t a = 0; a < k; ++a) {
        const float w = topk_w[i * k + a];
        const Lanes<W> y = load_lanes<W>(ys + assignment_slot[i * k + a] * c + j);
        for (int l = 0; l < W; ++l) acc.v[l] += w * y.v[l];
      }
      store_lanes<W>(out + i * c + j, acc);
    }
  }
}

// One block per assignment (token i, choice a): its rows of dys and its dtopk_w.
__global__ void combine_backward_kernel(float* dys, float* dtopk_w, const float* dout,
                                        const float* ys, const float* topk_w,
                                        const int32_t* assignment_slot, int64_t k, int64_t c) {
  __shared__ float shared[kThreads];
  const int64_t assignment = blockIdx.x, i = assignment / k;
  const int64_t slot = assignment_slot[assignment];
  const float w = topk_w[assignment];
  float dot = 0;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) {
    const float dy = dout[i * c + j];
    dys[slot * c + j] = w * dy;
    dot += dy * ys[slot * c + j];
  }
  dot = block_sum<kThreads>(dot, shared);
  if (threadIdx.x == 0) dtopk_w[assignment] = dot;
}

template <int W>
__global__ void gather_backward_kernel(float* dx, const float* dxs, const int32_t* assignment_slot,
                                       int64_t n, int64_t k, int64_t c) {
  FOUNDRY_FOR_EACH_ROW(i, n) {
    FOUNDRY_FOR_EACH_COL(q, c / W) {
      const int64_t j = q * W;
      Lanes<W> acc = load_lanes<W>(dx + i * c + j);
      for (int64_t a = 0; a < k; ++a) {
        const Lanes<W> y = load_lanes<W>(dxs + assignment_slot[i * k + a] * c + j);
        for (int l = 0; l < W; ++l) acc.v[l] += y.v[l];
      }
      store_lanes<W>(dx + i * c + j, acc);
    }
  }
}

// ---- cross-entropy ----

// One block per row. Out = float: dlogits [N, Vp] at row stride vp. Out = uint16_t: bf16
// dlogits at row stride ld, written over the logits in place (ld = 2·vp) tile by tile: a tile's
// values are all read before any is written, and its bf16 writes reach only floats of earlier
// tiles or its own, so nothing is overwritten before it is read.
template <typename Out>
__global__ void cross_entropy_kernel(Out* dlogits, int64_t ld, float* losses, const float* logits,
                                     const int32_t* targets, int64_t v, int64_t vp,
                                     float grad_scale) {
  __shared__ float shared[kThreads];
  const int64_t i = blockIdx.x;
  const float* z = logits + i * vp;
  const int32_t target = targets[i];
  const float target_logit = z[target];
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < v; j += kThreads) m = fmaxf(m, z[j]);
  const float max_z = block_max<kThreads>(m, shared);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < v; j += kThreads) sum += expf(z[j] - max_z);
  sum = block_sum<kThreads>(sum, shared);  // every read of z but the gradient's is done
  if (threadIdx.x == 0)
    losses[i] = static_cast<float>(static_cast<double>(max_z) + log(static_cast<double>(sum)) -
                                   static_cast<double>(target_logit));
  if (!dlogits) return;
  Out* d = dlogits + i * ld;
  const float scale = grad_scale / sum;
  for (int64_t j0 = 0; j0 < vp; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    float g = 0.0f;
    if (j < v) g = expf(z[j] - max_z) * scale - (j == target ? grad_scale : 0.0f);
    if constexpr (sizeof(Out) == 2) {
      __syncthreads();  // the whole tile is read before any of it is overwritten
      if (j < vp) d[j] = to_bf16(g);
    } else {
      if (j < vp) d[j] = g;
    }
  }
}

__global__ void mean_kernel(double* mean, const float* losses, int64_t n) {
  __shared__ double shared[kThreads];
  double sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) sum += static_cast<double>(losses[i]);
  sum = block_sum<kThreads>(sum, shared);
  if (threadIdx.x == 0) *mean = n > 0 ? sum / static_cast<double>(n) : 0.0;
}

// swiglu's four entry points: out or out16 (bf16, 8-byte aligned for its 4-lane stores).
void launch_swiglu_forward(float* out, uint16_t* out16, const float* h, int64_t n, int64_t f) {
  launch_rows(lanes_for(f, {out, h}) == 4 && aligned(out16, 8), n, f, swiglu_forward_kernel<4>,
              swiglu_forward_kernel<1>, out, out16, h, n, f);
}

void launch_swiglu_backward(float* dh, uint16_t* dh16, const float* dout, const float* h, int64_t n,
                            int64_t f) {
  launch_rows(lanes_for(f, {dh, dout, h}) == 4 && aligned(dh16, 8), n, f, swiglu_backward_kernel<4>,
              swiglu_backward_kernel<1>, dh, dh16, dout, h, n, f);
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t n,
                     int64_t c, float eps) {
  if (n == 0) return;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(n), kThreads>>>(out, rstd, in, weight, c, eps);
  check_launch();
}

int64_t rmsnorm_backward_scratch(int64_t n, int64_t c) {
  return ((n + kRowsPerChunk - 1) / kRowsPerChunk) * c;
}

void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in,
                      const float* weight, const float* rstd, int64_t n, int64_t c,
                      float* scratch) {
  rmsnorm_backward_residual(din, dweight, dout, in, weight, rstd, nullptr, nullptr, n, c,
                            scratch);
}

void rmsnorm_backward_residual(float* din, float* dweight, const float* dout, const float* in,
                               const float* weight, const float* rstd, const float* residual,
                               const float* residual_scale, int64_t n, int64_t c,
                               float* scratch) {
  if (n == 0) return;
  const int64_t chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
  rmsnorm_backward_kernel<<<static_cast<unsigned>(chunks), kThreads>>>(
      din, scratch, dout, in, weight, rstd, residual, residual_scale, n, c);
  check_launch();
  sum_chunks_kernel<<<blocks_for(c), kThreads>>>(dweight, scratch, chunks, c);
  check_launch();
}

void rope_apply(float* x, int64_t b, int64_t t, int64_t h, int64_t d, int64_t rotary_dim,
                int64_t pos_offset, double theta, bool inverse) {
  const int64_t half = rotary_dim / 2;
  if (half == 0 || b * t * h == 0) return;
  rope_kernel<<<blocks_for(b * t * half), kThreads>>>(x, b * t, t, h, d, half, pos_offset,
                                                    nullptr, theta, inverse ? -1.0f : 1.0f);
  check_launch();
}

void rope_apply_rows(float* x, const int64_t* pos, int64_t rows, int64_t h, int64_t d,
                     int64_t rotary_dim, double theta) {
  const int64_t half = rotary_dim / 2;
  if (half == 0 || rows * h == 0) return;
  rope_kernel<<<blocks_for(rows * half), kThreads>>>(x, rows, 1, h, d, half, 0, pos, theta, 1.0f);
  check_launch();
}

void swiglu_forward(float* out, const float* h, int64_t n, int64_t f) {
  launch_swiglu_forward(out, nullptr, h, n, f);
}

void swiglu_backward(float* dh, const float* dout, const float* h, int64_t n, int64_t f) {
  launch_swiglu_backward(dh, nullptr, dout, h, n, f);
}

void swiglu_forward_bf16(uint16_t* out, const float* h, int64_t n, int64_t f) {
  launch_swiglu_forward(nullptr, out, h, n, f);
}

void swiglu_backward_bf16(uint16_t* dh, const float* dout, const float* h, int64_t n, int64_t f) {
  launch_swiglu_backward(nullptr, dh, dout, h, n, f);
}

void router_forward(float* probs, int32_t* topk_idx, float* topk_w, const float* logits,
                    int64_t n, int64_t e, int64_t k, bool renormalize) {
  router_forward_kernel<<<blocks_for(n), kThreads>>>(probs, topk_idx, topk_w, logits, n, e, k,
                                                   renormalize);
  check_launch();
}

void moe_gather(float* xs, const float* x, const int32_t* slot_token, int64_t rows, int64_t c) {
  launch_rows(lanes_for(c, {xs, x}) == 4, rows, c, gather_kernel<4>, gather_kernel<1>, xs, x,
              slot_token, rows, c);
}

void moe_combine(float* out, const float* ys, const float* topk_w, const int32_t* assignment_slot,
                 int64_t n, int64_t k, int64_t c) {
  launch_rows(lanes_for(c, {out, ys}) == 4, n, c, combine_kernel<4>, combine_kernel<1>, out, ys,
              topk_w, assignment_slot, n, k, c);
}

void moe_combine_backward(float* dys, float* dtopk_w, const float* dout, const float* ys,
                          const float* topk_w, const int32_t* assignment_slot, int64_t n, int64_t k,
                          int64_t c) {
  if (n * k == 0) return;
  combine_backward_kernel<<<static_cast<unsigned>(n * k), kThreads>>>(
      dys, dtopk_w, dout, ys, topk_w, assignment_slot, k, c);
  check_launch();
}

void moe_gather_backward(float* dx, const float* dxs, const int32_t* assignment_slot, int64_t n,
                         int64_t k, int64_t c) {
  launch_rows(lanes_for(c, {dx, dxs}) == 4, n, c, gather_backward_kernel<4>,
              gather_backward_kernel<1>, dx, dxs, assignment_slot, n, k, c);
}

void cross_entropy(float* dlogits, float* losses, double* mean_loss, const float* logits,
                   const int32_t* targets, int64_t n, int64_t v, int64_t vp, float grad_scale) {
  if (n > 0) {
    cross_entropy_kernel<float><<<static_cast<unsigned>(n), kThreads>>>(
        dlogits, vp, losses, logits, targets, v, vp, grad_scale);
    check_launch();
  }
  mean_kernel<<<1, kThreads>>>(mean_loss, losses, n);
  check_launch();
}

void cross_entropy_bf16(uint16_t* dlogits, int64_t ld, float* losses, double* mean_loss,
                        const float* logits, const int32_t* targets, int64_t n, int64_t v,
                        int64_t vp, float grad_scale) {
  if (n > 0) {
    cross_entropy_kernel<uint16_t><<<static_cast<unsigned>(n), kThreads>>>(
        dlogits, ld, losses, logits, targets, v, vp, grad_scale);
    check_launch();
  }
  mean_kernel<<<1, kThreads>>>(mean_loss, losses, n);
  check_launch();
}

}  // namespace foundry::gpu::ops
