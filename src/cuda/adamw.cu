#include <cuda_runtime.h>

#include "cuda/adamw.h"
#include "cuda/check.h"
#include "cuda/device_math.cuh"

namespace foundry::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerRange = 64;  // blockIdx.y picks the range; these stride through it

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, uint16_t* p16,
                             const AdamWRange* ranges, AdamWCoefficients c, float grad_scale) {
  const AdamWRange r = ranges[blockIdx.y];
  const float keep = r.decay ? c.decay_factor : 1.0f;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < r.size;
       j += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = r.offset + j;
    // _rn intrinsics: no contraction into fused multiply-adds, as on the CPU.
    const float gi = __fmul_rn(g[i], grad_scale);
    const float mi = __fadd_rn(__fmul_rn(c.beta1, m[i]), __fmul_rn(c.one_minus_beta1, gi));
    const float vi =
        __fadd_rn(__fmul_rn(c.beta2, v[i]), __fmul_rn(__fmul_rn(c.one_minus_beta2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.sqrt_correction2), c.eps);
    const float pi = __fsub_rn(__fmul_rn(p[i], keep), __fmul_rn(c.step_size, __fdiv_rn(mi, denom)));
    p[i] = pi;
    if (p16) p16[i] = to_bf16(pi);
  }
}

}  // namespace

void adamw_update(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                  uint16_t* params_bf16, const AdamWRange* ranges, int64_t range_count,
                  const AdamWCoefficients& c, float grad_scale) {
  if (range_count == 0) return;
  // gridDim.y is at most 65535 ranges per launch.
  for (int64_t first = 0; first < range_count; first += 65535) {
    const int64_t count = range_count - first < 65535 ? range_count - first : 65535;
    adamw_kernel<<<dim3(kBlocksPerRange, static_cast<unsigned>(count)), kThreads>>>(
        params, grads, exp_avg, exp_avg_sq, params_bf16, ranges + first, c, grad_scale);
    FOUNDRY_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace foundry::gpu
