// The two routers of the MoE sublayer (internal to model/), each a forward/backward pair
// that fills / differentiates MoeActs::choice and ::gate from MoeActs::n [N, C].
//
// Standard (Mixtral) router, E experts, K choices:
//   logits = n·Wrᵀ [N, E] (fp32);  probs = softmax(logits);  choice = top-K of probs,
//   gate = their probs (renormalized when model.norm_topk_prob);
//   aux = E · Σ_e f_e · mean_n probs[n, e],  f_e the share of choices of expert e (over the
//   data-parallel group's batch when one is given).
//   One expert (E = 1): no router, choice 0 with weight 1, no aux loss.
//
// ZAYA1 router (kernels/zaya_router.h has the recipe), latent R, S = E (+1 skip) classes:
//   r = n·Wdownᵀ + b (+ γ ⊙ r_prev, the previous MoE sublayer's r: EDA);  u = rms(r)
//   g2 = gelu(gelu(u·W1ᵀ + b1)·W2ᵀ + b2);  logits = g2·W3ᵀ [N, S]  (all fp32)
//   (choice, gate) = zaya_gating(logits, balancing bias)
// Its backward chains d r through the sublayers: run the layers' backward from the last.
#pragma once
#include <cstdint>

#include "base/arena.h"
#include "kernels/zaya_router.h"
#include "model/compute.h"
#include "model/moe_sublayer.h"
#include "model/params.h"

namespace foundry {

class Communicator;

// ---- standard --------------------------------------------------------------------------------
struct StandardRouterActs {
  float* probs;         // [N, E]
  double* shares;       // [E] the experts' shares f_e of the batch (of the data-parallel
                        // group's batch when one is given)
  int64_t* counts;      // [E] scratch: this rank's choices per expert
  void take(Arena& arena, const ModelConfig& c, BatchShape s);
};
// Scratch shared by the layers: the logits in the forward, their gradient in the backward.
struct StandardRouterScratch {
  float* logits;  // [N, E]
  void take(Arena& arena, const ModelConfig& c, BatchShape s);
};
// `weight`: slab offset of Wr [E, C] (-1 when E = 1). *aux (backend memory, written unless
// E = 1): the layer's aux loss. Collective over `dp_group` when it is not null (one small
// all-reduce of the counts, through the host).
void standard_router_forward(Compute& cx, int64_t weight, StandardRouterActs& r,
                             StandardRouterScratch& scratch, MoeActs& moe, BatchShape s,
                             const Communicator* dp_group, double* aux);
// dn [N, C] += from dgate; aux_coef: the aux loss's weight in the total loss (per layer).
void standard_router_backward(Compute& cx, int64_t weight, const StandardRouterActs& r,
                              StandardRouterScratch& scratch, const MoeActs& moe, BatchShape s,
                              const float* dgate, float aux_coef, float* dn);

// Decoding B tokens: n [B, C] → choice, gate [B, K]; logits, probs [B, E] are scratch.
void standard_router_decode(Compute& cx, int64_t weight, const float* n, int64_t batch,
                            float* logits, float* probs, int32_t* choice, float* gate);

// ---- ZAYA1 -------------------------------------------------------------------------------------
struct ZayaRouterWeights {
  int64_t down_w, down_b, gamma = -1, norm, fc1_w, fc1_b, fc2_w, fc2_b, out_w;  // gamma: no EDA
  static ZayaRouterWeights of_layer(const ParamTable& table, int64_t layer);
};
struct ZayaRouterActs {
  float* r;      // [N, R]  after EDA
  float* u;      // [N, R]  rms(r)
  float* rstd;   // [N]
  float* a1;     // [N, R]  what the GELU's backward reads (Backend::gelu_bias_forward)
  float* g1;     // [N, R]
  float* a2;     // [N, R]  the same for the second GELU
  float* g2;     // [N, R]
  float* probs;  // [N, S]
  float* bias;   // [S] the balancing bias this forward used
  void take(Arena& arena, const ModelConfig& c, BatchShape s);
};
// Scratch shared by the layers, and d r chained from one MoE sublayer's backward to the
// previous one's.
struct ZayaRouterScratch {
  float* logits;   // [N, S]  forward logits, then their gradient
  float *dg, *da;  // [N, R]
  float *dr, *dr_prev;  // [N, R]: d r of the sublayer being differentiated, and of the one before
  void take(Arena& arena, const ModelConfig& c, BatchShape s);
  void begin_backward(Backend& ops, const ModelConfig& c, BatchShape s);  // zeroes d r
};
// r_prev: the previous MoE sublayer's r (null in the first). bias [S]: the sublayer's
// balancing bias, balancer: its rule. counts [S] (written): rows per class; near [S]
// (written unless null): the boundary counts (ops::zaya_boundary_counts) of the newton rule.
// All in backend memory.
void zaya_router_forward(Compute& cx, const ZayaRouterWeights& w, ZayaRouterActs& r,
                         ZayaRouterScratch& scratch, const float* r_prev, const float* bias,
                         const ops::ZayaBalancer& balancer, MoeActs& moe, BatchShape s,
                         int64_t* counts, int64_t* near);
// dn [N, C] += from dgate; hands the EDA gradient of r_prev on to the previous sublayer.
void zaya_router_backward(Compute& cx, const ZayaRouterWeights& w, const ZayaRouterActs& r,
                          ZayaRouterScratch& scratch, const float* r_prev, const MoeActs& moe,
                          BatchShape s, const float* dgate, float* dn);

// Decoding B tokens: n [B, C] → choice, gate [B, K]; r [B, R] is this sublayer's state and
// r_prev [B, R] the previous one's; u, a1, g1, a2, g2 [B, R], rstd [B], logits and probs
// [B, S] are scratch.
struct ZayaRouterDecodeScratch {
  float *u, *rstd, *a1, *g1, *a2, *g2, *logits, *probs;
};
void zaya_router_decode(Compute& cx, const ZayaRouterWeights& w, const float* n, int64_t batch,
                        float* r, const float* r_prev, const float* bias,
                        const ZayaRouterDecodeScratch& scratch, int32_t* choice, float* gate);

}  // namespace foundry
