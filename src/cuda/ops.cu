// ops.h's kernels. Rows go to blocks of kThreads threads; a block's reductions run through
// shared memory in a fixed tree, so a result never depends on timing.
#include <cuda_runtime.h>

#include <cmath>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"

namespace foundry::gpu::ops {

namespace {

constexpr int kThreads = kBlockThreads;
constexpr int64_t kRowsPerChunk = 32;  // rmsnorm_backward's dweight chunks (as on the CPU)

// Σ over the block of `value` (every thread gets the sum); `shared` holds kThreads floats.
template <typename T>
__device__ T block_sum(T value, T* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) shared[threadIdx.x] += shared[threadIdx.x + width];
    __syncthreads();
  }
  const T sum = shared[0];
  __syncthreads();
  return sum;
}

__device__ float block_max(float value, float* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width)
      shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + width]);
    __syncthreads();
  }
  const float m = shared[0];
  __syncthreads();
  return m;
}

__device__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// ---- RMSNorm ----

__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* in,
                                       const float* weight, int64_t c, float eps) {
  __shared__ float shared[kThreads];
  const float* x = in + blockIdx.x * c;
  float* y = out + blockIdx.x * c;
  float sum_sq = 0;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) sum_sq += x[j] * x[j];
  sum_sq = block_sum(sum_sq, shared);
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
    dot = block_sum(dot, shared);
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

__global__ void rope_kernel(float* x, int64_t rows, int64_t t, int64_t h, int64_t d,
                            int64_t half, int64_t pos_offset, double theta, float sin_sign) {
  // One thread per (row of [B·T], head, pair).
  FOUNDRY_FOR_EACH(index, rows * h * half) {
    const int64_t i = index % half;
    const int64_t head = (index / half) % h;
    const int64_t row = index / (half * h);
    const double inv_freq = pow(theta, -static_cast<double>(i) / static_cast<double>(half));
    const double angle = static_cast<double>(pos_offset + row % t) * inv_freq;
    const float cs = static_cast<float>(cos(angle)), s = sin_sign * static_cast<float>(sin(angle));
    float* p = x + (row * h + head) * d;
    const float x1 = p[i], x2 = p[i + half];
    p[i] = x1 * cs - x2 * s;
    p[i + half] = x2 * cs + x1 * s;
  }
}

// ---- SwiGLU ----

__global__ void swiglu_forward_kernel(float* out, uint16_t* out16, const float* h, int64_t n,
                                      int64_t f) {
  FOUNDRY_FOR_EACH(index, n * f) {
    const int64_t i = index / f, j = index % f;
    const float g = h[i * 2 * f + j], u = h[i * 2 * f + f + j];
    const float y = g * sigmoid(g) * u;
    if (out16) out16[index] = to_bf16(y);
    else out[index] = y;
  }
}

