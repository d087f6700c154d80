// The model's operations, forward and backward, as free functions on raw pointers.
//
// Conventions:
// - N = B*T tokens, row-major activations [N, C]. Shapes are given in every comment.
// - Backward functions ACCUMULATE (+=) into parameter gradients and into input gradients
//   unless the comment says "writes". Gradients are zeroed once per step by the caller.
// - Every function is templated on the element type and instantiated for float and double:
//   float is what training runs; double exists so tests can check backward passes
//   against finite differences without cancellation error.
// - Deterministic: no atomics; reductions over tokens use a fixed chunking independent of
//   the thread count, so the same inputs give bitwise-identical outputs.
#pragma once
#include <cstdint>
#include <vector>

#include "base/bf16.h"

namespace foundry::ops {

// ---- embedding -------------------------------------------------------------------------
// out [N, C] = wte[tokens[n], :]; wte [V, C].
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t n, int64_t c);
// dwte [V, C] += scatter of dout [N, C] by tokens (deterministic order).
template <typename T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int64_t n, int64_t c,
                        int64_t v);

// ---- RMSNorm ---------------------------------------------------------------------------
// out [N, C] = in / rms(in) * weight; rstd [N] saved for backward (writes).
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* in, const T* weight, int64_t n, int64_t c,
                     T eps);
// din [N, C] +=, dweight [C] +=.
template <typename T>
void rmsnorm_backward(T* din, T* dweight, const T* dout, const T* in, const T* weight,
                      const T* rstd, int64_t n, int64_t c);
// The same with the residual stream's other gradient folded in (ZAYA1's residual scaling):
// din [N, C] (writes) = residual_scale [C] ⊙ residual [N, C] + the norm's input gradient.
template <typename T>
void rmsnorm_backward_residual(T* din, T* dweight, const T* dout, const T* in, const T* weight,
                               const T* rstd, const T* residual, const T* residual_scale,
                               int64_t n, int64_t c);

// ---- RoPE (rotate-half pairing, as Hugging Face Llama/Mixtral) --------------------------
// Rotates x [B, T, H, D] in place; only the first `rotary_dim` (even, ≤ D) dims of each head
// rotate: pair (i, i + rotary_dim/2). Position of row t is pos_offset + t.
// inverse = true rotates by the negative angle (that is the backward pass: dx = R^T dy).
template <typename T>
void rope_apply(T* x, int64_t b, int64_t t, int64_t h, int64_t d, int64_t rotary_dim,
                int64_t pos_offset, double theta, bool inverse);
// Rotates x [rows, H, D] in place, row r at position pos[r] (decode rows, each at its own
// place in its sequence); the same values as rope_apply at that position.
template <typename T>
void rope_apply_rows(T* x, const int64_t* pos, int64_t rows, int64_t h, int64_t d,
                     int64_t rotary_dim, double theta);

// ---- SwiGLU ----------------------------------------------------------------------------
// h [N, 2F] holds gate = h[:, :F] and up = h[:, F:]; out [N, F] = silu(gate) * up (writes).
template <typename T>
void swiglu_forward(T* out, const T* h, int64_t n, int64_t f);
// dh [N, 2F] (writes) from dout [N, F].
template <typename T>
void swiglu_backward(T* dh, const T* dout, const T* h, int64_t n, int64_t f);
// The same, rounded once to bf16 (the next GEMM's input): the fp32 results never go to
// memory. Bitwise equal to the fp32 kernels followed by a bf16 conversion.
void swiglu_forward_bf16(bf16* out, const float* h, int64_t n, int64_t f);
void swiglu_backward_bf16(bf16* dh, const float* dout, const float* h, int64_t n, int64_t f);

// ---- router: softmax over experts, top-k, renormalization, auxiliary loss ---------------
// probs [N, E] = softmax(logits) (writes); topk_idx [N, K] expert ids in descending
// probability (ties: lower id first); topk_w [N, K] = the top-k probabilities, divided by
// their sum when `renormalize`.
template <typename T>
void router_forward(T* probs, int32_t* topk_idx, T* topk_w, const T* logits, int64_t n,
                    int64_t e, int64_t k, bool renormalize);
