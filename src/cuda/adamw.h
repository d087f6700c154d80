// AdamW over every parameter of a slab in one launch: the update of optim/adamw.h's
// adamw_chunk (decoupled weight decay, bias corrections folded into the coefficients),
// element by element in the same order of operations, without fused multiply-adds, on
// device memory.
#pragma once
#include <cstdint>

namespace foundry::gpu {

// The step's coefficients (optim's adamw_scalars computes them on the host).
struct AdamWCoefficients {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float step_size;         // lr / (1 - beta1^t)
  float sqrt_correction2;  // sqrt(1 - beta2^t)
  float eps;
  float decay_factor;      // 1 - lr * weight_decay
};

// A contiguous range of the slab and whether it decays. The array lives in device memory.
struct AdamWRange {
  int64_t offset, size;
  int32_t decay;
};

// For each range: g' = g·grad_scale; m = β1·m + (1−β1)·g'; v = β2·v + (1−β2)·g'²;
// p = p·keep − step_size·m / (√v / √(1−β2^t) + eps), keep = decay_factor where the range
// decays; and p16 (when not null, bf16 bits) = p rounded to nearest even.
void adamw_update(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                  uint16_t* params_bf16, const AdamWRange* ranges, int64_t range_count,
                  const AdamWCoefficients& c, float grad_scale);

}  // namespace foundry::gpu
