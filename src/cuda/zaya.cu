#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/launch.cuh"
#include "cuda/zaya.h"

namespace foundry::gpu::ops {

namespace {

constexpr int kThreads = kBlockThreads;
constexpr int64_t kRowsPerChunk = 32;

__host__ __device__ int64_t chunks_of(int64_t n) { return (n + kRowsPerChunk - 1) / kRowsPerChunk; }

// The kernels over [rows, cols] below go by rows and columns (launch.cuh's rows_launch), not by
// a flat index that needs a 64-bit division and remainder per element.
// partials [chunks, cols]: Σ over the chunk's rows of value(row, col).
template <typename Value>
__global__ void column_partials_kernel(float* partials, int64_t n, int64_t cols, Value value) {
  FOUNDRY_FOR_EACH_ROW(chunk, chunks_of(n)) {
    const int64_t end = min(n, (chunk + 1) * kRowsPerChunk);
    FOUNDRY_FOR_EACH_COL(col, cols) {
      float acc = 0;
      for (int64_t row = chunk * kRowsPerChunk; row < end; ++row) acc += value(row, col);
      partials[chunk * cols + col] = acc;
    }
  }
}

// total[col] = Σ over chunks in order; then apply(col, total).
template <typename Apply>
__global__ void column_totals_kernel(const float* partials, int64_t chunks, int64_t cols,
                                     Apply apply) {
  FOUNDRY_FOR_EACH(col, cols) {
    float total = 0;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) total += partials[chunk * cols + col];
    apply(col, total);
  }
}

template <typename Value, typename Apply>
void column_sums(float* scratch, int64_t n, int64_t cols, Value value, Apply apply) {
  if (n == 0 || cols == 0) return;
  const RowsLaunch l = rows_launch(chunks_of(n), cols);
  column_partials_kernel<<<l.grid, l.block>>>(scratch, n, cols, value);
  check_launch();
  column_totals_kernel<<<blocks_for(cols), kThreads>>>(scratch, chunks_of(n), cols, apply);
  check_launch();
}

struct RowValue {  // x[row, col]
  const float* x;
  int64_t cols;
  __device__ float operator()(int64_t row, int64_t col) const { return x[row * cols + col]; }
};
struct ProductValue {  // a[row, col] · b[row, col]
  const float *a, *b;
  int64_t cols;
  __device__ float operator()(int64_t row, int64_t col) const {
    return a[row * cols + col] * b[row * cols + col];
  }
};
struct AddTo {  // out[col] += total
  float* out;
  __device__ void operator()(int64_t col, float total) const { out[col] += total; }
};

// The three column sums of residual_scale_backward: [Σ g | Σ (res + β_res)·g | Σ (h + β_h)·g].
struct ResidualValue {
  const float *dout, *res, *h, *beta_res, *beta_h;
  int64_t c;
  __device__ float operator()(int64_t row, int64_t col) const {
    const int64_t part = col / c, j = col % c;
    const float g = dout[row * c + j];
    if (part == 0) return g;
    if (part == 1) return (res[row * c + j] + beta_res[j]) * g;
    return (h[row * c + j] + beta_h[j]) * g;
  }
};
struct ResidualApply {
  float *dalpha_res, *dbeta_res, *dalpha_h, *dbeta_h;
  const float *alpha_res, *alpha_h;
  int64_t c;
  __device__ void operator()(int64_t col, float total) const {
    const int64_t part = col / c, j = col % c;
    if (part == 0) {
      dbeta_res[j] += alpha_res[j] * total;
      dbeta_h[j] += alpha_h[j] * total;
    } else if (part == 1) {
      dalpha_res[j] += total;
    } else {
      dalpha_h[j] += total;
    }
  }
};

// Rows i of y [n, m] by rows_launch, W columns j a thread at a time (W = 4 where lanes_for
// allows; the same for the kernels over [n, r_dim] and [n, c] below).
template <int W>
__global__ void bias_add_kernel(float* y, const float* bias, int64_t n, int64_t m) {
  FOUNDRY_FOR_EACH_ROW(i, n) {
    FOUNDRY_FOR_EACH_COL(q, m / W) {
      const int64_t j = q * W;
      Lanes<W> v = load_lanes<W>(y + i * m + j);
      const Lanes<W> b = load_lanes<W>(bias + j);
      for (int l = 0; l < W; ++l) v.v[l] += b.v[l];
      store_lanes<W>(y + i * m + j, v);
    }
  }
}

// Φ(x) through erfc, accurate in both tails (1 + erf(x/√2) cancels to nothing below x ≈ −5).
__device__ float normal_cdf(float x) { return 0.5f * erfcf(x * -0.70710678118654752f); }

__global__ void gelu_forward_kernel(float* out, const float* in, int64_t count) {
  FOUNDRY_FOR_EACH(i, count) {
    const float x = in[i];
    out[i] = x * normal_cdf(x);
  }
}

__global__ void gelu_backward_kernel(float* din, const float* dout, const float* in, int64_t count) {
  FOUNDRY_FOR_EACH(i, count) {
    const float x = in[i];
    const float pdf = expf(-0.5f * x * x) * 0.39894228040143268f;
    din[i] = dout[i] * (normal_cdf(x) + x * pdf);
  }
}

// r += γ·r_prev as one FMA, as nvcc compiled it a thread per element.
template <int W>
__global__ void eda_forward_kernel(float* r, const float* r_prev, const float* gamma, int64_t n,
                                   int64_t r_dim) {
  FOUNDRY_FOR_EACH_ROW(i, n) {
    FOUNDRY_FOR_EACH_COL(q, r_dim / W) {
      const int64_t j = q * W;
      Lanes<W> v = load_lanes<W>(r + i * r_dim + j);
      const Lanes<W> p = load_lanes<W>(r_prev + i * r_dim + j), g = load_lanes<W>(gamma + j);
      for (int l = 0; l < W; ++l) v.v[l] = __fmaf_rn(g.v[l], p.v[l], v.v[l]);
      store_lanes<W>(r + i * r_dim + j, v);
    }
  }
}

__global__ void gating_forward_kernel(float* probs, int32_t* choice, float* gate,
                                      const float* logits, const float* bias, bool on_logits,
                                      int64_t n, int64_t e, int64_t k, bool skip_class,
                                      bool skip_passes_input) {
  const int64_t classes = e + (skip_class ? 1 : 0);
  FOUNDRY_FOR_EACH(i, n) {
    const float* z = logits + i * classes;
    float* p = probs + i * classes;
    softmax_row(p, z, classes);
    const float* scores = on_logits ? z : p;
    int32_t* idx = choice + i * k;
    float* w = gate + i * k;
    for (int64_t slot = 0; slot < k; ++slot) {
      int64_t best = -1;
      float best_score = 0;
      for (int64_t j = 0; j < classes; ++j) {
        bool taken = false;
        for (int64_t s = 0; s < slot; ++s) taken |= idx[s] == j;
        if (taken) continue;
        const float score = bias ? scores[j] + bias[j] : scores[j];
        if (best < 0 || score > best_score) best = j, best_score = score;
      }
      idx[slot] = static_cast<int32_t>(best);
      w[slot] = (skip_class && best == e && !skip_passes_input) ? 0.0f : p[best];
    }
  }
}

__global__ void gating_backward_kernel(float* dlogits, const float* dgate, const float* probs,
                                       const int32_t* choice, int64_t n, int64_t e, int64_t k,
                                       bool skip_class, bool skip_passes_input) {
  const int64_t classes = e + (skip_class ? 1 : 0);
  FOUNDRY_FOR_EACH(i, n) {
    const float* p = probs + i * classes;
    const int32_t* idx = choice + i * k;
    const float* dg = dgate + i * k;
    float* dz = dlogits + i * classes;
    float dot = 0;
    for (int64_t slot = 0; slot < k; ++slot) {
      if (skip_class && idx[slot] == e && !skip_passes_input) continue;
      dot += dg[slot] * p[idx[slot]];
    }
    for (int64_t j = 0; j < classes; ++j) dz[j] = -p[j] * dot;
    for (int64_t slot = 0; slot < k; ++slot) {
      if (skip_class && idx[slot] == e && !skip_passes_input) continue;
      dz[idx[slot]] += p[idx[slot]] * dg[slot];
    }
  }
}

// Counts are integers, whose sum is the same in any order: each block counts its share in
// shared memory, then adds its totals to the output with one atomic per class. (One thread per
// class over every token took 16 ms a sublayer at 16K tokens: serial loads.)
using Count = unsigned long long;

__device__ void start_counts(Count* local, int64_t classes) {
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) local[c] = 0;
  __syncthreads();
}

