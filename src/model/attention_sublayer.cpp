#include "model/attention_sublayer.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include <fmt/format.h>

#include "kernels/attention.h"
#include "kernels/ops.h"
#include "model/context_parallel.h"

namespace foundry {
namespace {

ops::AttentionShape attention_shape(const ModelConfig& c, BatchShape s) {
  return {s.batch, s.seq, c.n_heads, c.n_kv_heads, c.head_dim};
}

}  // namespace

AttentionWeights AttentionWeights::of_layer(const ParamTable& t, int64_t layer) {
  const std::string p = fmt::format("model.layers.{}.", layer);
  AttentionWeights w{t.get(p + "input_layernorm.weight").offset,
                     t.get(p + "self_attn.q_proj.weight").offset,
                     t.get(p + "self_attn.k_proj.weight").offset,
                     t.get(p + "self_attn.v_proj.weight").offset,
                     t.get(p + "self_attn.o_proj.weight").offset};
  if (const ParamInfo* q = t.find(p + "self_attn.q_norm.weight")) {
    w.q_norm = q->offset;
    w.k_norm = t.get(p + "self_attn.k_norm.weight").offset;
  }
  return w;
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
  if (c.qk_norm != QkNorm::none) {
    q_raw = arena.take<float>(N * c.q_dim());
    k_raw = arena.take<float>(N * c.kv_dim());
    q_rstd = arena.take<float>(N * c.q_dim() / c.q_norm_width());
    k_rstd = arena.take<float>(N * c.kv_dim() / c.k_norm_width());
  }
  kv.take(arena, c, s);
}

void AttentionGrads::take(Arena& arena, const ModelConfig& c, BatchShape s) {
  const int64_t N = s.rows();
  dn = arena.take<float>(N * c.d_model);
  dq = arena.take<float>(N * c.q_dim());
  dk = arena.take<float>(N * c.kv_dim());
  dv = arena.take<float>(N * c.kv_dim());
  datt = arena.take<float>(N * c.q_dim());
  if (c.qk_norm != QkNorm::none) {
    dq_raw = arena.take<float>(N * c.q_dim());
    dk_raw = arena.take<float>(N * c.kv_dim());
  }
  dkv.take(arena, c, s);
}

void KvAll::take(Arena& arena, const ModelConfig& c, BatchShape s) {
  if (s.context == 1) return;
  k = arena.take<float>(s.batch * s.full_seq() * c.kv_dim());
  v = arena.take<float>(s.batch * s.full_seq() * c.kv_dim());
}

namespace {

// RoPE on x [B, seq, heads, D] in place (inverse: its transpose, for gradients): positions
// 0 … seq−1, or with context parallelism each chunk at its own positions.
void rope_rows(Compute& cx, float* x, int64_t heads, BatchShape s, bool inverse) {
  const ModelConfig& c = cx.config;
  const ContextParallel* cp = cx.context_parallel;
  if (!cp) {
    cx.ops.rope_apply(x, s.batch, s.seq, heads, c.head_dim, c.rotary_dim(), 0, c.rope_theta,
                    inverse);
    return;
  }
  const int64_t tc = s.chunk(), row = heads * c.head_dim;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int slot = 0; slot < 2; ++slot)
      cx.ops.rope_apply(x + (b * s.seq + slot * tc) * row, 1, tc, heads, c.head_dim,
                      c.rotary_dim(), cp->chunk(slot) * tc, c.rope_theta, inverse);
}

// model.qk_norm over n rows of q [n, H·D] and k [n, KVH·D]: rows of the norms' widths (a head
// each, or the whole projection). Forward: q_out, k_out from q_in, k_in (may alias them).
void qk_norm_forward(Compute& cx, const AttentionWeights& w, int64_t n, const float* q_in,
                     const float* k_in, float* q_out, float* k_out, float* q_rstd,
                     float* k_rstd) {
  const ModelConfig& c = cx.config;
  const int64_t wq = c.q_norm_width(), wk = c.k_norm_width();
  const float eps = static_cast<float>(c.rms_norm_eps);
  cx.ops.rmsnorm_forward(q_out, q_rstd, q_in, cx.p(w.q_norm), n * c.q_dim() / wq, wq, eps);
  cx.ops.rmsnorm_forward(k_out, k_rstd, k_in, cx.p(w.k_norm), n * c.kv_dim() / wk, wk, eps);
}

// From the gradients after the norms (g.dq, g.dk) to those before them (g.dq_raw, g.dk_raw,
// written), accumulating the norms' weight gradients.
void qk_norm_backward(Compute& cx, const AttentionWeights& w, const AttentionActs& a,
                      AttentionGrads& g, int64_t n) {
  const ModelConfig& c = cx.config;
  const int64_t wq = c.q_norm_width(), wk = c.k_norm_width();
  const int64_t q_rows = n * c.q_dim() / wq, k_rows = n * c.kv_dim() / wk;
  cx.ops.fill(g.dq_raw, n * c.q_dim(), 0.0f);
  cx.ops.fill(g.dk_raw, n * c.kv_dim(), 0.0f);
  cx.ops.rmsnorm_backward(g.dq_raw, cx.g(w.q_norm), g.dq, a.q_raw, cx.p(w.q_norm), a.q_rstd,
                        q_rows, wq);
  cx.ops.rmsnorm_backward(g.dk_raw, cx.g(w.k_norm), g.dk, a.k_raw, cx.p(w.k_norm), a.k_rstd,
                        k_rows, wk);
}

// The query rows of `slot` against the whole sequences' keys.
ops::AttentionChunk chunk_of_slot(const ModelConfig& c, BatchShape s, const ContextParallel& cp,
                                  int slot) {
  const int64_t tc = s.chunk();
  return {s.batch, c.n_heads, c.n_kv_heads, c.head_dim, s.seq, s.full_seq(), slot * tc,
          (slot + 1) * tc, cp.chunk(slot) * tc};
}

}  // namespace

