// Muon's elementwise steps on the GPU (optim/muon.h's Muon::step, element by element in the
// same order of operations, without fused multiply-adds), around gpu::ops::newton_schulz.
#pragma once
#include <cstdint>

namespace foundry::gpu {

// g' = g·grad_scale (rounded, as a clipped slab would be); buf = mu·buf + g';
// u = nesterov ? g' + mu·buf : buf. n elements.
void muon_momentum(float* u, float* buf, const float* g, int64_t n, float mu, bool nesterov,
                   float grad_scale);
// w = w·keep − step_size·o; w16 (bf16 bits, when not null) = w rounded to nearest even.
void muon_apply(float* w, const float* o, int64_t n, float keep, float step_size, uint16_t* w16);

}  // namespace foundry::gpu