__device__ void finish_counts(int64_t* out, const Count* local, int64_t classes) {
  __syncthreads();
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
    if (local[c] != 0) atomicAdd(reinterpret_cast<Count*>(out) + c, local[c]);
}

__global__ void class_counts_kernel(int64_t* counts, const int32_t* choice, int64_t assignments,
                                    int64_t classes) {
  extern __shared__ Count local[];
  start_counts(local, classes);
  FOUNDRY_FOR_EACH(a, assignments) {
    const int32_t c = choice[a];
    if (c >= 0 && c < classes) atomicAdd(&local[c], Count{1});  // as the CPU: others uncounted
  }
  finish_counts(counts, local, classes);
}

// near[s] = the tokens whose score for class s is within `window` of the boundary between
// chosen and unchosen (ops::zaya_boundary_counts): one thread per token, the same double
// arithmetic per (token, class) as the CPU.
__global__ void boundary_counts_kernel(int64_t* near, const float* probs, const float* logits,
                                       const float* bias, bool on_logits, const int32_t* choice,
                                       int64_t n, int64_t classes, int64_t k, double window) {
  extern __shared__ Count local[];
  start_counts(local, classes);
  FOUNDRY_FOR_EACH(i, n) {
    const float* z = (on_logits ? logits : probs) + i * classes;
    const int32_t* idx = choice + i * k;
    const auto chosen = [&](int64_t j) {
      bool c = false;
      for (int64_t a = 0; a < k; ++a) c |= idx[a] == j;
      return c;
    };
    const auto score = [&](int64_t j) {
      return static_cast<double>(z[j]) + (bias ? bias[j] : 0.0f);
    };
    double lowest_chosen = INFINITY, best_unchosen = -INFINITY;
    for (int64_t j = 0; j < classes; ++j) {
      if (chosen(j)) lowest_chosen = fmin(lowest_chosen, score(j));
      else best_unchosen = fmax(best_unchosen, score(j));
    }
    for (int64_t s = 0; s < classes; ++s) {
      const double gap = chosen(s) ? score(s) - best_unchosen : lowest_chosen - score(s);
      if (gap < window) atomicAdd(&local[s], Count{1});
    }
  }
  finish_counts(near, local, classes);
}