void rope_attention_forward(Compute& cx, float* q, float* k, const float* v, float* lse,
                            float* att, const KvAll& kv, BatchShape s) {
  const ModelConfig& c = cx.config;
  {
    auto t = cx.time("rope");
    rope_rows(cx, q, c.n_heads, s, false);
    rope_rows(cx, k, c.n_kv_heads, s, false);
  }
  ContextParallel* cp = cx.context_parallel;
  if (!cp) {
    auto t = cx.time("attention");
    cx.ops.attention_forward(att, lse, q, k, v, attention_shape(c, s), cx.precision);
    return;
  }
  // Slot 0's queries read only the chunks all ranks hold in slot 0 (0 … C−1): they attend
  // while the slot-1 chunks are still on their way.
  {
    auto t = cx.time("cp_kv_exchange");
    for (int slot = 0; slot < 2; ++slot) {
      cp->start_gather(slot, 0, k, kv.k, s.batch, s.chunk(), c.kv_dim());
      cp->start_gather(slot, 1, v, kv.v, s.batch, s.chunk(), c.kv_dim());
    }
    cp->finish(0);
  }
  const std::function<void()> progress = [cp] { cp->progress(); };
  for (int slot = 0; slot < 2; ++slot) {
    if (slot == 1) {
      auto t = cx.time("cp_kv_exchange");
      cp->finish(1);
    }
    auto t = cx.time("attention");
    cx.ops.attention_chunk_forward(att, lse, q, kv.k, kv.v, chunk_of_slot(c, s, *cp, slot),
                                   cx.precision, slot == 0 ? progress : nullptr);
  }
}

