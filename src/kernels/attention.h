// Causal grouped-query attention core (after the q/k/v projections and RoPE).
//
//   q [B, T, H, D], k/v [B, T, KVH, D] (H a multiple of KVH; query head h uses kv head
//   h / (H/KVH)), out [B, T, H, D], probs [B, H, T, T] saved for backward (the softmax of
//   q·k^T/sqrt(D) with future positions masked; row t attends to 0..t).
// The score and value products run as batched oneDNN matmuls (bf16 inputs when dtype is
// bf16; scratch buffers are managed internally).
#pragma once
#include <cstdint>

#include "kernels/gemm.h"

namespace foundry::ops {

struct AttentionShape {
  int64_t b, t, h, kvh, d;
};

void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v,
                       const AttentionShape& s, DType dtype);
// dq, dk, dv (writes) from dout.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs,
                        const float* q, const float* k, const float* v, const AttentionShape& s,
                        DType dtype);

// One new query row per head against a cache of len positions (incremental decoding):
// q [H, D], k_cache/v_cache [len, KVH, D], out [H, D] (writes), scores [len] scratch.
void attention_decode(float* out, float* scores, const float* q, const float* k_cache,
                      const float* v_cache, int64_t len, int64_t h, int64_t kvh, int64_t d);
// Plain double-precision reference (for tests): same layout, no saved probs.
void attention_reference(double* out, const double* q, const double* k, const double* v,
                         const AttentionShape& s);

}  // namespace foundry::ops