// out = (res + β_res)·α_res + (h + β_h)·α_h rounded as nvcc compiled it a thread per element:
// the second product rounded, the first fused with the sum.
template <int W>
__global__ void residual_forward_kernel(float* out, const float* res, const float* h,
                                        const float* alpha_res, const float* beta_res,
                                        const float* alpha_h, const float* beta_h, int64_t n,
                                        int64_t c) {
  FOUNDRY_FOR_EACH_ROW(i, n) {
    FOUNDRY_FOR_EACH_COL(q, c / W) {
      const int64_t j = q * W;
      const Lanes<W> r = load_lanes<W>(res + i * c + j), x = load_lanes<W>(h + i * c + j),
                     ar = load_lanes<W>(alpha_res + j), br = load_lanes<W>(beta_res + j),
                     ah = load_lanes<W>(alpha_h + j), bh = load_lanes<W>(beta_h + j);
      Lanes<W> y;
      for (int l = 0; l < W; ++l)
        y.v[l] = __fmaf_rn(r.v[l] + br.v[l], ar.v[l], __fmul_rn(x.v[l] + bh.v[l], ah.v[l]));
      store_lanes<W>(out + i * c + j, y);
    }
  }
}

template <int W>
__global__ void residual_input_grads_kernel(float* dres, float* dh, const float* dout,
                                            const float* alpha_res, const float* alpha_h,
                                            int64_t n, int64_t c) {
  FOUNDRY_FOR_EACH_ROW(i, n) {
    FOUNDRY_FOR_EACH_COL(q, c / W) {
      const int64_t j = q * W;
      const Lanes<W> g = load_lanes<W>(dout + i * c + j), ar = load_lanes<W>(alpha_res + j),
                     ah = load_lanes<W>(alpha_h + j);
      Lanes<W> a, b;
      for (int l = 0; l < W; ++l) {
        a.v[l] = ar.v[l] * g.v[l];
        b.v[l] = ah.v[l] * g.v[l];
      }
      store_lanes<W>(dres + i * c + j, a);
      store_lanes<W>(dh + i * c + j, b);
    }
  }
}