// Switch/Mixtral load-balancing loss: aux = E * sum_e f_e * P_e, f_e = share of the N*K
// assignments that went to e, P_e = mean over tokens of probs[:, e]. Returns aux.
// `fractions` (E values), when given, replaces the f_e of these rows: data parallelism
// passes the shares over the global batch, so that the mean of the ranks' losses (and
// gradients) is the global batch's (see Model::set_data_parallel).
template <typename T>
T router_aux_loss(const T* probs, const int32_t* topk_idx, int64_t n, int64_t e, int64_t k,
                  const double* fractions = nullptr);
// Assignments per expert [E] from topk_idx [N, K].
std::vector<int64_t> expert_counts(const int32_t* topk_idx, int64_t n, int64_t e, int64_t k);
// dlogits [N, E] (writes) from dtopk_w [N, K] and the aux loss's weight in the total loss
// (aux_coef; f_e, or `fractions` when given, is treated as a constant, as in the reference
// implementations).
template <typename T>
void router_backward(T* dlogits, const T* dtopk_w, const T* probs, const int32_t* topk_idx,
                     const T* topk_w, int64_t n, int64_t e, int64_t k, bool renormalize,
                     T aux_coef, const double* fractions = nullptr);

// ---- MoE dispatch / combine (dropless, tokens sorted by expert) --------------------------
// From topk_idx [N, K]: expert_offsets [E+1] (rows of expert e are
// [offsets[e], offsets[e+1]) in the sorted order), slot_token [N*K] (token of each sorted
// row) and assignment_slot [N*K] (sorted row of assignment n*K + j). Stable: within an
// expert, rows follow token order.
void moe_dispatch_plan(int64_t* expert_offsets, int32_t* slot_token, int32_t* assignment_slot,
                       const int32_t* topk_idx, int64_t n, int64_t e, int64_t k);
// xs [N*K, C] = x[slot_token[s], :] (writes).
template <typename T>
void moe_gather(T* xs, const T* x, const int32_t* slot_token, int64_t rows, int64_t c);
// out [N, C] += sum_j topk_w[n, j] * ys[assignment_slot[n*K + j], :] (fixed j order).
template <typename T>
void moe_combine(T* out, const T* ys, const T* topk_w, const int32_t* assignment_slot,
                 int64_t n, int64_t k, int64_t c);
// Backward of combine: dys [N*K, C] (writes) = topk_w * dout rows; dtopk_w [N, K] (writes)
// = <dout[n], ys[slot]>.
template <typename T>
void moe_combine_backward(T* dys, T* dtopk_w, const T* dout, const T* ys, const T* topk_w,
                          const int32_t* assignment_slot, int64_t n, int64_t k, int64_t c);
// Backward of gather: dx [N, C] += sum over the rows s with slot_token[s] = n of dxs[s]
// (deterministic order).
template <typename T>
void moe_gather_backward(T* dx, const T* dxs, const int32_t* assignment_slot, int64_t n,
                         int64_t k, int64_t c);

// ---- cross-entropy over a padded vocabulary ---------------------------------------------
// logits [N, Vp]; only columns < V are real (padded columns get no probability mass).
// Returns the mean loss over the N rows, writes per-row losses [N]. When `dlogits` is not
// null, writes dlogits [N, Vp] = (softmax - onehot) * grad_scale (0 in padded columns);
// dlogits may alias logits.
template <typename T>
double cross_entropy(T* dlogits, T* losses, const T* logits, const int32_t* targets, int64_t n,
                     int64_t v, int64_t vp, T grad_scale);
// The same with dlogits written as bf16 (the float values above, rounded), row i at
// dlogits + i·ld: the input of the LM head's backward GEMMs in bf16 training, without a float
// copy in between. In place: dlogits = (bf16*)logits with ld = 2·Vp puts each row's gradient
// in the first half of its own float row.
double cross_entropy(bf16* dlogits, int64_t ld, float* losses, const float* logits,
                     const int32_t* targets, int64_t n, int64_t v, int64_t vp, float grad_scale);

}  // namespace foundry::ops