__global__ void swiglu_backward_kernel(float* dh, uint16_t* dh16, const float* dout,
                                       const float* h, int64_t n, int64_t f) {
  FOUNDRY_FOR_EACH(index, n * f) {
    const int64_t i = index / f, j = index % f;
    const float g = h[i * 2 * f + j], u = h[i * 2 * f + f + j], dy = dout[index];
    const float s = sigmoid(g);
    const float dg = dy * u * s * (1.0f + g * (1.0f - s));
    const float du = dy * g * s;
    if (dh16) {
      dh16[i * 2 * f + j] = to_bf16(dg);
      dh16[i * 2 * f + f + j] = to_bf16(du);
    } else {
      dh[i * 2 * f + j] = dg;
      dh[i * 2 * f + f + j] = du;
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

__global__ void gather_kernel(float* xs, const float* x, const int32_t* slot_token, int64_t rows,
                              int64_t c) {
  FOUNDRY_FOR_EACH(index, rows * c) xs[index] = x[slot_token[index / c] * c + index % c];
}

__global__ void combine_kernel(float* out, const float* ys, const float* topk_w,
                               const int32_t* assignment_slot, int64_t n, int64_t k, int64_t c) {
  FOUNDRY_FOR_EACH(index, n * c) {
    const int64_t i = index / c, j = index % c;
    float acc = out[index];
    for (int64_t a = 0; a < k; ++a)
      acc += topk_w[i * k + a] * ys[assignment_slot[i * k + a] * c + j];
    out[index] = acc;
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
  dot = block_sum(dot, shared);
  if (threadIdx.x == 0) dtopk_w[assignment] = dot;
}

__global__ void gather_backward_kernel(float* dx, const float* dxs, const int32_t* assignment_slot,
                                       int64_t n, int64_t k, int64_t c) {
  FOUNDRY_FOR_EACH(index, n * c) {
    const int64_t i = index / c, j = index % c;
    float acc = dx[index];
    for (int64_t a = 0; a < k; ++a) acc += dxs[assignment_slot[i * k + a] * c + j];
    dx[index] = acc;
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
  const float max_z = block_max(m, shared);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < v; j += kThreads) sum += expf(z[j] - max_z);
  sum = block_sum(sum, shared);  // every read of z but the gradient's is done
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
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) *mean = n > 0 ? sum / static_cast<double>(n) : 0.0;
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
  rope_kernel<<<blocks_for(b * t * h * half), kThreads>>>(x, b * t, t, h, d, half, pos_offset,
                                                        theta, inverse ? -1.0f : 1.0f);
  check_launch();
}

void swiglu_forward(float* out, const float* h, int64_t n, int64_t f) {
  swiglu_forward_kernel<<<blocks_for(n * f), kThreads>>>(out, nullptr, h, n, f);
  check_launch();
}

void swiglu_backward(float* dh, const float* dout, const float* h, int64_t n, int64_t f) {
  swiglu_backward_kernel<<<blocks_for(n * f), kThreads>>>(dh, nullptr, dout, h, n, f);
  check_launch();
}

void swiglu_forward_bf16(uint16_t* out, const float* h, int64_t n, int64_t f) {
  swiglu_forward_kernel<<<blocks_for(n * f), kThreads>>>(nullptr, out, h, n, f);
  check_launch();
}

void swiglu_backward_bf16(uint16_t* dh, const float* dout, const float* h, int64_t n, int64_t f) {
  swiglu_backward_kernel<<<blocks_for(n * f), kThreads>>>(nullptr, dh, dout, h, n, f);
  check_launch();
}

void router_forward(float* probs, int32_t* topk_idx, float* topk_w, const float* logits,
                    int64_t n, int64_t e, int64_t k, bool renormalize) {
  router_forward_kernel<<<blocks_for(n), kThreads>>>(probs, topk_idx, topk_w, logits, n, e, k,
                                                   renormalize);
  check_launch();
}

void moe_gather(float* xs, const float* x, const int32_t* slot_token, int64_t rows, int64_t c) {
  gather_kernel<<<blocks_for(rows * c), kThreads>>>(xs, x, slot_token, rows, c);
  check_launch();
}

void moe_combine(float* out, const float* ys, const float* topk_w,
                 const int32_t* assignment_slot, int64_t n, int64_t k, int64_t c) {
  combine_kernel<<<blocks_for(n * c), kThreads>>>(out, ys, topk_w, assignment_slot, n, k, c);
  check_launch();
}

void moe_combine_backward(float* dys, float* dtopk_w, const float* dout, const float* ys,
                          const float* topk_w, const int32_t* assignment_slot, int64_t n,
                          int64_t k, int64_t c) {
  if (n * k == 0) return;
  combine_backward_kernel<<<static_cast<unsigned>(n * k), kThreads>>>(
      dys, dtopk_w, dout, ys, topk_w, assignment_slot, k, c);
  check_launch();
}

void moe_gather_backward(float* dx, const float* dxs, const int32_t* assignment_slot, int64_t n,
                         int64_t k, int64_t c) {
  gather_backward_kernel<<<blocks_for(n * c), kThreads>>>(dx, dxs, assignment_slot, n, k, c);
  check_launch();
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