// out[i, j] = scale[j] · x[i, j], as float or bf16 (store_lanes rounds by to_bf16): the
// residual scaling's dh = α_h ⊙ dout alone, and EDA's input gradient γ ⊙ dr.
template <int W, typename Out>
__global__ void scale_columns_kernel(Out* out, const float* x, const float* scale, int64_t n,
                                     int64_t c) {
  FOUNDRY_FOR_EACH_ROW(i, n) {
    FOUNDRY_FOR_EACH_COL(q, c / W) {
      const int64_t j = q * W;
      const Lanes<W> g = load_lanes<W>(x + i * c + j), a = load_lanes<W>(scale + j);
      Lanes<W> v;
      for (int l = 0; l < W; ++l) v.v[l] = a.v[l] * g.v[l];
      store_lanes<W>(out + i * c + j, v);
    }
  }
}

// scale_columns_kernel's launch: W = 4 where c and the pointers allow (out 16-byte aligned as
// float, 8 as bf16).
template <typename Out>
void launch_scale_columns(Out* out, const float* x, const float* scale, int64_t n, int64_t c) {
  launch_rows(lanes_for(c, {x, scale}) == 4 && aligned(out, 4 * sizeof(Out)), n, c,
              scale_columns_kernel<4, Out>, scale_columns_kernel<1, Out>, out, x, scale, n, c);
}

}  // namespace

int64_t column_sum_scratch(int64_t n, int64_t columns) { return chunks_of(n) * columns; }

void bias_add_forward(float* y, const float* bias, int64_t n, int64_t m) {
  launch_rows(lanes_for(m, {y, bias}) == 4, n, m, bias_add_kernel<4>, bias_add_kernel<1>, y, bias,
              n, m);
}

void bias_add_backward(float* dbias, const float* dy, int64_t n, int64_t m, float* scratch) {
  column_sums(scratch, n, m, RowValue{dy, m}, AddTo{dbias});
}

void gelu_forward(float* out, const float* in, int64_t n, int64_t c) {
  gelu_forward_kernel<<<blocks_for(n * c), kThreads>>>(out, in, n * c);
  check_launch();
}

void gelu_backward(float* din, const float* dout, const float* in, int64_t n, int64_t c) {
  gelu_backward_kernel<<<blocks_for(n * c), kThreads>>>(din, dout, in, n * c);
  check_launch();
}

void eda_forward(float* r, const float* r_prev, const float* gamma, int64_t n, int64_t r_dim) {
  launch_rows(lanes_for(r_dim, {r, r_prev, gamma}) == 4, n, r_dim, eda_forward_kernel<4>,
              eda_forward_kernel<1>, r, r_prev, gamma, n, r_dim);
}

void eda_backward(float* dr_prev, float* dgamma, const float* dr, const float* r_prev,
                  const float* gamma, int64_t n, int64_t r_dim, float* scratch) {
  launch_scale_columns(dr_prev, dr, gamma, n, r_dim);
  column_sums(scratch, n, r_dim, ProductValue{r_prev, dr, r_dim}, AddTo{dgamma});
}

void zaya_gating_forward(float* probs, int32_t* choice, float* gate, const float* logits,
                         const float* balance_bias, bool bias_on_logits, int64_t n, int64_t e,
                         int64_t k, bool skip_class, bool skip_passes_input) {
  FOUNDRY_GPU_CHECK(e >= 1 && k >= 1 && k <= e + (skip_class ? 1 : 0));
  FOUNDRY_GPU_CHECK(skip_class || !skip_passes_input);
  gating_forward_kernel<<<blocks_for(n), kThreads>>>(probs, choice, gate, logits, balance_bias,
                                                     bias_on_logits, n, e, k, skip_class,
                                                     skip_passes_input);
  check_launch();
}

