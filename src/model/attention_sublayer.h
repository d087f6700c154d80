// The standard MoE's attention sublayer (internal to model/): causal grouped-query attention
// with RoPE, pre-norm, residual.
//   n = rms(x) [N, C];  q = n·Wqᵀ [N, H·D],  k = n·Wkᵀ, v = n·Wvᵀ [N, KVH·D]
//   q, k = rope(q), rope(k);  att = causal_attention(q, k, v) [N, H·D]
//   out = x + att·Woᵀ [N, C]
// Also the core it shares with ZAYA1's CCA sublayer: RoPE and attention, forward and back.
#pragma once
#include <cstdint>
#include <vector>

#include "base/arena.h"
#include "kernels/attention.h"
#include "kernels/cca.h"
#include "model/compute.h"
#include "model/params.h"

namespace foundry {

struct AttentionWeights {
  int64_t norm, q, k, v, o;            // slab offsets
  int64_t q_norm = -1, k_norm = -1;    // model.qk_norm's weights (-1: none)
  static AttentionWeights of_layer(const ParamTable& table, int64_t layer);
};

// With context parallelism, the keys and values of the whole sequences, gathered from the
// group: [B, C·seq, KVH·D] each (null without it).
struct KvAll {
  float* k = nullptr;
  float* v = nullptr;
  void take(Arena& arena, const ModelConfig& c, BatchShape s);
};

// One layer's activations, kept for the backward.
struct AttentionActs {
  float* n;      // [N, C]      rms(x)
  float* rstd;   // [N]         its 1/rms
  float* q;      // [N, H·D]    after RoPE
  float* k;      // [N, KVH·D]  after RoPE
  float* v;      // [N, KVH·D]
  // model.qk_norm: the projections before their norms and the norms' 1/rms (null without it).
  float* q_raw = nullptr;   // [N, H·D]
  float* k_raw = nullptr;   // [N, KVH·D]
  float* q_rstd = nullptr;  // [N·H·D / q_norm_width]
  float* k_rstd = nullptr;  // [N·KVH·D / k_norm_width]
  float* lse;    // [B, H, T]   each row's softmax log-sum-exp
  float* att;    // [N, H·D]    attention output, before Wo
  KvAll kv;      // context parallel: the whole sequences' k and v
  void take(Arena& arena, const ModelConfig& c, BatchShape s);
};

// Backward scratch, shared by every layer (and by the CCA sublayer).
struct AttentionGrads {
  float* dn;    // [N, C]
  float* dq;    // [N, H·D]
  float* dk;    // [N, KVH·D]
  float* dv;    // [N, KVH·D]
  float* datt;  // [N, H·D]
  float* dq_raw = nullptr;  // model.qk_norm: [N, H·D], the gradient before the q norm
  float* dk_raw = nullptr;  // [N, KVH·D]
  KvAll dkv;    // context parallel: gradients of the whole sequences' k and v
  void take(Arena& arena, const ModelConfig& c, BatchShape s);
};

// x [N, C] → out [N, C] (out may not alias x).
void attention_forward(Compute& cx, const AttentionWeights& w, AttentionActs& a, BatchShape s,
                       const float* x, float* out);
// dx [N, C]: d loss/d out on entry, d loss/d x on return (the residual carries it through).
// Accumulates the sublayer's weight gradients.
void attention_backward(Compute& cx, const AttentionWeights& w, const AttentionActs& a,
                        AttentionGrads& g, BatchShape s, const float* x, float* dx);

// One new token of each of the rows (DecodeRows below), each at its position: x [n, C] →
// h [n, C] = att·Woᵀ (the caller adds the residual). Stores the tokens' rotated k and their v
// at their positions and attends over each row's positions up to its own.
struct AttentionDecodeScratch {
  float *n, *rstd, *q, *att, *scores;  // [B, C], [B], [B, H·D] ×2, [B·H·max_len]
  float *k, *v;                         // [B, KVH·D]: the new rows, before they are stored
  float* qk_rstd = nullptr;             // model.qk_norm: [B·H]
};
// One decode step's rows as the sublayers see them: row r's token sits at position pos[r];
// in layer l its keys and values are read from spans[l][first[r]] … spans[l][first[r+1] − 1]
// (position order, the last including the new position) and its new position is stored in the
// last of them, at index store_at[r]. For arch zaya1, cca[l][r] is the row's CCA state block in
// layer l (ops::decode_state_floats; cca empty: the step's own states, slot r). Rows may write
// the same segment at successive positions: they then share their CCA state and come in
// position order.
struct DecodeRows {
  int64_t n = 0;
  std::vector<int64_t> pos, first, store_at;
  std::vector<std::vector<ops::DecodeSpan>> spans;  // [L][spans of every row]
  std::vector<std::vector<float*>> cca;             // [L][n], in the backend's memory
  bool same_position = false;  // every row at pos[0]: sequences decoded in step
};
void attention_decode(Compute& cx, const AttentionWeights& w, const float* x,
                      const DecodeRows& rows, int64_t layer, const AttentionDecodeScratch& s,
                      int64_t max_len, float* h);
// What both attention sublayers do once q, k and v [n, ·] are projected: q and k rotated at
// the rows' positions, k and v stored, att [n, heads·D] = each row's attention over its
// positions (scores: [n·heads·max_len] scratch).
void decode_rows_attention(Compute& cx, const DecodeRows& rows, int64_t layer, float* q,
                           float* k, const float* v, float* att, float* scores, int64_t max_len,
                           int64_t heads);

// The decode caches of all layers, k and v each [L, one ops::DecodeKv], for B sequences of up
// to max_len positions (both attention sublayers keep their keys and values so).
struct DecodeCaches {
  float *k = nullptr, *v = nullptr;
  int64_t layers = 0, kvh = 1, d = 1, max_len = 0, batch = 0;
  void take(Arena& arena, const ModelConfig& c, int64_t max_len, int64_t batch);
  // Zeroes the caches once the arena is built: on the host this touches every page, so a step
  // reads memory (not the kernel's shared zero page) and never faults, whatever the positions
  // written so far.
  void clear(Backend& backend) const;
  ops::DecodeKv layer(int64_t l) const;
  // The rows of the B sequences decoded in step at `pos`, sequence b over its own cache.
  DecodeRows in_step(int64_t pos) const;
};

// ---- the core both attention sublayers share ------------------------------------------------
// q [N, H·D] and k [N, KVH·D] rotated in place, then att = causal_attention(q, k, v), keeping
// lse [B, H, T]. With context parallelism each chunk's rows rotate at their positions in the
// sequence, kv receives the whole sequences' k and v (one all-gather each) and the rank's
// queries attend to them.
void rope_attention_forward(Compute& cx, float* q, float* k, const float* v, float* lse,
                            float* att, const KvAll& kv, BatchShape s);
// From datt (with att and lse from the forward): dq, dk (through RoPE) and dv, all written.
// With context parallelism the whole sequences' key and value gradients accumulate in dkv,
// and each rank receives the sum over the group of its own rows' (one reduce-scatter each).
void rope_attention_backward(Compute& cx, float* dq, float* dk, float* dv, const float* datt,
                             const float* att, const float* lse, const float* q, const float* k,
                             const float* v, const KvAll& kv, const KvAll& dkv, BatchShape s);

}  // namespace foundry