void rope_attention_backward(Compute& cx, float* dq, float* dk, float* dv, const float* datt,
                             const float* att, const float* lse, const float* q, const float* k,
                             const float* v, const KvAll& kv, const KvAll& dkv, BatchShape s) {
  const ModelConfig& c = cx.config;
  ContextParallel* cp = cx.context_parallel;
  if (!cp) {
    auto t = cx.time("attention");
    cx.ops.attention_backward(dq, dk, dv, datt, att, lse, q, k, v, attention_shape(c, s),
                            cx.precision);
  } else {
    // Slot 1 first: the slot-1 chunks' key gradients (C … 2C−1) are then complete, since the
    // slot-0 queries never see them, and they travel while slot 0 computes.
    const int64_t n = s.batch * s.full_seq() * c.kv_dim();
    cx.ops.fill(dkv.k, n, 0.0f);
    cx.ops.fill(dkv.v, n, 0.0f);
    const std::function<void()> progress = [cp] { cp->progress(); };
    for (int slot : {1, 0}) {
      {
        auto t = cx.time("attention");
        cx.ops.attention_chunk_backward(dq, dkv.k, dkv.v, datt, att, lse, q, kv.k, kv.v,
                                        chunk_of_slot(c, s, *cp, slot), cx.precision,
                                        slot == 0 ? progress : nullptr);
      }
      auto t = cx.time("cp_kv_exchange");
      cp->start_reduce_scatter(slot, 0, dkv.k, dk, s.batch, s.chunk(), c.kv_dim());
      cp->start_reduce_scatter(slot, 1, dkv.v, dv, s.batch, s.chunk(), c.kv_dim());
    }
    auto t = cx.time("cp_kv_exchange");
    cp->finish(1);
    cp->finish(0);
  }
  auto t = cx.time("rope");
  rope_rows(cx, dq, c.n_heads, s, true);
  rope_rows(cx, dk, c.n_kv_heads, s, true);
}

void attention_forward(Compute& cx, const AttentionWeights& w, AttentionActs& a, BatchShape s,
                       const float* x, float* out) {
  const ModelConfig& c = cx.config;
  const int64_t N = s.rows(), C = c.d_model, QD = c.q_dim(), KVD = c.kv_dim();
  const bool qk_norm = w.q_norm >= 0;
  {
    auto t = cx.time("rmsnorm");
    cx.ops.rmsnorm_forward(a.n, a.rstd, x, cx.p(w.norm), N, C, static_cast<float>(c.rms_norm_eps));
  }
  {
    auto t = cx.time("attn_qkv_gemm");
    const void* n = cx.input(a.n, N * C, 2);
    cx.ops.gemm(n, false, cx.weight(w.q), true, qk_norm ? a.q_raw : a.q, N, QD, C, cx.precision);
    cx.ops.gemm(n, false, cx.weight(w.k), true, qk_norm ? a.k_raw : a.k, N, KVD, C, cx.precision);
    cx.ops.gemm(n, false, cx.weight(w.v), true, a.v, N, KVD, C, cx.precision);
  }
  if (qk_norm) {
    auto t = cx.time("qk_norm");
    qk_norm_forward(cx, w, N, a.q_raw, a.k_raw, a.q, a.k, a.q_rstd, a.k_rstd);
  }
  rope_attention_forward(cx, a.q, a.k, a.v, a.lse, a.att, a.kv, s);
  auto t = cx.time("attn_out_gemm");
  cx.ops.copy(out, x, N * C * sizeof(float));
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
  rope_attention_backward(cx, g.dq, g.dk, g.dv, g.datt, a.att, a.lse, a.q, a.k, a.v, a.kv, g.dkv,
                          s);
  const bool qk_norm = w.q_norm >= 0;
  if (qk_norm) {
    auto t = cx.time("qk_norm");
    qk_norm_backward(cx, w, a, g, N);
  }
  {
    auto t = cx.time("attn_qkv_gemm");
    float* dq = qk_norm ? g.dq_raw : g.dq;
    float* dk = qk_norm ? g.dk_raw : g.dk;
    cx.projections_backward(g.dn, a.n, N, C, {{dq, w.q, QD}, {dk, w.k, KVD}, {g.dv, w.v, KVD}});
  }
  auto t = cx.time("rmsnorm");
  cx.ops.rmsnorm_backward(dx, cx.g(w.norm), g.dn, x, cx.p(w.norm), a.rstd, N, C);
}

