// The MoE sublayer of both architectures (internal to model/); only the router differs
// (model/routers.h). With K choices per token among S classes (the E experts, plus ZAYA1's
// skip class):
//   n = rms(x) [N, C];  (choice, gate) = router(n)  [N, K] each
//   rows sorted by class: xs [N·K, C];  ys = expert_class(xs) per row (Experts)
//   out = base + Σ_k gate_k · ys_k [N, C]   (base: x for the standard MoE, 0 for ZAYA1)
// The skip class computes nothing: its rows are the input itself (model.skip_passes_input)
// or zero.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "base/arena.h"
#include "model/compute.h"
#include "model/experts.h"

namespace foundry {

struct MoeWeights {
  int64_t norm;  // slab offset of the pre-norm's weight
  ExpertWeights experts;
};

// One layer's activations, kept for the backward.
struct MoeActs {
  float* n;                  // [N, C]      rms(x), the router's and the experts' input
  float* rstd;               // [N]
  int32_t* choice;           // [N, K]      the router's classes
  float* gate;               // [N, K]      and their weights
  int64_t* offsets;          // [S + 1]     rows of class j: [offsets[j], offsets[j+1])
  std::vector<int64_t> host_offsets;  // the same on the host: they size the experts' GEMMs
  int32_t* slot_token;       // [N·K]       the token of each sorted row
  int32_t* assignment_slot;  // [N·K]       the sorted row of each (token, choice)
  float* xs;                 // [N·K, C]    n, one row per (token, choice), sorted by class
  float* h;                  // [N·K, 2F]   gate | up (no rows under expert parallelism:
  float* act;                // [N·K, F]    swiglu       the owners keep them; act in
                             //                          the GEMM dtype, Experts::forward)
  float* ys;                 // [N·K, C]    class outputs
  void take(Arena& arena, const ModelConfig& c, BatchShape s, bool expert_parallel);
};

// Backward scratch, shared by every layer.
struct MoeGrads {
  float* dn;     // [N, C]
  float* dxs;    // [N·K, C]
  float* dys;    // [N·K, C]
  float* dh;     // [N·K, 2F] (none under expert parallelism)
  float* dact;   // [N·K, F]
  float* dgate;  // [N, K]
  void take(Arena& arena, const ModelConfig& c, BatchShape s, bool expert_parallel);
};

// The router's part, called once n is ready: fill a.choice and a.gate from a.n.
using RouteForward = std::function<void(MoeActs& a)>;
// Its backward: dn [N, C] += d loss/d n from dgate [N, K].
using RouteBackward = std::function<void(const float* dgate, float* dn)>;

// x [N, C] → out [N, C] = base + the experts' mix (base null: zero). out may alias base.
void moe_forward(Compute& cx, Experts& experts, int64_t layer, const MoeWeights& w, MoeActs& a,
                 BatchShape s, const float* x, const float* base, float* out,
                 const RouteForward& route);
// Decoding B tokens, one per sequence: moe_forward on B rows (a laid out for shape {B, 1})
// with every expert local, as decoding does not use an expert-parallel group.
void moe_decode(Compute& cx, Experts& experts, const MoeWeights& w, MoeActs& a, int64_t batch,
                const float* x, const float* base, float* out, const RouteForward& route);
// From dmix [N, C] = d loss/d (out − base): d loss/d x through the norm into dx [N, C]
// (InputGradient; dmix may alias dx: it is read before dx is written); accumulates the
// experts' and the norm's weight gradients, and the router's through `route`.
void moe_backward(Compute& cx, Experts& experts, int64_t layer, const MoeWeights& w,
                  const MoeActs& a, MoeGrads& g, BatchShape s, const float* x, const float* dmix,
                  const InputGradient& dx, const RouteBackward& route);

}  // namespace foundry
