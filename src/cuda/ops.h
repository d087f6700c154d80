// The model's memory-bound operations on the GPU: the same contracts as foundry::ops
// (kernels/ops.h), in fp32 on device pointers, each queued on the default stream. Backward
// functions accumulate (+=) where the CPU's do and write where they write. Deterministic like
// the CPU: no atomics; every reduction has a fixed order that does not depend on the launch
// shape (per-channel sums over rows go through fixed 32-row chunks summed in chunk order).
//
// Not checked on the device (a kernel cannot throw): token ids and targets must be in range;
// the host checks them when a batch is copied in.
#pragma once
#include <cstdint>

#include "cuda/runtime.h"

namespace foundry::gpu::ops {

// ---- fills and conversions (elementwise.cu) ----
void fill(float* x, int64_t n, float value);
void fill(int32_t* x, int64_t n, int32_t value);
// out [n] = x rounded to bf16 (foundry::bf16 bits, as convert_to_bf16).
void convert_to_bf16(uint16_t* out, const float* x, int64_t n);
// fractions [e] = counts / total, in double.
void fractions_of_counts(double* fractions, const int64_t* counts, int64_t e, int64_t total);
// out [N, C] = (x + beta) ⊙ alpha (ops::scale_shift_forward); its backward is residual
// scaling's with the second term's outputs discarded (cuda_backend.cpp).
void scale_shift_forward(float* out, const float* x, const float* alpha, const float* beta,
                         int64_t n, int64_t c);

// ---- embedding: out [N, C] = wte[tokens[n], :] ----
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t n, int64_t c);
// dwte [V, C] += dout's rows by token, each row of dwte summing its positions in order (the
// CPU's order, so the same bits): positions are sorted by token (a stable radix sort), then
// each run of one token is summed by one block.
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t n,
                        int64_t c, int64_t v, Workspace& workspace);

// ---- RMSNorm: out = in·rstd·weight; rstd [N] written ----
void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t n,
                     int64_t c, float eps);
// din [N, C] +=, dweight [C] +=. `scratch` holds rmsnorm_backward_scratch(n, c) floats.
void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in,
                      const float* weight, const float* rstd, int64_t n, int64_t c,
                      float* scratch);
// The same writing din = residual_scale ⊙ residual + the norm's gradient.
void rmsnorm_backward_residual(float* din, float* dweight, const float* dout, const float* in,
                               const float* weight, const float* rstd, const float* residual,
                               const float* residual_scale, int64_t n, int64_t c,
                               float* scratch);
int64_t rmsnorm_backward_scratch(int64_t n, int64_t c);

// ---- RoPE on x [B, T, H, D] in place (rotate-half pairs of the first rotary_dim dims);
// angles in double, as on the CPU.
void rope_apply(float* x, int64_t b, int64_t t, int64_t h, int64_t d, int64_t rotary_dim,
                int64_t pos_offset, double theta, bool inverse);
// x [rows, h, d] forward, row r at position pos[r] (device): the bits of rope_apply per row.
void rope_apply_rows(float* x, const int64_t* pos, int64_t rows, int64_t h, int64_t d,
                     int64_t rotary_dim, double theta);

// ---- SwiGLU: h [N, 2F] = gate | up; out [N, F] = silu(gate)·up (writes) ----
void swiglu_forward(float* out, const float* h, int64_t n, int64_t f);
void swiglu_backward(float* dh, const float* dout, const float* h, int64_t n, int64_t f);
// The same rounded once to bf16 (foundry::bf16 bits, round to nearest even as float_to_bf16).
void swiglu_forward_bf16(uint16_t* out, const float* h, int64_t n, int64_t f);
void swiglu_backward_bf16(uint16_t* dh, const float* dout, const float* h, int64_t n, int64_t f);

// ---- router: softmax over E experts, top-k by repeated arg-max (ties: lower id), optional
// renormalization of the chosen weights (writes probs [N, E], topk_idx [N, K], topk_w [N, K]).
void router_forward(float* probs, int32_t* topk_idx, float* topk_w, const float* logits,
                    int64_t n, int64_t e, int64_t k, bool renormalize);

// The softmax router's backward (ops::router_backward): dlogits [N, E] (writes). `fractions`
// (device, E doubles) are the f_e of the auxiliary loss; ignored when aux_coef is 0.
void router_backward(float* dlogits, const float* dtopk_w, const float* probs,
                     const int32_t* topk_idx, const float* topk_w, int64_t n, int64_t e,
                     int64_t k, bool renormalize, float aux_coef, const double* fractions);
// fractions [E] (device) = each expert's share of the N·K assignments, from a dispatch plan's
// expert_offsets.
void expert_fractions(double* fractions, const int64_t* expert_offsets, int64_t e,
                      int64_t assignments);
// *aux (device) = E · Σ_e f_e · mean over rows of probs[:, e], the column sums in double over
// fixed chunks of rows summed in order. `scratch` holds router_aux_scratch(n, e) doubles.
void router_aux_loss(double* aux, const float* probs, const double* fractions, int64_t n,
                     int64_t e, double* scratch);