void DecodeCaches::take(Arena& arena, const ModelConfig& c, int64_t len, int64_t b) {
  layers = c.n_layers;
  kvh = c.n_kv_heads;
  d = c.head_dim;
  max_len = len;
  batch = b;
  const int64_t n = layers * ops::DecodeKv::floats(batch, kvh, d, max_len);
  k = arena.take<float>(n);
  v = arena.take<float>(n);
}

void DecodeCaches::clear(Backend& backend) const {
  const int64_t bytes = layers * ops::DecodeKv::floats(batch, kvh, d, max_len) *
                        static_cast<int64_t>(sizeof(float));
  backend.zero(k, bytes);
  backend.zero(v, bytes);
}

ops::DecodeKv DecodeCaches::layer(int64_t l) const {
  const int64_t per_layer = ops::DecodeKv::floats(batch, kvh, d, max_len);
  return {k + l * per_layer, v + l * per_layer, batch, kvh, d, max_len};
}

DecodeRows DecodeCaches::in_step(int64_t pos) const {
  DecodeRows rows;
  rows.n = batch;
  rows.same_position = true;
  rows.pos.assign(batch, pos);
  rows.store_at.assign(batch, pos);
  rows.first.resize(batch + 1);
  for (int64_t b = 0; b <= batch; ++b) rows.first[b] = b;
  rows.spans.resize(layers);
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t b = 0; b < batch; ++b) rows.spans[l].push_back(ops::decode_span(layer(l), b, pos + 1));
  return rows;
}

void decode_rows_attention(Compute& cx, const DecodeRows& rows, int64_t layer, float* q,
                           float* k, const float* v, float* att, float* scores, int64_t max_len,
                           int64_t heads) {
  const ModelConfig& c = cx.config;
  const int64_t n = rows.n, D = c.head_dim, KVH = c.n_kv_heads, rot = c.rotary_dim();
  if (rows.same_position) {
    cx.ops.rope_apply(q, n, 1, heads, D, rot, rows.pos[0], c.rope_theta, false);
    cx.ops.rope_apply(k, n, 1, KVH, D, rot, rows.pos[0], c.rope_theta, false);
  } else {
    cx.ops.rope_apply_rows(q, rows.pos.data(), n, heads, D, rot, c.rope_theta);
    cx.ops.rope_apply_rows(k, rows.pos.data(), n, KVH, D, rot, c.rope_theta);
  }
  const std::vector<ops::DecodeSpan>& spans = rows.spans[layer];
  std::vector<ops::DecodeSpan> last(n);  // where each row's position is stored
  for (int64_t r = 0; r < n; ++r) last[r] = spans[rows.first[r + 1] - 1];
  cx.ops.decode_kv_store(last.data(), rows.store_at.data(), k, v, n, KVH, D);
  cx.ops.attention_decode_rows(att, scores, max_len, q, spans.data(), rows.first.data(), n, heads,
                               KVH, D);
}

void attention_decode(Compute& cx, const AttentionWeights& w, const float* x,
                      const DecodeRows& rows, int64_t layer, const AttentionDecodeScratch& s,
                      int64_t max_len, float* h) {
  const ModelConfig& c = cx.config;
  const int64_t B = rows.n, C = c.d_model, QD = c.q_dim(), KVD = c.kv_dim();
  float *kc = s.k, *vc = s.v;
  cx.ops.rmsnorm_forward(s.n, s.rstd, x, cx.p(w.norm), B, C, static_cast<float>(c.rms_norm_eps));
  cx.linear_forward(s.q, s.n, w.q, B, QD, C);
  cx.linear_forward(kc, s.n, w.k, B, KVD, C);
  cx.linear_forward(vc, s.n, w.v, B, KVD, C);
  if (w.q_norm >= 0)
    qk_norm_forward(cx, w, B, s.q, kc, s.q, kc, s.qk_rstd, s.qk_rstd);
  decode_rows_attention(cx, rows, layer, s.q, kc, vc, s.att, s.scores, max_len, c.n_heads);
  cx.linear_forward(h, s.att, w.o, B, C, QD);
}

}  // namespace foundry