void zaya_gating_backward(float* dlogits, const float* dgate, const float* probs,
                          const int32_t* choice, int64_t n, int64_t e, int64_t k,
                          bool skip_class, bool skip_passes_input) {
  gating_backward_kernel<<<blocks_for(n), kThreads>>>(dlogits, dgate, probs, choice, n, e, k,
                                                      skip_class, skip_passes_input);
  check_launch();
}

// Blocks for counting `items`: enough to fill the GPU, few enough that the per-block atomics
// on the totals stay negligible.
int count_blocks(int64_t items) { return std::min(blocks_for(items), 1024); }

void zaya_class_counts(int64_t* counts, const int32_t* choice, int64_t n, int64_t k,
                       int64_t classes) {
  FOUNDRY_CUDA_CHECK(cudaMemsetAsync(counts, 0, classes * sizeof(int64_t)));
  class_counts_kernel<<<count_blocks(n * k), kThreads, classes * sizeof(Count)>>>(counts, choice,
                                                                                  n * k, classes);
  check_launch();
}

void zaya_boundary_counts(int64_t* near, const float* probs, const float* logits,
                          const float* balance_bias, bool bias_on_logits, const int32_t* choice,
                          int64_t n, int64_t classes, int64_t k, double window) {
  FOUNDRY_GPU_CHECK(classes >= 1 && k >= 1 && k <= classes && window > 0);
  FOUNDRY_CUDA_CHECK(cudaMemsetAsync(near, 0, classes * sizeof(int64_t)));
  if (k == classes) return;  // every class chosen by every token: no boundary
  boundary_counts_kernel<<<count_blocks(n), kThreads, classes * sizeof(Count)>>>(
      near, probs, logits, balance_bias, bias_on_logits, choice, n, classes, k, window);
  check_launch();
}

void residual_scale_forward(float* out, const float* res, const float* h, const float* alpha_res,
                            const float* beta_res, const float* alpha_h, const float* beta_h,
                            int64_t n, int64_t c) {
  launch_rows(lanes_for(c, {out, res, h, alpha_res, beta_res, alpha_h, beta_h}) == 4, n, c,
              residual_forward_kernel<4>, residual_forward_kernel<1>, out, res, h, alpha_res,
              beta_res, alpha_h, beta_h, n, c);
}

void residual_scale_backward(float* dres, float* dh, float* dalpha_res, float* dbeta_res,
                             float* dalpha_h, float* dbeta_h, const float* dout, const float* res,
                             const float* h, const float* alpha_res, const float* beta_res,
                             const float* alpha_h, const float* beta_h, int64_t n, int64_t c,
                             float* scratch) {
  launch_rows(lanes_for(c, {dres, dh, dout, alpha_res, alpha_h}) == 4, n, c,
              residual_input_grads_kernel<4>, residual_input_grads_kernel<1>, dres, dh, dout,
              alpha_res, alpha_h, n, c);
  column_sums(scratch, n, 3 * c, ResidualValue{dout, res, h, beta_res, beta_h, c},
              ResidualApply{dalpha_res, dbeta_res, dalpha_h, dbeta_h, alpha_res, alpha_h, c});
}

void residual_scale_backward_params(void* dh, bool dh_bf16, float* dalpha_res, float* dbeta_res,
                                    float* dalpha_h, float* dbeta_h, const float* dout,
                                    const float* res, const float* h, const float* alpha_res,
                                    const float* beta_res, const float* alpha_h,
                                    const float* beta_h, int64_t n, int64_t c, float* scratch) {
  if (dh_bf16) launch_scale_columns(static_cast<uint16_t*>(dh), dout, alpha_h, n, c);
  else launch_scale_columns(static_cast<float*>(dh), dout, alpha_h, n, c);
  column_sums(scratch, n, 3 * c, ResidualValue{dout, res, h, beta_res, beta_h, c},
              ResidualApply{dalpha_res, dbeta_res, dalpha_h, dbeta_h, alpha_res, alpha_h, c});
}

}  // namespace foundry::gpu::ops
