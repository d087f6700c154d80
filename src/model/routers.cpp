#include "model/routers.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "comm/comm.h"
#include "kernels/ops.h"
#include "kernels/zaya_router.h"

namespace foundry {

// ---- standard --------------------------------------------------------------------------------

void StandardRouterActs::take(Arena& arena, const ModelConfig& c, BatchShape s) {
  probs = arena.take<float>(s.rows() * c.n_experts);
  shares = arena.take<double>(c.n_experts);
  counts = arena.take<int64_t>(c.n_experts);
}

void StandardRouterScratch::take(Arena& arena, const ModelConfig& c, BatchShape s) {
  logits = arena.take<float>(s.rows() * c.n_experts);
}

namespace {

// r.shares = the experts' shares f_e of the global batch's N·K choices: exact integer counts
// summed over the data-parallel ranks (on the host: one small all-reduce).
void global_shares(Compute& cx, StandardRouterActs& r, const MoeActs& moe, int64_t N,
                   const Communicator& dp_group) {
  const int64_t E = cx.config.n_experts, K = cx.config.top_k;
  std::vector<int64_t> counts(E + 1);
  cx.ops.class_counts(r.counts, moe.choice, N, K, E);
  cx.ops.to_host(counts.data(), r.counts, E * sizeof(int64_t));
  counts[E] = N * K;
  dp_group.allreduce(counts.data(), counts.data(), counts.size());
  std::vector<double> shares(E);
  for (int64_t j = 0; j < E; ++j)
    shares[j] = static_cast<double>(counts[j]) / static_cast<double>(counts[E]);
  cx.ops.from_host(r.shares, shares.data(), E * sizeof(double));
}

}  // namespace

void standard_router_forward(Compute& cx, int64_t weight, StandardRouterActs& r,
                             StandardRouterScratch& scratch, MoeActs& moe, BatchShape s,
                             const Communicator* dp_group, double* aux) {
  const ModelConfig& c = cx.config;
  const int64_t N = s.rows(), C = c.d_model, E = c.n_experts, K = c.top_k;
  if (E == 1) {
    cx.ops.fill(moe.choice, N * K, 0);
    cx.ops.fill(moe.gate, N * K, 1.0f);
    return;
  }
  cx.ops.gemm(moe.n, false, cx.p(weight), true, scratch.logits, N, E, C, DType::f32);
  cx.ops.router_forward(r.probs, moe.choice, moe.gate, scratch.logits, N, E, K,
                        c.norm_topk_prob);
  if (dp_group)
    global_shares(cx, r, moe, N, *dp_group);
  else
    cx.ops.expert_fractions(r.shares, moe.choice, N, E, K);
  cx.ops.router_aux_loss(aux, r.probs, r.shares, N, E);
}

void standard_router_backward(Compute& cx, int64_t weight, const StandardRouterActs& r,
                              StandardRouterScratch& scratch, const MoeActs& moe, BatchShape s,
                              const float* dgate, float aux_coef, float* dn) {
  const ModelConfig& c = cx.config;
  const int64_t N = s.rows(), C = c.d_model, E = c.n_experts, K = c.top_k;
  if (E == 1) return;
  float* dlogits = scratch.logits;
  cx.ops.router_backward(dlogits, dgate, r.probs, moe.choice, moe.gate, N, E, K,
                         c.norm_topk_prob, aux_coef, r.shares);
  cx.ops.gemm(dlogits, false, cx.p(weight), false, dn, N, C, E, DType::f32, true);
  cx.ops.gemm(dlogits, true, moe.n, false, cx.g(weight), E, C, N, DType::f32, true);
}

void standard_router_decode(Compute& cx, int64_t weight, const float* n, int64_t batch,
                            float* logits, float* probs, int32_t* choice, float* gate) {
  const ModelConfig& c = cx.config;
  const int64_t E = c.n_experts, K = c.top_k;
  if (E == 1) {
    cx.ops.fill(choice, batch * K, 0);
    cx.ops.fill(gate, batch * K, 1.0f);
    return;
  }
  cx.ops.gemm(n, false, cx.p(weight), true, logits, batch, E, c.d_model, DType::f32);
  cx.ops.router_forward(probs, choice, gate, logits, batch, E, K, c.norm_topk_prob);
}

// ---- ZAYA1 -------------------------------------------------------------------------------------

ZayaRouterWeights ZayaRouterWeights::of_layer(const ParamTable& t, int64_t layer) {
  const std::string g = fmt::format("model.layers.{}.mlp.gate.", layer);
  ZayaRouterWeights w;
  w.down_w = t.get(g + "down_proj.weight").offset;
  w.down_b = t.get(g + "down_proj.bias").offset;
  if (const ParamInfo* gamma = t.find(g + "router_states_scale")) w.gamma = gamma->offset;
  w.norm = t.get(g + "router_mlp.norm.weight").offset;
  w.fc1_w = t.get(g + "router_mlp.fc1.weight").offset;
  w.fc1_b = t.get(g + "router_mlp.fc1.bias").offset;
  w.fc2_w = t.get(g + "router_mlp.fc2.weight").offset;
  w.fc2_b = t.get(g + "router_mlp.fc2.bias").offset;
  w.out_w = t.get(g + "router_mlp.out_proj.weight").offset;
  return w;
}

void ZayaRouterActs::take(Arena& arena, const ModelConfig& c, BatchShape s) {
  const int64_t N = s.rows(), R = c.router_latent_dim;
  for (float** p : {&r, &u}) *p = arena.take<float>(N * R);
  rstd = arena.take<float>(N);
  for (float** p : {&a1, &g1, &a2, &g2}) *p = arena.take<float>(N * R);
  probs = arena.take<float>(N * c.router_classes());
  bias = arena.take<float>(c.router_classes());
}

void ZayaRouterScratch::take(Arena& arena, const ModelConfig& c, BatchShape s) {
  const int64_t N = s.rows(), R = c.router_latent_dim;
  logits = arena.take<float>(N * c.router_classes());
  for (float** p : {&dg, &da, &dr, &dr_prev}) *p = arena.take<float>(N * R);
}

void ZayaRouterScratch::begin_backward(Backend& ops, const ModelConfig& c, BatchShape s) {
  ops.zero(dr, s.rows() * c.router_latent_dim * sizeof(float));
}

namespace {

ops::BiasOn bias_on(const ModelConfig& c) {
  return c.balance_bias_on == "probs" ? ops::BiasOn::probs : ops::BiasOn::logits;
}

// The router MLP on N rows, all fp32 (it is small, and the choice is sensitive to rounding):
// n [N, C] → r, u, a1, g1, a2, g2 [N, R] and logits [N, S]; rstd [N].
void zaya_router_logits(Compute& cx, const ZayaRouterWeights& w, const float* n,
                        const float* r_prev, int64_t N, float* r, float* u, float* rstd,
                        float* a1, float* g1, float* a2, float* g2, float* logits) {
  const ModelConfig& c = cx.config;
  const int64_t C = c.d_model, R = c.router_latent_dim, S = c.router_classes();
  // The GEMMs run in the training precision like every linear layer; the logits' product and
  // the softmax stay fp32.
  cx.linear_forward(r, n, w.down_w, N, R, C);
  cx.ops.bias_add_forward(r, cx.p(w.down_b), N, R);
  if (w.gamma >= 0) cx.ops.eda_forward(r, r_prev, cx.p(w.gamma), N, R);
  cx.ops.rmsnorm_forward(u, rstd, r, cx.p(w.norm), N, R, static_cast<float>(c.rms_norm_eps));
  // a1 and a2 keep what the GELUs' backward reads (Backend::gelu_bias_forward).
  cx.linear_forward(a1, u, w.fc1_w, N, R, R);
  cx.ops.gelu_bias_forward(g1, a1, cx.p(w.fc1_b), N, R);
  cx.linear_forward(a2, g1, w.fc2_w, N, R, R);
  cx.ops.gelu_bias_forward(g2, a2, cx.p(w.fc2_b), N, R);
  cx.ops.gemm(g2, false, cx.p(w.out_w), true, logits, N, S, R, DType::f32);
}

}  // namespace

void zaya_router_forward(Compute& cx, const ZayaRouterWeights& w, ZayaRouterActs& r,
                         ZayaRouterScratch& scratch, const float* r_prev, const float* bias,
                         const ops::ZayaBalancer& balancer, MoeActs& moe, BatchShape s,
                         int64_t* counts, int64_t* near) {
  const ModelConfig& c = cx.config;
  const int64_t N = s.rows(), S = c.router_classes();
  zaya_router_logits(cx, w, moe.n, r_prev, N, r.r, r.u, r.rstd, r.a1, r.g1, r.a2, r.g2,
                     scratch.logits);
  cx.ops.zaya_gating_forward(r.probs, moe.choice, moe.gate, scratch.logits, bias, bias_on(c), N,
                             c.n_experts, c.top_k, c.router_skip_class, c.skip_passes_input);
  cx.ops.class_counts(counts, moe.choice, N, c.top_k, S);
  if (near)
    cx.ops.zaya_boundary_counts(near, r.probs, scratch.logits, bias, bias_on(c), moe.choice, N,
                                S, c.top_k, balancer.options.window);
}

void zaya_router_backward(Compute& cx, const ZayaRouterWeights& w, const ZayaRouterActs& r,
                          ZayaRouterScratch& sc, const float* r_prev, const MoeActs& moe,
                          BatchShape s, const float* dgate, float* dn) {
  const ModelConfig& c = cx.config;
  const int64_t N = s.rows(), C = c.d_model, R = c.router_latent_dim, S = c.router_classes();
  float* dlogits = sc.logits;
  cx.ops.zaya_gating_backward(dlogits, dgate, r.probs, moe.choice, N, c.n_experts, c.top_k,
                            c.router_skip_class, c.skip_passes_input);
  // logits = g2·W3ᵀ
  cx.ops.gemm(dlogits, true, r.g2, false, cx.g(w.out_w), S, R, N, DType::f32, true);
  cx.ops.gemm(dlogits, false, cx.p(w.out_w), false, sc.dg, N, R, S, DType::f32);
  // a2 = g1·W2ᵀ + b2, g2 = gelu(a2)
  cx.ops.gelu_bias_backward(sc.da, cx.g(w.fc2_b), sc.dg, r.a2, N, R);
  cx.linear_backward(sc.dg, sc.da, r.g1, w.fc2_w, N, R, R, /*accumulate_dx=*/false);
  // a1 = u·W1ᵀ + b1, g1 = gelu(a1)
  cx.ops.gelu_bias_backward(sc.da, cx.g(w.fc1_b), sc.dg, r.a1, N, R);
  cx.linear_backward(sc.dg, sc.da, r.u, w.fc1_w, N, R, R, /*accumulate_dx=*/false);
  // u = rms(r): dr += (dr already holds the next MoE sublayer's EDA contribution)
  cx.ops.rmsnorm_backward(sc.dr, cx.g(w.norm), sc.dg, r.r, cx.p(w.norm), r.rstd, N, R);
  // r = n·Wdownᵀ + b (+ γ ⊙ r_prev): the pre-EDA gradient is dr itself. The previous MoE
  // sublayer's dr starts as this one's EDA contribution (zero without EDA); the first
  // sublayer has none to hand on.
  if (r_prev && w.gamma >= 0)
    cx.ops.eda_backward(sc.dr_prev, cx.g(w.gamma), sc.dr, r_prev, cx.p(w.gamma), N, R);
  else if (r_prev)
    cx.ops.zero(sc.dr_prev, N * R * sizeof(float));
  cx.ops.bias_add_backward(cx.g(w.down_b), sc.dr, N, R);
  cx.linear_backward(dn, sc.dr, moe.n, w.down_w, N, R, C, /*accumulate_dx=*/true);
  std::swap(sc.dr, sc.dr_prev);
}

void zaya_router_decode(Compute& cx, const ZayaRouterWeights& w, const float* n, int64_t batch,
                        float* r, const float* r_prev, const float* bias,
                        const ZayaRouterDecodeScratch& s, int32_t* choice, float* gate) {
  const ModelConfig& c = cx.config;
  zaya_router_logits(cx, w, n, r_prev, batch, r, s.u, s.rstd, s.a1, s.g1, s.a2, s.g2, s.logits);
  cx.ops.zaya_gating_forward(s.probs, choice, gate, s.logits, bias, bias_on(c), batch,
                           c.n_experts, c.top_k, c.router_skip_class, c.skip_passes_input);
}

}  // namespace foundry
