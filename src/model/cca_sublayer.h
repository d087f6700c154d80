// ZAYA1's attention sublayer (internal to model/): compressed convolutional attention
// (kernels/cca.h has the recipe), pre-norm; the residual merge is the caller's (residual
// scaling). With Cc = (Hq + Hk)·d packed channels and G = Hq + Hk heads:
//   n = rms(x) [N, C];  c = n·Wqkᵀ [N, Cc] = [q0 ‖ k0];  v = n·Wvᵀ [N, Hk·d] (two halves)
//   y = depthwise_conv(c);  qk = grouped_conv(y) + means(c) [N, Cc]
//   q, k = qk_norm(qk)·temp;  v = value_shift(v)   (the second half from the previous token)
//   q, k = rope(q), rope(k);  h = causal_attention(q, k, v)·Woᵀ [N, C]
#pragma once
#include <cstdint>

#include "base/arena.h"
#include "kernels/cca.h"
#include "model/attention_sublayer.h"
#include "model/compute.h"
#include "model/params.h"

namespace foundry {

// The CCA kernels' shape of a config's attention sublayers.
ops::CcaDims cca_dims(const ModelConfig& c);

struct CcaWeights {
  int64_t norm, wqk, wv, w0, b0, w1, b1, temp, wo;  // slab offsets (wqk: q_proj then k_proj)
  static CcaWeights of_layer(const ParamTable& table, int64_t layer);
};

// One layer's activations, kept for the backward.
struct CcaActs {
  float* n;      // [N, C]       rms(x)
  float* rstd;   // [N]
  float* c;      // [N, Cc]      [q0 ‖ k0], the convolutions' input
  // [N, Cc] floats of room: what the convolutions keep for the backward without context
  // parallelism (Backend::cca_convs_forward): the depthwise output y, or on the CPU in bf16
  // the grouped convolution's stacked rows in its place.
  float* y = nullptr;
  float* qk;     // [N, Cc]      before the QK norm
  float* rnorm;  // [N, G]       per-head 1/norms
  float* q;      // [N, Hq·d]    after RoPE
  float* k;      // [N, Hk·d]    after RoPE
  float* v;      // [N, Hk·d]    after the value shift
  float* lse;    // [B, Hq, T]   each row's softmax log-sum-exp
  float* att;    // [N, Hq·d]
  KvAll kv;      // context parallel: the whole sequences' k and v
  // Context parallel: each chunk's c and y with the R = (t0−1) + (t1−1) rows before it
  // (the previous chunk's last c rows, and y recomputed from them), [B, 2, R + Tc, Cc];
  // y is then not allocated.
  float* c_ext = nullptr;
  float* y_ext = nullptr;
  void take(Arena& arena, const ModelConfig& c, BatchShape s);
};

// Scratch beyond AttentionGrads, shared by every layer.
struct CcaGrads {
  float *dc, *dqk;        // [N, Cc] each
  float* dy = nullptr;    // [N, Cc], without context parallelism
  // Context parallel: [B, 2, R + Tc, Cc] ×2 (the grouped convolution's output forward, the
  // gradients of the extended rows backward), and boundary rows [B, 2, max(R·Cc, half)] ×2.
  float *ext_a = nullptr, *ext_b = nullptr, *tails = nullptr, *halos = nullptr;
  void take(Arena& arena, const ModelConfig& c, BatchShape s);
};

// x [N, C] → h [N, C] (g: scratch).
void cca_forward(Compute& cx, const CcaWeights& w, CcaActs& a, CcaGrads& g, BatchShape s,
                 const float* x, float* h);
// From dh [N, C] = d loss/d h in the GEMM precision (float, or bf16 in bf16): d loss/d x
// through the norm into dx (InputGradient); accumulates the sublayer's weight gradients.
void cca_backward(Compute& cx, const CcaWeights& w, const CcaActs& a, AttentionGrads& ga,
                  CcaGrads& g, BatchShape s, const float* x, const void* dh,
                  const InputGradient& dx);

// One new token of each of the rows, each at its position, row r's CCA state at states[r]
// (in the backend's memory; DecodeRows): x [n, C] → h [n, C]. Stores the tokens' k and v at
// their positions, attends over each row's positions up to its own, and advances the
// convolution and value-shift states.
struct CcaDecodeScratch {
  // [B, C], [B], [B, Cc] ×2, [B, G], [B, Hq·d] ×2, [B·Hq·max_len], [B, Hk·d] ×2
  float *n, *rstd, *c, *qk, *rnorm, *q, *att, *scores, *k, *v;
};
void cca_decode(Compute& cx, const CcaWeights& w, float* const* states, const float* x,
                const DecodeRows& rows, int64_t layer, const CcaDecodeScratch& scratch,
                int64_t max_len, float* h);

}  // namespace foundry