int64_t router_aux_scratch(int64_t n, int64_t e);

// ---- the dispatch plan (ops::moe_dispatch_plan's arrays, all on the device): a stable radix
// sort of the assignments by expert. expert_offsets [E+1] is what the host copies back to size
// the experts' GEMMs: the one synchronization routing needs.
void moe_dispatch_plan(int64_t* expert_offsets, int32_t* slot_token, int32_t* assignment_slot,
                       const int32_t* topk_idx, int64_t n, int64_t e, int64_t k,
                       Workspace& workspace);

// ---- MoE gather / combine over a dispatch plan (ops::moe_dispatch_plan's arrays) ----
void moe_gather(float* xs, const float* x, const int32_t* slot_token, int64_t rows, int64_t c);
void moe_combine(float* out, const float* ys, const float* topk_w,
                 const int32_t* assignment_slot, int64_t n, int64_t k, int64_t c);
void moe_combine_backward(float* dys, float* dtopk_w, const float* dout, const float* ys,
                          const float* topk_w, const int32_t* assignment_slot, int64_t n,
                          int64_t k, int64_t c);
void moe_gather_backward(float* dx, const float* dxs, const int32_t* assignment_slot, int64_t n,
                         int64_t k, int64_t c);

// ---- cross-entropy over a padded vocabulary: logits [N, Vp], columns < V real. Writes
// losses [N], *mean_loss (one double: the mean over rows, summed in row order), and, when
// dlogits is not null, dlogits [N, Vp] = (softmax − onehot)·grad_scale, 0 in padded columns
// (dlogits may alias logits).
void cross_entropy(float* dlogits, float* losses, double* mean_loss, const float* logits,
                   const int32_t* targets, int64_t n, int64_t v, int64_t vp, float grad_scale);
// The same with dlogits in bf16 (foundry::bf16 bits), rows ld elements apart; in place of the
// logits when dlogits == logits and ld = 2·vp (ops::cross_entropy's bf16 form).
void cross_entropy_bf16(uint16_t* dlogits, int64_t ld, float* losses, double* mean_loss,
                        const float* logits, const int32_t* targets, int64_t n, int64_t v,
                        int64_t vp, float grad_scale);

// ---- causal grouped-query attention (kernels/attention.h's layout and contract) ----
// q [B, T, H, D], k/v [B, T, KVH, D], out [B, T, H, D]; lse [B, H, T] of the scaled scores.
// Tiled with an online softmax in fp32 (memory linear in T). D ≤ 256.
//
// With q_rows > 0, a chunk of the queries (kernels/attention.h's AttentionChunk, context
// parallelism): q, out, dq, dout [B, q_rows, H, D] and lse [B, H, q_rows], of which rows
// [q_begin, q_end) are computed, at key positions q_pos, q_pos + 1, …, against the T rows of
// k and v; the backward ADDS to dk and dv. Keys past the chunk's last position (q_pos +
// q_end − q_begin) are neither read nor written.
struct AttentionDims {
  int64_t b, t, h, kvh, d;
  int64_t q_rows = 0, q_begin = 0, q_end = 0, q_pos = 0;
};
// The query rows of a call as the kernels walk them (checked: the chunk lies within its
// tensors and sees only keys that exist): row r of [q_begin, q_end) of tq sees keys
// 0 … r + shift.
struct AttentionRows {
  int64_t tq, q_begin, q_end, shift;
  bool accumulate;
};
AttentionRows attention_rows(const AttentionDims& s);
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionDims& s);
// dq, dk, dv (writes) from dout, out and lse. Deterministic: dQ by query tile, dK and dV by
// key tile summing the group's query heads in order; no atomics. `scratch` holds
// attention_backward_scratch(s) floats.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        const AttentionDims& s, float* scratch);
int64_t attention_backward_scratch(const AttentionDims& s);

// The same contract with bf16 matmul inputs on tensor cores (attention_tc.cu), as the CPU's
// DType::bf16 attention: q, k, v, dO, P and dS rounded to bf16 as tiles are loaded or formed,
// products accumulated and the softmax kept in fp32; inputs and outputs stay fp32. Blocks of
// 64 query rows (4 warps of 16) against tiles of 64 keys; deterministic like the fp32 kernels.
// For D in {32, 64, 128} with 16-byte-aligned tensors: attention_on_tensor_cores says whether a
// call qualifies (the backend falls back to the fp32 kernels otherwise).
bool attention_on_tensor_cores(const AttentionDims& s, const void* q, const void* k,
                               const void* v, const void* out);
void attention_forward_bf16(float* out, float* lse, const float* q, const float* k,
                            const float* v, const AttentionDims& s);
// `scratch` holds attention_backward_scratch(s) floats.
void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout,
                             const float* out, const float* lse, const float* q, const float* k,
                             const float* v, const AttentionDims& s, float* scratch);
// delta [B, H, T] = rowsum(dO ∘ O), the first pass of both backwards.
void attention_delta(float* delta, const float* dout, const float* out, const AttentionDims& s);

}  // namespace foundry::gpu::ops
