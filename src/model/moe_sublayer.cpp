#include "model/moe_sublayer.h"

#include <cstring>

#include "kernels/ops.h"

namespace foundry {

void MoeActs::take(Arena& arena, const ModelConfig& c, BatchShape s, bool expert_parallel) {
  const int64_t N = s.rows(), C = c.d_model, K = c.top_k, F = c.ffn_dim;
  const int64_t expert_rows = expert_parallel ? 0 : N * K;
  n = arena.take<float>(N * C);
  rstd = arena.take<float>(N);
  choice = arena.take<int32_t>(N * K);
  gate = arena.take<float>(N * K);
  offsets = arena.take<int64_t>(c.router_classes() + 1);
  host_offsets.resize(c.router_classes() + 1);
  slot_token = arena.take<int32_t>(N * K);
  assignment_slot = arena.take<int32_t>(N * K);
  xs = arena.take<float>(N * K * C);
  h = arena.take<float>(expert_rows * 2 * F);
  act = arena.take<float>(expert_rows * F);
  ys = arena.take<float>(N * K * C);
}

void MoeGrads::take(Arena& arena, const ModelConfig& c, BatchShape s, bool expert_parallel) {
  const int64_t N = s.rows(), C = c.d_model, K = c.top_k, F = c.ffn_dim;
  const int64_t expert_rows = expert_parallel ? 0 : N * K;
  dn = arena.take<float>(N * C);
  dxs = arena.take<float>(N * K * C);
  dys = arena.take<float>(N * K * C);
  dh = arena.take<float>(expert_rows * 2 * F);
  dact = arena.take<float>(expert_rows * F);
  dgate = arena.take<float>(N * K);
}

namespace {

// The skip class's rows [offsets[E], offsets[S]) of dst: a copy of src's, or zero.
void skip_rows(Compute& cx, const int64_t* offsets, float* dst, const float* src) {
  const ModelConfig& c = cx.config;
  const int64_t C = c.d_model, E = c.n_experts, S = c.router_classes();
  const int64_t bytes = (offsets[S] - offsets[E]) * C * static_cast<int64_t>(sizeof(float));
  if (bytes == 0) return;
  if (c.skip_passes_input)
    cx.ops.copy(dst + offsets[E] * C, src + offsets[E] * C, bytes);
  else
    cx.ops.zero(dst + offsets[E] * C, bytes);
}

// n = rms(x), the router's choice, and the rows sorted by class into xs.
void route_and_gather(Compute& cx, const MoeWeights& w, MoeActs& a, int64_t N, const float* x,
                      const RouteForward& route) {
  const ModelConfig& c = cx.config;
  const int64_t C = c.d_model, K = c.top_k;
  {
    auto t = cx.time("rmsnorm");
    cx.ops.rmsnorm_forward(a.n, a.rstd, x, cx.p(w.norm), N, C, static_cast<float>(c.rms_norm_eps));
  }
  auto t = cx.time("router");
  route(a);
  cx.ops.moe_dispatch_plan(a.offsets, a.slot_token, a.assignment_slot, a.choice, N,
                           c.router_classes(), K);
  // The one synchronization routing needs: the class sizes shape the experts' products.
  cx.ops.to_host(a.host_offsets.data(), a.offsets, a.host_offsets.size() * sizeof(int64_t));
  cx.ops.moe_gather(a.xs, a.n, a.slot_token, N * K, C);
}

// out = base + Σ_k gate_k · ys_k, once the classes' outputs ys are ready.
void combine(Compute& cx, const MoeActs& a, int64_t N, const float* base, float* out) {
  const ModelConfig& c = cx.config;
  const int64_t C = c.d_model;
  skip_rows(cx, a.host_offsets.data(), a.ys, a.xs);
  auto t = cx.time("moe_combine");
  if (base != out) {
    if (base)
      cx.ops.copy(out, base, N * C * sizeof(float));
    else
      cx.ops.zero(out, N * C * sizeof(float));
  }
  cx.ops.moe_combine(out, a.ys, a.gate, a.assignment_slot, N, c.top_k, C);
}

}  // namespace

void moe_forward(Compute& cx, Experts& experts, int64_t layer, const MoeWeights& w, MoeActs& a,
                 BatchShape s, const float* x, const float* base, float* out,
                 const RouteForward& route) {
  route_and_gather(cx, w, a, s.rows(), x, route);
  experts.forward(layer, a.host_offsets.data(), a.xs, a.h, a.act, a.ys, w.experts);
  combine(cx, a, s.rows(), base, out);
}

void moe_decode(Compute& cx, Experts& experts, const MoeWeights& w, MoeActs& a, int64_t batch,
                const float* x, const float* base, float* out, const RouteForward& route) {
  route_and_gather(cx, w, a, batch, x, route);
  experts.decode(a.host_offsets.data(), a.xs, a.h, a.act, a.ys, w.experts);
  combine(cx, a, batch, base, out);
}

void moe_backward(Compute& cx, Experts& experts, int64_t layer, const MoeWeights& w,
                  const MoeActs& a, MoeGrads& g, BatchShape s, const float* x, const float* dmix,
                  const InputGradient& dx, const RouteBackward& route) {
  const ModelConfig& c = cx.config;
  const int64_t N = s.rows(), C = c.d_model, K = c.top_k;
  {
    auto t = cx.time("moe_combine");
    cx.ops.moe_combine_backward(g.dys, g.dgate, dmix, a.ys, a.gate, a.assignment_slot, N, K, C);
  }
  experts.backward(layer, a.host_offsets.data(), g.dys, a.xs, a.h, a.act, g.dxs, g.dh, g.dact,
                   w.experts);
  skip_rows(cx, a.host_offsets.data(), g.dxs, g.dys);
  {
    auto t = cx.time("router");
    cx.ops.zero(g.dn, N * C * sizeof(float));
    cx.ops.moe_gather_backward(g.dn, g.dxs, a.assignment_slot, N, K, C);
    route(g.dgate, g.dn);
  }
  cx.rmsnorm_backward(dx, w.norm, g.dn, x, a.rstd, N, C);
}

}  // namespace foundry
