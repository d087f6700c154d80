#include "model/cca_sublayer.h"

#include <cstring>

#include <fmt/format.h>

#include "kernels/attention.h"
#include "kernels/ops.h"

namespace foundry {
namespace {

// ‖·‖ = sqrt(Σx² + eps) in the QK norm (see kernels/cca.h).
constexpr float kQkNormEps = 1e-6f;

}  // namespace

CcaWeights CcaWeights::of_layer(const ParamTable& t, int64_t layer) {
  const std::string p = fmt::format("model.layers.{}.", layer);
  const std::string qkv = p + "self_attn.qkv_proj.";
  CcaWeights w;
  w.norm = t.get(p + "input_layernorm.weight").offset;
  w.wqk = t.get(qkv + "q_proj.weight").offset;         // k_proj follows: one [Cc, C] matrix
  w.wv = t.get(qkv + "v_proj_current.weight").offset;  // v_proj_delayed follows
  w.w0 = t.get(qkv + "conv_qk_depthwise.weight").offset;
  w.b0 = t.get(qkv + "conv_qk_depthwise.bias").offset;
  w.w1 = t.get(qkv + "conv_qk_grouped.weight").offset;
  w.b1 = t.get(qkv + "conv_qk_grouped.bias").offset;
  w.temp = t.get(p + "self_attn.qk_norm.temp").offset;
  w.wo = t.get(p + "self_attn.o_proj.weight").offset;
  return w;
}

void CcaActs::take(Arena& arena, const ModelConfig& cfg, BatchShape s) {
  const int64_t N = s.rows(), Cc = cfg.q_dim() + cfg.kv_dim();
  n = arena.take<float>(N * cfg.d_model);
  rstd = arena.take<float>(N);
  c = arena.take<float>(N * Cc);
  y = arena.take<float>(N * Cc);
  qk = arena.take<float>(N * Cc);
  rnorm = arena.take<float>(N * (cfg.n_heads + cfg.n_kv_heads));
  q = arena.take<float>(N * cfg.q_dim());
  k = arena.take<float>(N * cfg.kv_dim());
  v = arena.take<float>(N * cfg.kv_dim());
  lse = arena.take<float>(s.batch * cfg.n_heads * s.seq);
  att = arena.take<float>(N * cfg.q_dim());
}

void CcaGrads::take(Arena& arena, const ModelConfig& c, BatchShape s) {
  const int64_t n = s.rows() * (c.q_dim() + c.kv_dim());
  dc = arena.take<float>(n);
  dy = arena.take<float>(n);
  dqk = arena.take<float>(n);
}

void cca_forward(Compute& cx, const CcaWeights& w, CcaActs& a, BatchShape s, const float* x,
                 float* h) {
  const ModelConfig& c = cx.config;
  const int64_t B = s.batch, T = s.seq, N = s.rows(), C = c.d_model;
  const int64_t Hq = c.n_heads, Hk = c.n_kv_heads, d = c.head_dim;
  const int64_t QD = c.q_dim(), KVD = c.kv_dim(), Cc = QD + KVD;
  {
    auto t = cx.time("rmsnorm");
    ops::rmsnorm_forward(a.n, a.rstd, x, cx.p(w.norm), N, C, static_cast<float>(c.rms_norm_eps));
  }
  {
    auto t = cx.time("attn_qkv_gemm");
    const void* n = cx.input(a.n, N * C, 2);
    gemm(n, false, cx.weight(w.wqk), true, a.c, N, Cc, C, cx.precision);
    gemm(n, false, cx.weight(w.wv), true, a.v, N, KVD, C, cx.precision);
  }
  {
    auto t = cx.time("cca_conv");
    ops::cca_depthwise_conv_forward(a.y, a.c, cx.p(w.w0), cx.p(w.b0), B, T, Cc,
                                    c.cca_kernel_depthwise);
    ops::cca_grouped_conv_forward(a.qk, a.y, cx.p(w.w1), cx.p(w.b1), B, T, Hq + Hk, d,
                                  c.cca_kernel_grouped);
    ops::cca_means_forward(a.qk, a.c, N, Hq, Hk, d);
    ops::cca_qk_norm_forward(a.q, a.k, a.rnorm, a.qk, cx.p(w.temp), N, Hq, Hk, d, kQkNormEps);
    ops::cca_value_shift_inplace_forward(a.v, static_cast<float*>(nullptr), B, T, KVD / 2);
  }
  rope_attention_forward(cx, a.q, a.k, a.v, a.lse, a.att, s);
  auto t = cx.time("attn_out_gemm");
  cx.linear_forward(h, a.att, w.wo, N, C, QD);
}

void cca_backward(Compute& cx, const CcaWeights& w, const CcaActs& a, AttentionGrads& ga,
                  CcaGrads& g, BatchShape s, const float* x, const float* dh, float* dx) {
  const ModelConfig& c = cx.config;
  const int64_t B = s.batch, T = s.seq, N = s.rows(), C = c.d_model;
  const int64_t Hq = c.n_heads, Hk = c.n_kv_heads, d = c.head_dim;
  const int64_t QD = c.q_dim(), KVD = c.kv_dim(), Cc = QD + KVD;
  {
    auto t = cx.time("attn_out_gemm");
    cx.linear_backward(ga.datt, dh, a.att, w.wo, N, C, QD, false);
  }
  rope_attention_backward(cx, ga.dq, ga.dk, ga.dv, ga.datt, a.att, a.lse, a.q, a.k, a.v,
                          s);
  {
    auto t = cx.time("cca_conv");
    ops::cca_value_shift_inplace_backward(ga.dv, B, T, KVD / 2);
    std::memset(g.dqk, 0, N * Cc * sizeof(float));
    ops::cca_qk_norm_backward(g.dqk, cx.g(w.temp), ga.dq, ga.dk, a.qk, a.rnorm, cx.p(w.temp), N,
                              Hq, Hk, d);
    std::memset(g.dc, 0, N * Cc * sizeof(float));
    ops::cca_means_backward(g.dc, g.dqk, N, Hq, Hk, d);
    std::memset(g.dy, 0, N * Cc * sizeof(float));
    ops::cca_grouped_conv_backward(g.dy, cx.g(w.w1), cx.g(w.b1), g.dqk, a.y, cx.p(w.w1), B, T,
                                   Hq + Hk, d, c.cca_kernel_grouped);
    ops::cca_depthwise_conv_backward(g.dc, cx.g(w.w0), cx.g(w.b0), g.dy, a.c, cx.p(w.w0), B, T, Cc,
                                     c.cca_kernel_depthwise);
  }
  {
    auto t = cx.time("attn_qkv_gemm");
    cx.projections_backward(ga.dn, a.n, N, C, {{g.dc, w.wqk, Cc}, {ga.dv, w.wv, KVD}});
  }
  auto t = cx.time("rmsnorm");
  ops::rmsnorm_backward(dx, cx.g(w.norm), ga.dn, x, cx.p(w.norm), a.rstd, N, C);
}

void cca_decode(Compute& cx, const CcaWeights& w, ops::CcaDecodeState<float>& state,
                const float* x, int64_t pos, float* kc, float* vc, const float* k_cache,
                const float* v_cache, const CcaDecodeScratch& s, float* h) {
  const ModelConfig& c = cx.config;
  const int64_t C = c.d_model, Hq = c.n_heads, Hk = c.n_kv_heads, d = c.head_dim;
  const int64_t QD = c.q_dim(), KVD = c.kv_dim(), rot = c.rotary_dim();
  float rstd;
  ops::rmsnorm_forward(s.n, &rstd, x, cx.p(w.norm), 1, C, static_cast<float>(c.rms_norm_eps));
  cx.linear_forward(s.c, s.n, w.wqk, 1, QD + KVD, C);
  ops::cca_conv_decode(s.qk, state, s.c, cx.p(w.w0), cx.p(w.b0), cx.p(w.w1), cx.p(w.b1));
  ops::cca_means_forward(s.qk, s.c, 1, Hq, Hk, d);
  ops::cca_qk_norm_forward(s.q, kc, s.rnorm, s.qk, cx.p(w.temp), 1, Hq, Hk, d, kQkNormEps);
  ops::rope_apply(s.q, 1, 1, Hq, d, rot, pos, c.rope_theta, false);
  ops::rope_apply(kc, 1, 1, Hk, d, rot, pos, c.rope_theta, false);
  cx.linear_forward(vc, s.n, w.wv, 1, KVD, C);
  ops::cca_value_shift_decode(vc, state);
  ops::attention_decode(s.att, s.scores, s.q, k_cache, v_cache, pos + 1, Hq, Hk, d);
  cx.linear_forward(h, s.att, w.wo, 1, C, QD);
}

}  // namespace foundry
