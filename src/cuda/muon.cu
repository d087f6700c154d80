#include "cuda/muon.h"

#include <cuda_runtime.h>

#include "cuda/device_math.cuh"
#include "cuda/launch.cuh"

namespace foundry::gpu {
namespace {

__global__ void momentum_kernel(float* u, float* buf, const float* g, int64_t n, float mu,
                                bool nesterov, float grad_scale) {
  FOUNDRY_FOR_EACH(i, n) {
    const float gi = grad_scale == 1.0f ? g[i] : __fmul_rn(g[i], grad_scale);
    const float b = __fadd_rn(__fmul_rn(mu, buf[i]), gi);
    buf[i] = b;
    u[i] = nesterov ? __fadd_rn(gi, __fmul_rn(mu, b)) : b;
  }
}

__global__ void apply_kernel(float* w, const float* o, int64_t n, float keep, float step_size,
                             uint16_t* w16) {
  FOUNDRY_FOR_EACH(i, n) {
    const float v = __fsub_rn(__fmul_rn(w[i], keep), __fmul_rn(step_size, o[i]));
    w[i] = v;
    if (w16) w16[i] = to_bf16(v);
  }
}

}  // namespace

void muon_momentum(float* u, float* buf, const float* g, int64_t n, float mu, bool nesterov,
                   float grad_scale) {
  if (n == 0) return;
  momentum_kernel<<<blocks_for(n), kBlockThreads>>>(u, buf, g, n, mu, nesterov, grad_scale);
  check_launch();
}

void muon_apply(float* w, const float* o, int64_t n, float keep, float step_size, uint16_t* w16) {
  if (n == 0) return;
  apply_kernel<<<blocks_for(n), kBlockThreads>>>(w, o, n, keep, step_size, w16);
  check_launch();
}

}  // namespace foundry::gpu
