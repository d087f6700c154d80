#include "model/cca_sublayer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "kernels/attention.h"
#include "kernels/ops.h"
#include "model/context_parallel.h"

namespace foundry {

ops::CcaDims cca_dims(const ModelConfig& c) {
  return {c.n_heads, c.n_kv_heads, c.head_dim, c.cca_kernel_depthwise, c.cca_kernel_grouped};
}

namespace {

// The grouped convolution (qk [B, T, G·d] from y) of a context-parallel chunk, forward and
// backward: oneDNN GEMMs, one per group with the taps stacked in K, in the training precision
// (faster than the register-tiled reference kernel in both precisions at zaya-bench's shape;
// docs/PERFORMANCE.md has the figures). z = the convolution, with its bias b1 or (null)
// without. The rows before each chunk are in y (its halo), so nothing is read before them.
void grouped_conv_forward(const Compute& cx, const CcaWeights& w, float* z, const float* y,
                          const float* b1, int64_t b, int64_t t) {
  const ModelConfig& c = cx.config;
  cx.ops.cca_grouped_conv_forward(z, y, cx.p(w.w1), b1, /*before=*/nullptr, b, t,
                                  c.n_heads + c.n_kv_heads, c.head_dim, c.cca_kernel_grouped,
                                  cx.precision);
}

// dy (written), and the parameters' gradients (+=).
void grouped_conv_backward(const Compute& cx, const CcaWeights& w, float* dy, const float* dz,
                           const float* y, int64_t b, int64_t t) {
  const ModelConfig& c = cx.config;
  cx.ops.cca_grouped_conv_backward(dy, cx.g(w.w1), cx.g(w.b1), /*dbefore=*/nullptr, dz, y,
                                   cx.p(w.w1), /*before=*/nullptr, b, t, c.n_heads + c.n_kv_heads,
                                   c.head_dim, c.cca_kernel_grouped, cx.precision);
}

// ‖·‖ = sqrt(Σx² + eps) in the QK norm (see kernels/cca.h).
constexpr float kQkNormEps = 1e-6f;

constexpr int64_t kF32 = sizeof(float);

// ---- context parallelism: the rows before each chunk ------------------------------------------
// The convolutions at a chunk's first positions read the last R = (t0−1) + (t1−1) packed rows
// c of the chunk before it (t0−1 for the depthwise window, and t1−1 more to recompute the
// depthwise outputs y the grouped window reads); the value shift reads the previous token's
// x·Wv2ᵀ. Each chunk runs as its own sequence of R + Tc rows, [halo ‖ chunk], and the halo
// rows' outputs are dropped; their gradients go back to the chunk they came from. Chunk 0's
// halo of c is zero (the pair's padding), so its halo of y is the depthwise bias b0: what the
// grouped convolution reads before a sequence's start (kernels/cca.h), with its gradient
// going to b0 through the depthwise backward.

int64_t boundary_width(const ModelConfig& c) {
  return std::max(c.context_halo_rows() * (c.q_dim() + c.kv_dim()), c.kv_dim() / 2);
}

// Views of [B, 2, R + Tc, Cc]: (b, slot) = sequence bs = 2b + slot.
struct Extended {
  int64_t sequences, halo, tc, width;
  int64_t length() const { return halo + tc; }
  int64_t count() const { return sequences * length() * width; }
  float* halo_rows(float* x, int64_t bs) const { return x + bs * length() * width; }
  float* chunk_rows(float* x, int64_t bs) const { return x + (bs * length() + halo) * width; }
};

Extended extended(const ModelConfig& c, BatchShape s) {
  return {2 * s.batch, c.context_halo_rows(), s.chunk(), c.q_dim() + c.kv_dim()};
}

void conv_forward_context_parallel(Compute& cx, const CcaWeights& w, CcaActs& a, CcaGrads& g,
                                   BatchShape s) {
  const ModelConfig& c = cx.config;
  ContextParallel& cp = *cx.context_parallel;
  const Extended e = extended(c, s);
  if (e.halo > 0) {
    auto t = cx.time("cp_halo_exchange");
    take_chunk_rows(cx.ops, a.c, g.tails, s.batch, e.tc, e.width, e.tc - e.halo, e.halo);
    cp.exchange_halo(g.tails, g.halos, s.batch, e.halo, e.width);
  }
  auto t = cx.time("cca_conv");
  for (int64_t bs = 0; bs < e.sequences; ++bs) {
    cx.ops.copy(e.halo_rows(a.c_ext, bs), g.halos + bs * e.halo * e.width, e.halo * e.width * kF32);
    cx.ops.copy(e.chunk_rows(a.c_ext, bs), a.c + bs * e.tc * e.width, e.tc * e.width * kF32);
  }
  cx.ops.cca_depthwise_conv_forward(a.y_ext, a.c_ext, cx.p(w.w0), cx.p(w.b0), e.sequences,
                                    e.length(), e.width, c.cca_kernel_depthwise);
  grouped_conv_forward(cx, w, g.ext_a, a.y_ext, cx.p(w.b1), e.sequences, e.length());
  for (int64_t bs = 0; bs < e.sequences; ++bs)
    cx.ops.copy(a.qk + bs * e.tc * e.width, e.chunk_rows(g.ext_a, bs), e.tc * e.width * kF32);
}

// g.dqk holds the gradient of qk; adds the convolutions' part of the gradient of c to g.dc
// (here and, through the halos, on the ranks of the chunks before).
void conv_backward_context_parallel(Compute& cx, const CcaWeights& w, const CcaActs& a,
                                    CcaGrads& g, BatchShape s) {
  const ModelConfig& c = cx.config;
  ContextParallel& cp = *cx.context_parallel;
  const Extended e = extended(c, s);
  {
    auto t = cx.time("cca_conv");
    float* dz = g.ext_a;
    for (int64_t bs = 0; bs < e.sequences; ++bs) {
      cx.ops.zero(e.halo_rows(dz, bs), e.halo * e.width * kF32);
      cx.ops.copy(e.chunk_rows(dz, bs), g.dqk + bs * e.tc * e.width, e.tc * e.width * kF32);
    }
    grouped_conv_backward(cx, w, g.ext_b, dz, a.y_ext, e.sequences, e.length());
    float* dc_ext = g.ext_a;
    cx.ops.zero(dc_ext, e.count() * kF32);
    cx.ops.cca_depthwise_conv_backward(dc_ext, cx.g(w.w0), cx.g(w.b0), g.ext_b, a.c_ext, cx.p(w.w0),
                                       e.sequences, e.length(), e.width, c.cca_kernel_depthwise);
    for (int64_t bs = 0; bs < e.sequences; ++bs) {
      cx.ops.add(g.dc + bs * e.tc * e.width, e.chunk_rows(dc_ext, bs), e.tc * e.width);
      cx.ops.copy(g.halos + bs * e.halo * e.width, e.halo_rows(dc_ext, bs),
                  e.halo * e.width * kF32);
    }
  }
  if (e.halo == 0) return;
  auto t = cx.time("cp_halo_exchange");
  cx.ops.zero(g.tails, e.sequences * e.halo * e.width * kF32);
  cp.return_halo_gradient(g.halos, g.tails, s.batch, e.halo, e.width);
  add_chunk_rows(cx.ops, g.tails, g.dc, s.batch, e.tc, e.width, e.tc - e.halo, e.halo);
}

// The value shift across chunks: each chunk's first row takes the x·Wv2ᵀ of the last token
// of the chunk before it (what the chunk's own shift drops from its last row, the tail).
void value_shift_forward_context_parallel(Compute& cx, float* v, CcaGrads& g, BatchShape s) {
  const int64_t half = cx.config.kv_dim() / 2, width = 2 * half, tc = s.chunk();
  {
    auto t = cx.time("cca_conv");
    for (int64_t bs = 0; bs < 2 * s.batch; ++bs)
      cx.ops.copy(g.tails + bs * half, v + (bs * tc + tc - 1) * width + half, half * kF32);
    cx.ops.cca_value_shift_forward(v, 2 * s.batch, tc, half);
  }
  auto t = cx.time("cp_halo_exchange");
  cx.context_parallel->exchange_halo(g.tails, g.halos, s.batch, 1, half);
  for (int64_t bs = 0; bs < 2 * s.batch; ++bs)
    cx.ops.copy(v + bs * tc * width + half, g.halos + bs * half, half * kF32);
}

void value_shift_backward_context_parallel(Compute& cx, float* dv, CcaGrads& g, BatchShape s) {
  const int64_t half = cx.config.kv_dim() / 2, width = 2 * half, tc = s.chunk();
  {
    auto t = cx.time("cca_conv");
    for (int64_t bs = 0; bs < 2 * s.batch; ++bs)
      cx.ops.copy(g.halos + bs * half, dv + bs * tc * width + half, half * kF32);
    cx.ops.cca_value_shift_backward(dv, 2 * s.batch, tc, half);
  }
  auto t = cx.time("cp_halo_exchange");
  cx.ops.zero(g.tails, 2 * s.batch * half * kF32);
  cx.context_parallel->return_halo_gradient(g.halos, g.tails, s.batch, 1, half);
  for (int64_t bs = 0; bs < 2 * s.batch; ++bs)
    cx.ops.add(dv + (bs * tc + tc - 1) * width + half, g.tails + bs * half, half);
}

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
  if (s.context == 1) y = arena.take<float>(N * Cc);  // else y_ext
  qk = arena.take<float>(N * Cc);
  rnorm = arena.take<float>(N * (cfg.n_heads + cfg.n_kv_heads));
  q = arena.take<float>(N * cfg.q_dim());
  k = arena.take<float>(N * cfg.kv_dim());
  v = arena.take<float>(N * cfg.kv_dim());
  lse = arena.take<float>(s.batch * cfg.n_heads * s.seq);
  att = arena.take<float>(N * cfg.q_dim());
  kv.take(arena, cfg, s);
  if (s.context > 1) {
    c_ext = arena.take<float>(extended(cfg, s).count());
    y_ext = arena.take<float>(extended(cfg, s).count());
  }
}

void CcaGrads::take(Arena& arena, const ModelConfig& c, BatchShape s) {
  const int64_t n = s.rows() * (c.q_dim() + c.kv_dim());
  dc = arena.take<float>(n);
  if (s.context == 1) dy = arena.take<float>(n);  // else ext_b
  dqk = arena.take<float>(n);
  if (s.context > 1) {
    ext_a = arena.take<float>(extended(c, s).count());
    ext_b = arena.take<float>(extended(c, s).count());
    tails = arena.take<float>(2 * s.batch * boundary_width(c));
    halos = arena.take<float>(2 * s.batch * boundary_width(c));
  }
}

void cca_forward(Compute& cx, const CcaWeights& w, CcaActs& a, CcaGrads& g, BatchShape s,
                 const float* x, float* h) {
  const ModelConfig& c = cx.config;
  const int64_t B = s.batch, T = s.seq, N = s.rows(), C = c.d_model;
  const int64_t Hq = c.n_heads, Hk = c.n_kv_heads, d = c.head_dim;
  const int64_t QD = c.q_dim(), KVD = c.kv_dim(), Cc = QD + KVD;
  {
    auto t = cx.time("rmsnorm");
    cx.ops.rmsnorm_forward(a.n, a.rstd, x, cx.p(w.norm), N, C, static_cast<float>(c.rms_norm_eps));
  }
  {
    auto t = cx.time("attn_qkv_gemm");
    const void* n = cx.input(a.n, N * C, 2);
    cx.ops.gemm(n, false, cx.weight(w.wqk), true, a.c, N, Cc, C, cx.precision);
    cx.ops.gemm(n, false, cx.weight(w.wv), true, a.v, N, KVD, C, cx.precision);
  }
  if (cx.context_parallel) {
    conv_forward_context_parallel(cx, w, a, g, s);
    auto t = cx.time("cca_conv");
    cx.ops.cca_means_qk_norm_forward(a.q, a.k, a.rnorm, a.qk, a.c, nullptr, cx.p(w.temp), N, Hq,
                                     Hk, d, kQkNormEps);
  } else {
    auto t = cx.time("cca_conv");
    // The convolutions, then the grouped conv's bias, the means and the QK norm.
    cx.ops.cca_convs_qk_norm_forward(a.q, a.k, a.rnorm, a.qk, a.y, a.c, cx.p(w.w0), cx.p(w.b0),
                                     cx.p(w.w1), cx.p(w.b1), cx.p(w.temp), B, T, Hq, Hk, d,
                                     c.cca_kernel_depthwise, c.cca_kernel_grouped, kQkNormEps,
                                     cx.precision);
    cx.ops.cca_value_shift_forward(a.v, B, T, KVD / 2);
  }
  if (cx.context_parallel) value_shift_forward_context_parallel(cx, a.v, g, s);
  rope_attention_forward(cx, a.q, a.k, a.v, a.lse, a.att, a.kv, s);
  auto t = cx.time("attn_out_gemm");
  cx.linear_forward(h, a.att, w.wo, N, C, QD);
}

void cca_backward(Compute& cx, const CcaWeights& w, const CcaActs& a, AttentionGrads& ga,
                  CcaGrads& g, BatchShape s, const float* x, const void* dh,
                  const InputGradient& dx) {
  const ModelConfig& c = cx.config;
  const int64_t B = s.batch, T = s.seq, N = s.rows(), C = c.d_model;
  const int64_t Hq = c.n_heads, Hk = c.n_kv_heads, d = c.head_dim;
  const int64_t QD = c.q_dim(), KVD = c.kv_dim(), Cc = QD + KVD;
  {
    auto t = cx.time("attn_out_gemm");
    cx.linear_backward(ga.datt, dh, C, a.att, w.wo, N, C, QD, false);
  }
  rope_attention_backward(cx, ga.dq, ga.dk, ga.dv, ga.datt, a.att, a.lse, a.q, a.k, a.v, a.kv,
                          ga.dkv, s);
  if (cx.context_parallel) value_shift_backward_context_parallel(cx, ga.dv, g, s);
  {
    auto t = cx.time("cca_conv");
    if (cx.context_parallel) {
      cx.ops.cca_qk_norm_means_backward(g.dqk, g.dc, cx.g(w.temp), ga.dq, ga.dk, a.qk, a.rnorm,
                                        cx.p(w.temp), N, Hq, Hk, d);
    } else {
      cx.ops.cca_value_shift_backward(ga.dv, B, T, KVD / 2);
      // The QK norm's and the means' gradients, then the convolutions'.
      cx.ops.cca_qk_norm_convs_backward(
          g.dc, cx.g(w.temp), cx.g(w.w0), cx.g(w.b0), cx.g(w.w1), cx.g(w.b1), g.dqk, g.dy, ga.dq,
          ga.dk, a.qk, a.rnorm, cx.p(w.temp), a.y, a.c, cx.p(w.w0), cx.p(w.b0), cx.p(w.w1), B, T,
          Hq, Hk, d, c.cca_kernel_depthwise, c.cca_kernel_grouped, cx.precision);
    }
  }
  if (cx.context_parallel) conv_backward_context_parallel(cx, w, a, g, s);
  {
    auto t = cx.time("attn_qkv_gemm");
    cx.projections_backward(ga.dn, a.n, N, C, {{g.dc, w.wqk, Cc}, {ga.dv, w.wv, KVD}});
  }
  cx.rmsnorm_backward(dx, w.norm, ga.dn, x, a.rstd, N, C);
}

void cca_decode(Compute& cx, const CcaWeights& w, float* const* states, const float* x,
                const DecodeRows& rows, int64_t layer, const CcaDecodeScratch& s,
                int64_t max_len, float* h) {
  const ModelConfig& c = cx.config;
  const int64_t B = rows.n, C = c.d_model, Hq = c.n_heads, Hk = c.n_kv_heads;
  const int64_t d = c.head_dim, QD = c.q_dim(), KVD = c.kv_dim();
  const ops::CcaDims dims = cca_dims(c);
  float *kc = s.k, *vc = s.v;
  cx.ops.rmsnorm_forward(s.n, s.rstd, x, cx.p(w.norm), B, C, static_cast<float>(c.rms_norm_eps));
  cx.linear_forward(s.c, s.n, w.wqk, B, QD + KVD, C);
  cx.ops.cca_conv_decode(s.qk, dims, states, B, s.c, cx.p(w.w0), cx.p(w.b0), cx.p(w.w1),
                         cx.p(w.b1));
  cx.ops.cca_means_forward(s.qk, s.c, B, Hq, Hk, d);
  cx.ops.cca_qk_norm_forward(s.q, kc, s.rnorm, s.qk, cx.p(w.temp), B, Hq, Hk, d, kQkNormEps);
  cx.linear_forward(vc, s.n, w.wv, B, KVD, C);
  cx.ops.cca_value_shift_decode(vc, dims, states, B);
  decode_rows_attention(cx, rows, layer, s.q, kc, vc, s.att, s.scores, max_len, Hq);
  cx.linear_forward(h, s.att, w.wo, B, C, QD);
}

}  // namespace foundry
