#include "model/attention_sublayer.h"

#include <cstring>

#include <fmt/format.h>

#include "kernels/attention.h"
#include "kernels/ops.h"

namespace foundry {
namespace {

ops::AttentionShape attention_shape(const ModelConfig& c, BatchShape s) {
  return {s.batch, s.seq, c.n_heads, c.n_kv_heads, c.head_dim};
}

}  // namespace

AttentionWeights AttentionWeights::of_layer(const ParamTable& t, int64_t layer) {
  const std::string p = fmt::format("model.layers.{}.", layer);
  return {t.get(p + "input_layernorm.weight").offset, t.get(p + "self_attn.q_proj.weight").offset,
          t.get(p + "self_attn.k_proj.weight").offset, t.get(p + "self_attn.v_proj.weight").offset,
          t.get(p + "self_attn.o_proj.weight").offset};
}

void AttentionActs::take(Arena& arena, const ModelConfig& c, BatchShape s) {
  const int64_t N = s.rows();
  n = arena.take<float>(N * c.d_model);
  rstd = arena.take<float>(N);
  q = arena.take<float>(N * c.q_dim());
  k = arena.take<float>(N * c.kv_dim());
  v = arena.take<float>(N * c.kv_dim());
  lse = arena.take<float>(s.batch * c.n_heads * s.seq);
  att = arena.take<float>(N * c.q_dim());
}

void AttentionGrads::take(Arena& arena, const ModelConfig& c, BatchShape s) {
  const int64_t N = s.rows();
  dn = arena.take<float>(N * c.d_model);
  dq = arena.take<float>(N * c.q_dim());
  dk = arena.take<float>(N * c.kv_dim());
  dv = arena.take<float>(N * c.kv_dim());
  datt = arena.take<float>(N * c.q_dim());
}

void rope_attention_forward(Compute& cx, float* q, float* k, const float* v, float* lse,
                            float* att, BatchShape s) {
  const ModelConfig& c = cx.config;
  {
    auto t = cx.time("rope");
    ops::rope_apply(q, s.batch, s.seq, c.n_heads, c.head_dim, c.rotary_dim(), 0, c.rope_theta,
                    false);
    ops::rope_apply(k, s.batch, s.seq, c.n_kv_heads, c.head_dim, c.rotary_dim(), 0, c.rope_theta,
                    false);
  }
  auto t = cx.time("attention");
  ops::attention_forward(att, lse, q, k, v, attention_shape(c, s), cx.precision);
}

void rope_attention_backward(Compute& cx, float* dq, float* dk, float* dv, const float* datt,
                             const float* att, const float* lse, const float* q, const float* k,
                             const float* v, BatchShape s) {
  const ModelConfig& c = cx.config;
  {
    auto t = cx.time("attention");
    ops::attention_backward(dq, dk, dv, datt, att, lse, q, k, v, attention_shape(c, s),
                            cx.precision);
  }
  auto t = cx.time("rope");
  ops::rope_apply(dq, s.batch, s.seq, c.n_heads, c.head_dim, c.rotary_dim(), 0, c.rope_theta,
                  true);
  ops::rope_apply(dk, s.batch, s.seq, c.n_kv_heads, c.head_dim, c.rotary_dim(), 0, c.rope_theta,
                  true);
}

void attention_forward(Compute& cx, const AttentionWeights& w, AttentionActs& a, BatchShape s,
                       const float* x, float* out) {
  const ModelConfig& c = cx.config;
  const int64_t N = s.rows(), C = c.d_model, QD = c.q_dim(), KVD = c.kv_dim();
  {
    auto t = cx.time("rmsnorm");
    ops::rmsnorm_forward(a.n, a.rstd, x, cx.p(w.norm), N, C, static_cast<float>(c.rms_norm_eps));
  }
  {
    auto t = cx.time("attn_qkv_gemm");
    const void* n = cx.input(a.n, N * C, 2);
    gemm(n, false, cx.weight(w.q), true, a.q, N, QD, C, cx.precision);
    gemm(n, false, cx.weight(w.k), true, a.k, N, KVD, C, cx.precision);
    gemm(n, false, cx.weight(w.v), true, a.v, N, KVD, C, cx.precision);
  }
  rope_attention_forward(cx, a.q, a.k, a.v, a.lse, a.att, s);
  auto t = cx.time("attn_out_gemm");
  std::memcpy(out, x, N * C * sizeof(float));
  cx.linear_forward(out, a.att, w.o, N, C, QD, 0, /*accumulate=*/true);
}

void attention_backward(Compute& cx, const AttentionWeights& w, const AttentionActs& a,
                        AttentionGrads& g, BatchShape s, const float* x, float* dx) {
  const ModelConfig& c = cx.config;
  const int64_t N = s.rows(), C = c.d_model, QD = c.q_dim(), KVD = c.kv_dim();
  {
    auto t = cx.time("attn_out_gemm");
    cx.linear_backward(g.datt, dx, a.att, w.o, N, C, QD, false);
  }
  rope_attention_backward(cx, g.dq, g.dk, g.dv, g.datt, a.att, a.lse, a.q, a.k, a.v, s);
  {
    auto t = cx.time("attn_qkv_gemm");
    cx.projections_backward(g.dn, a.n, N, C, {{g.dq, w.q, QD}, {g.dk, w.k, KVD}, {g.dv, w.v, KVD}});
  }
  auto t = cx.time("rmsnorm");
  ops::rmsnorm_backward(dx, cx.g(w.norm), g.dn, x, cx.p(w.norm), a.rstd, N, C);
}

void attention_decode(Compute& cx, const AttentionWeights& w, const float* x, int64_t pos,
                      float* kc, float* vc, const float* k_cache, const float* v_cache,
                      const AttentionDecodeScratch& s, float* h) {
  const ModelConfig& c = cx.config;
  const int64_t C = c.d_model, QD = c.q_dim(), KVD = c.kv_dim(), D = c.head_dim;
  float rstd;
  ops::rmsnorm_forward(s.n, &rstd, x, cx.p(w.norm), 1, C, static_cast<float>(c.rms_norm_eps));
  cx.linear_forward(s.q, s.n, w.q, 1, QD, C);
  cx.linear_forward(kc, s.n, w.k, 1, KVD, C);
  cx.linear_forward(vc, s.n, w.v, 1, KVD, C);
  ops::rope_apply(s.q, 1, 1, c.n_heads, D, c.rotary_dim(), pos, c.rope_theta, false);
  ops::rope_apply(kc, 1, 1, c.n_kv_heads, D, c.rotary_dim(), pos, c.rope_theta, false);
  ops::attention_decode(s.att, s.scores, s.q, k_cache, v_cache, pos + 1, c.n_heads, c.n_kv_heads,
                        D);
  cx.linear_forward(h, s.att, w.o, 1, C, QD);
}

}  // namespace foundry
