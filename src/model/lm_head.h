// The LM head and loss of both architectures (internal to model/):
//   n = rms(x) [N, C];  logits = n·Eᵀ [N, Vp] through the tied embedding E [Vp, C];
//   loss = mean cross-entropy over the real vocabulary (padded ids get no mass).
#pragma once
#include <cstdint>

#include "base/arena.h"
#include "model/compute.h"
#include "model/params.h"

namespace foundry {

struct LmHeadWeights {
  int64_t norm, embed;  // slab offsets of the final norm's weight and the embedding
  static LmHeadWeights of(const ParamTable& table);
};

struct LmHeadActs {
  float* n;       // [N, C]   rms(x)
  float* rstd;    // [N]
  float* logits;  // [N, Vp]  the logits; d loss/d logits after a forward with targets
  float* losses;  // [N]      per-token cross-entropy
  double* mean_loss;  // their mean
  void take(Arena& arena, const ModelConfig& c, BatchShape s);
};

// Fails (Error) naming the first of targets [n] (host memory) outside [0, vocab_size).
void check_targets(const int32_t* targets, int64_t n, int64_t vocab_size);

// x [N, C]: the residual stream after the last layer. With targets [N] (backend memory,
// checked with check_targets before they were copied there) returns the mean cross-entropy,
// and the logits become their gradient in the GEMM precision: floats in fp32; in bf16, each
// row's bf16 values at the start of its own float row (row stride 2·Vp bf16 values). Without
// targets, returns 0 and keeps the logits.
double lm_head_forward(Compute& cx, const LmHeadWeights& w, LmHeadActs& a, const float* x,
                       const int32_t* targets, int64_t N);
// dx [N, C] (written) = d loss/d x; accumulates the embedding's and the final norm's
// gradients. dn [N, C] is scratch.
void lm_head_backward(Compute& cx, const LmHeadWeights& w, const LmHeadActs& a, const float* x,
                      float* dx, float* dn, int64_t N);
// Decoding B tokens: x [B, C] → logits [B, Vp] (the padded entries hold the zero rows'
// products: the caller masks them); n [B, C] and rstd [B] are scratch.
void lm_head_decode(Compute& cx, const LmHeadWeights& w, const float* x, int64_t batch,
                    float* n, float* rstd, float* logits);

}  // namespace foundry
