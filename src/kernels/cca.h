// Compressed Convolutional Attention (CCA, grouped variant): the operations specific to it,
// forward and backward, as free functions on raw pointers (the conventions of kernels/ops.h:
// shapes in every comment; backward ACCUMULATES (+=) into parameter and input gradients
// unless the comment says "writes"; templated on float and double; reductions over tokens
// use a fixed order independent of the thread count, no atomics). Outputs never alias inputs
// unless the comment says "in place".
//
// Names: B sequences of T tokens, N = B·T rows; Hq query heads, Hk KV heads, g = Hq/Hk;
// head dim d; G = Hq + Hk convolution groups; C = G·d packed channels; t0, t1 the kernel
// sizes of the depthwise and the grouped convolution; half = Hk·d/2.
//
// ---- Layouts -------------------------------------------------------------------------------
// Packed channels  c [B, T, C] = [q0 ‖ k0]: columns [0, Hq·d) are q0 (head h at h·d), columns
//                  [Hq·d, C) are k0 (KV head j at Hq·d + j·d). The convolutions' outputs and
//                  the pre-norm [q ‖ k] use the same packing.
// Depthwise conv   w0 [C, t0], b0 [C]: w0[ch·t0 + i] multiplies c at position t − (t0−1) + i
//                  (tap t0−1 is the current token). Same memory as PyTorch
//                  Conv1d(C, C, t0, groups=C).weight [C, 1, t0].
// Grouped conv     w1 [G·d, d, t1], b1 [G·d]: w1[((grp·d + o)·d + ci)·t1 + i] maps input
//                  channel ci of group grp at position t − (t1−1) + i to output channel o of
//                  the same group. Same memory as PyTorch Conv1d(C, C, t1, groups=G).weight.
// Temperature      temp [Hk], one per KV head.
// Parameter counts: see CcaDims below; for ZAYA1 (Hq 8, Hk 2, d 128, t0 = t1 = 2) the four
// convolution tensors hold 2,560 + 1,280 + 327,680 + 1,280 = 332,800 elements.
//
// Both convolutions are causal inside each sequence: position t reads positions t − (t0−1) … t
// (then t − (t1−1) … t of the first convolution's output), never a later position and never a
// row of another sequence. Together, for t0 = t1 = 2, position t sees tokens t, t−1 and t−2.
// The pair is padded as one (spec §2 step 3): c gets (t0−1)+(t1−1) zero rows before each
// sequence and both convolutions run unpadded over it, so the depthwise output before
// position 0 is the depthwise convolution of zeros, its bias b0, and the grouped convolution's
// first t1−1 positions read b0 there (the `before` argument below), as the released ZAYA1
// code does. Padding tokens must be zeroed in c (and x) by the caller so they do not leak
// into later positions.
//
// ---- How a model composes one CCA sublayer from these kernels and its GEMMs ----------------
// Parameters: Wq [Hq·d, E], Wk [Hk·d, E], Wv1 [half, E], Wv2 [half, E], w0, b0, w1, b1, temp,
// Wo [E, Hq·d]. "GEMM" is the model's matmul; everything else is a call below or in ops.h.
//
// Forward (x [N, E] = RMSNorm(res)):
//   c  [N, C]: q0 = x·Wq^T into columns [0, Hq·d), k0 = x·Wk^T into [Hq·d, C)  GEMMs (ld = C)
//   cca_depthwise_conv_forward(y, c, w0, b0, B, T, C, t0)          y [N, C]; keep c, y
//   cca_grouped_conv_forward(qk, y, w1, b1, b0, B, T, G, d, t1)    qk [N, C] (writes)
//   cca_means_forward(qk, c, N, Hq, Hk, d)                         qk += [mq ‖ mk]; keep qk
//   cca_qk_norm_forward(q, k, rnorm, qk, temp, N, Hq, Hk, d, eps)  q [N, Hq·d], k [N, Hk·d]
//   rope_apply(q, B, T, Hq, d, d/2, …); rope_apply(k, B, T, Hk, d, d/2, …)   (ops.h)
//   v  [N, Hk·d]: x·Wv1^T into columns [0, half), x·Wv2^T into [half, 2·half)
//                                                                     GEMMs (ld = 2·half)
//   cca_value_shift_inplace_forward(v, nullptr, B, T, half)
//   attention_forward(o, lse, q, k, v, {B, T, Hq, Hk, d}, dtype)  (attention.h), then Wo.
//
// Backward (dc, dqk, dy zeroed first):
//   attention_backward → dq, dk, dv (writes)
//   cca_value_shift_inplace_backward(dv, B, T, half)   dv now holds the gradients of the two
//                                                      unshifted projections → dWv1, dWv2, dx
//   rope_apply(dq, …, inverse = true); rope_apply(dk, …, inverse = true)
//   cca_qk_norm_backward(dqk, dtemp, dq, dk, qk, rnorm, temp, N, Hq, Hk, d)
//   cca_means_backward(dc, dqk, N, Hq, Hk, d)
//   cca_grouped_conv_backward(dy, dw1, db1, db0, dqk, y, w1, b0, B, T, G, d, t1)
//   cca_depthwise_conv_backward(dc, dw0, db0, dy, c, w0, B, T, C, t0)
//   dWq += dc[:, :Hq·d]^T·x, dWk += dc[:, Hq·d:]^T·x, dx += dc·[Wq; Wk]          GEMMs
//
// A training step runs the same composition in fewer passes over [N, C], and in bf16 with
// t1 ≤ 2 in blocks of rows that stay in cache: cca_convs_qk_norm_forward_gemm (both
// convolutions, the grouped bias, the means and the norm) and cca_qk_norm_convs_backward_gemm
// (the norm's and the means' gradients, then both convolutions'). They give the same bits as
// the compositions they name wherever oneDNN's products give a row the same bits whatever the
// number of rows in the product (blocks have 128 or 129, the compositions B·T): cca_test checks
// it on the machine it runs on.
//
// The value shift: v = [x_t·Wv1^T ‖ x_{t−1}·Wv2^T] (x_{−1} = 0). Shifting the half-width
// projection (half = Hk·d/2 channels, 128 for ZAYA1) is cheaper than shifting x (E channels,
// 2048) and needs no second copy of x; the GEMM cost is the same either way (the last token's
// x·Wv2 of each sequence is computed and dropped). With Hk = 2, head 0 of v is the current
// token's and head 1 the previous token's.
//
// Decode (one new token per row, see decode_state_floats): a sequence's state holds the last
// t0−1 packed c rows (the depthwise conv's window), the last t1−1 depthwise outputs y less
// their bias b0 (the grouped conv's window; equivalent to the spec's "last two packed c
// columns", from which y_{t−1} would have to be recomputed; without the bias so that a zero
// state reads b0 before position 0), and the previous token's x·Wv2. Per token:
//   c_new [B, C] = [x·Wq^T ‖ x·Wk^T]
//   cca_conv_decode(qk, dims, states, B, c_new, w0, b0, w1, b1)  qk [B, C] (writes)
//   cca_means_forward(qk, c_new, B, Hq, Hk, d); cca_qk_norm_forward(q, k, rnorm, qk, temp, B, …)
//   v [B, 2·half] = [x·Wv1^T ‖ x·Wv2^T]; cca_value_shift_decode(v, dims, states, B)
// After a full-sequence forward over a prompt, cca_decode_state_load fills the state from its
// c, y, b0 and the projections cca_value_shift_inplace_forward dropped (last_out). RoPE for the
// new token runs at its position, and its k and v rows join the model's KV cache.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/gemm.h"

namespace foundry::ops {

// The shape of one CCA sublayer's latent, and the sizes of its convolution parameters in the
// layouts above.
struct CcaDims {
  int64_t hq = 0;  // query heads
  int64_t hk = 0;  // KV heads; hq is a multiple of hk
  int64_t d = 0;   // head dim; hk·d is even
  int64_t t0 = 2;  // depthwise kernel size (≥ 1)
  int64_t t1 = 2;  // grouped kernel size (≥ 1)

  int64_t groups() const { return hq + hk; }            // G
  int64_t channels() const { return (hq + hk) * d; }    // C
  int64_t value_half() const { return hk * d / 2; }     // half
  int64_t depthwise_weight_size() const { return channels() * t0; }    // w0 [C, t0]
  int64_t depthwise_bias_size() const { return channels(); }           // b0 [C]
  int64_t grouped_weight_size() const { return channels() * d * t1; }  // w1 [G·d, d, t1]
  int64_t grouped_bias_size() const { return channels(); }             // b1 [G·d]
  int64_t temperature_size() const { return hk; }                      // temp [Hk]
  int64_t conv_parameter_count() const {
    return depthwise_weight_size() + depthwise_bias_size() + grouped_weight_size() +
           grouped_bias_size();
  }
  // Throws Error naming the offending field when the shape is unusable.
  void validate() const;
};

// ---- q–k means (spec §2 step 2; they bypass the convolutions) ------------------------------
// From c [N, C] = [q0 ‖ k0]: mq[h] = (q0[h] + k0[h/g]) / 2 [N, Hq·d] and
// mk[j] = mean over the g query heads h of group j of mq[h] [N, Hk·d].
// qk [N, C] += [mq ‖ mk] (adds onto the grouped conv's output: step 4 of the spec).
template <typename T>
void cca_means_forward(T* qk, const T* c, int64_t n, int64_t hq, int64_t hk, int64_t d);
// dc [N, C] += the gradient through the means of dqk [N, C] (the gradient of qk):
//   dq0[h] += dmq[h]/2 + dmk[h/g]/(2g),  dk0[j] += Σ_{h of group j} dmq[h]/2 + dmk[j]/2.
template <typename T>
void cca_means_backward(T* dc, const T* dqk, int64_t n, int64_t hq, int64_t hk, int64_t d);

// ---- causal depthwise convolution over time ------------------------------------------------
// y [B, T, C] (writes) = b0[ch] + Σ_{i<t0} w0[ch, i] · c[b, t − (t0−1) + i, ch], c [B, T, C],
// w0 [C, t0], b0 [C]; positions before 0 are zero.
template <typename T>
void cca_depthwise_conv_forward(T* y, const T* c, const T* w0, const T* b0, int64_t b,
                                int64_t t, int64_t channels, int64_t taps);
// From dy [B, T, C]: dc [B, T, C] +=, dw0 [C, t0] +=, db0 [C] +=.
template <typename T>
void cca_depthwise_conv_backward(T* dc, T* dw0, T* db0, const T* dy, const T* c, const T* w0,
                                 int64_t b, int64_t t, int64_t channels, int64_t taps);

namespace detail {
// w0 [C, t0] tap-major, wt [t0, C], so that the channel loop reads the weights contiguously.
template <typename T>
inline void cca_depthwise_taps_major(T* wt, const T* w0, int64_t channels, int64_t taps) {
  for (int64_t ch = 0; ch < channels; ++ch)
    for (int64_t i = 0; i < taps; ++i) wt[i * channels + ch] = w0[ch * taps + i];
}
// Row r of one sequence's depthwise output, y [C] (writes), from the sequence's rows c_seq
// and the tap-major weights wt: every form of the forward computes a row so.
template <typename T>
inline void cca_depthwise_row(T* y, const T* c_seq, const T* wt, const T* b0, int64_t r,
                              int64_t channels, int64_t taps) {
  for (int64_t ch = 0; ch < channels; ++ch) y[ch] = b0[ch];
  for (int64_t i = 0; i < taps; ++i) {
    const int64_t src = r - (taps - 1) + i;
    if (src < 0) continue;
    const T* in = c_seq + src * channels;
    const T* w = wt + i * channels;
#pragma omp simd
    for (int64_t ch = 0; ch < channels; ++ch) y[ch] += w[ch] * in[ch];
  }
}
// Row `row` of a group-major array [G, rows, d] (the grouped products' output) into out [G·d],
// plus bias [G·d] unless null.
inline void cca_group_row(float* out, const float* group_major, const float* bias, int64_t row,
                          int64_t groups, int64_t rows, int64_t d) {
  for (int64_t g = 0; g < groups; ++g) {
    const float* from = group_major + (g * rows + row) * d;
    float* to = out + g * d;
    if (bias) {
      const float* b = bias + g * d;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) to[j] = b[j] + from[j];
    } else {
      for (int64_t j = 0; j < d; ++j) to[j] = from[j];
    }
  }
}
// Rows [row_begin, row_end) of cca_means_qk_norm_forward (below, with b1) serially, qk
// (written) taken from the grouped products' group-major output qk_groups [G, group_rows, d]
// of the rows from row_begin on (row r of group g at (g·group_rows + r − row_begin)·d): the
// same bits as spreading it into qk first. q, k, rnorm, qk and c are the whole arrays.
void cca_means_qk_norm_grouped_rows(float* q, float* k, float* rnorm, float* qk,
                                    const float* qk_groups, int64_t group_rows, const float* c,
                                    const float* b1, const float* temp, int64_t row_begin,
                                    int64_t row_end, int64_t hq, int64_t hk, int64_t d, float eps);

// The pieces of a training step's blocked backward (kernels/cca_gemm.cpp), each the same
// arithmetic as the whole-batch function it comes from.
// Rows per task of the depthwise backward (and per block of the blocked forms): tasks are
// (sequence, block of kCcaRowsPerBlock positions), in that order.
constexpr int64_t kCcaRowsPerBlock = 128;
// dtemp [Hk] += the rows' dτ, row_dtemp [n, Hk] (each row's own value), in the QK norm
// backward's fixed order: partial sums of 32 rows each, from zero row by row, then the
// partials added in row order.
template <typename T>
inline void cca_sum_row_dtemp(T* dtemp, const T* row_dtemp, int64_t n, int64_t hk) {
  constexpr int64_t kRowsPerChunk = 32;
  std::vector<T> partial(hk);
  for (int64_t r0 = 0; r0 < n; r0 += kRowsPerChunk) {
    std::fill(partial.begin(), partial.end(), T(0));
    for (int64_t row = r0; row < std::min(n, r0 + kRowsPerChunk); ++row)
      for (int64_t j = 0; j < hk; ++j) partial[j] += row_dtemp[row * hk + j];
    for (int64_t j = 0; j < hk; ++j) dtemp[j] += partial[j];
  }
}
// Row `row` of cca_qk_norm_means_backward: dqk_row [C] and (unless null) dc_row [C] written,
// each key head's dτ added to dtemp_part [Hk]. dq, dk, qk, rnorm: the whole arrays.
void cca_qk_norm_means_backward_row(float* dqk_row, float* dc_row, float* dtemp_part,
                                    const float* dq, const float* dk, const float* qk,
                                    const float* rnorm, const float* temp, int64_t row, int64_t hq,
                                    int64_t hk, int64_t d);
// One task of cca_depthwise_conv_backward_grouped: rows [r0, r1) of sequence bi (of t rows),
// dc's rows +=, the task's partial sums [t0 + 1, C] written to `partial` (per tap, then the
// bias). dy_groups [G, group_rows, d] holds dy from row first_row on (every row the task
// reads: its own and the t0 − 1 after them within the sequence); wt: w0 tap-major.
void cca_depthwise_backward_rows_grouped(float* dc, float* partial, const float* dy_groups,
                                         int64_t group_rows, int64_t first_row, const float* c,
                                         const float* wt, int64_t bi, int64_t t, int64_t r0,
                                         int64_t r1, int64_t groups, int64_t d, int64_t taps);
// The tasks' partials [tasks][t0 + 1, C] added in task order: dw0 [C, t0] +=, db0 [C] +=.
void cca_depthwise_backward_sums(float* dw0, float* db0, const float* partials, int64_t tasks,
                                 int64_t channels, int64_t taps);
}  // namespace detail

// ---- causal grouped convolution over time (each group's d channels fully mixed) ------------
// z [B, T, G·d] (writes) = b1[grp, o]
//   + Σ_{i<t1} Σ_{ci<d} w1[grp, o, ci, i] · y[b, t − (t1−1) + i, grp, ci],
// y [B, T, G·d], w1 [G·d, d, t1], b1 [G·d]; y before position 0 is `before` [G·d] (the CCA
// passes b0: the depthwise output of the pair's zero padding), zero where it is null.
// Per tap this is a small [rows, d] × [d, d] product per group, run as register-blocked tiles.
template <typename T>
void cca_grouped_conv_forward(T* z, const T* y, const T* w1, const T* b1, const T* before,
                              int64_t b, int64_t t, int64_t groups, int64_t d, int64_t taps);
// From dz [B, T, G·d]: dy [B, T, G·d] +=, dw1 [G·d, d, t1] +=, db1 [G·d] +=, and (unless null)
// dbefore [G·d] += the gradient of `before` (cca_grouped_conv_before_backward).
template <typename T>
void cca_grouped_conv_backward(T* dy, T* dw1, T* db1, T* dbefore, const T* dz, const T* y,
                               const T* w1, const T* before, int64_t b, int64_t t, int64_t groups,
                               int64_t d, int64_t taps);
// The gradient of `before`, from the rows that read it (positions 0 … P−1, P = min(T, t1−1)):
//   dbefore[grp, ci] += Σ_{p<P} Σ_{i < t1−1−p} Σ_o w1[grp, o, ci, i] · Σ_b dz[b, p, grp, o],
// the sums over the sequences first (in order, from zero), then over p, i and o in that
// order: every form of the backward adds it so (before the depthwise backward adds its own
// part to db0). Sequence bi's row p of dz is at dz + (bi·stride + p)·G·d.
template <typename T>
void cca_grouped_conv_before_backward(T* dbefore, const T* dz, int64_t stride, const T* w1,
                                      int64_t b, int64_t t, int64_t groups, int64_t d,
                                      int64_t taps);

// cca_depthwise_conv_backward with dy group-major, dy_groups [G, B·T, d] (channel g·d + j of
// row r at (g·B·T + r)·d + j: the grouped products' dense output); the same bits.
void cca_depthwise_conv_backward_grouped(float* dc, float* dw0, float* db0,
                                         const float* dy_groups, const float* c,
                                         const float* w0, int64_t b, int64_t t, int64_t groups,
                                         int64_t d, int64_t taps);

// The same two as oneDNN matmuls on float activations (kernels/cca_gemm.cpp), the form the
// model runs in both precisions: one product per group with the taps stacked in K (`before`
// stacked where a tap falls before position 0). `dtype` is the GEMMs' input type (bf16: y,
// before, dz and w1 rounded to bf16, fp32 accumulation), as for the model's other GEMMs. fp32
// agrees with the reference above to rounding. Unlike the reference: b1 may be null (no bias),
// and dy is WRITTEN (dw1, db1, dbefore +=).
void cca_grouped_conv_forward_gemm(float* z, const float* y, const float* w1, const float* b1,
                                   const float* before, int64_t b, int64_t t, int64_t groups,
                                   int64_t d, int64_t taps, DType dtype);
void cca_grouped_conv_backward_gemm(float* dy, float* dw1, float* db1, float* dbefore,
                                    const float* dz, const float* y, const float* w1,
                                    const float* before, int64_t b, int64_t t, int64_t groups,
                                    int64_t d, int64_t taps, DType dtype);

// A training step's two convolutions, qk = grouped(depthwise(c)) without the grouped bias
// (the fused norm adds it), for bf16 GEMMs when cca_convs_fused(t1, dtype) (t1 ≤ 2): the
// depthwise output goes straight into the grouped convolution's stacked bf16 rows, kept in
// `kept` ([B·T·C] floats of room, which the stacked rows fit for t1 ≤ 2) for the backward in
// place of y, which never reaches memory. The same numbers as the composition of
// cca_depthwise_conv_forward and the _gemm forms above with before = b0 (the same bits:
// cca_test).
// Backward: dc += and the weights' gradients += as the composition; dy [B·T, C]: scratch
// (left unused: dy stays in the grouped products' own output).
bool cca_convs_fused(int64_t t1, DType dtype);
void cca_convs_forward_gemm(float* qk, float* kept, const float* c, const float* w0,
                            const float* b0, const float* w1, int64_t b, int64_t t,
                            int64_t groups, int64_t d, int64_t t0, int64_t t1);
// cca_convs_forward_gemm, then cca_means_qk_norm_forward (b1, the means, the QK norm) read
// from the grouped products' output, which never reaches qk unnormalized, in blocks of rows
// (each sequence's positions in runs of kCcaRowsPerBlock, a task each): the same bits as the
// two (see the top of this file). groups = hq + hk.
void cca_convs_qk_norm_forward_gemm(float* q, float* k, float* rnorm, float* qk, float* kept,
                                    const float* c, const float* w0, const float* b0,
                                    const float* w1, const float* b1, const float* temp, int64_t b,
                                    int64_t t, int64_t hq, int64_t hk, int64_t d, int64_t t0,
                                    int64_t t1, float eps);
void cca_convs_backward_gemm(float* dc, float* dw0, float* db0, float* dw1, float* db1, float* dy,
                             const float* dqk, const float* kept, const float* c, const float* w0,
                             const float* w1, int64_t b, int64_t t, int64_t groups, int64_t d,
                             int64_t t0, int64_t t1);
// cca_qk_norm_means_backward (dc written, dtemp +=) and then cca_convs_backward_gemm, in one
// pass of blocks of rows (each sequence's positions in runs of kCcaRowsPerBlock, a task each):
// a block's dqk, its stacked rows and dy stay in cache and dqk never reaches memory (only dqk
// in bf16, for dW, in `scratch`). The same bits as the two (see the top of this file).
// groups = hq + hk; scratch: [B·T·C] floats.
void cca_qk_norm_convs_backward_gemm(float* dc, float* dtemp, float* dw0, float* db0, float* dw1,
                                     float* db1, float* scratch, const float* dq, const float* dk,
                                     const float* qk, const float* rnorm, const float* temp,
                                     const float* kept, const float* c, const float* w0,
                                     const float* w1, int64_t b, int64_t t, int64_t hq, int64_t hk,
                                     int64_t d, int64_t t0, int64_t t1);

// ---- value time shift (spec §2 step 5) ------------------------------------------------------
// In place (the form to use): v [B, T, 2·half] holds [x_t·Wv1^T ‖ x_t·Wv2^T] on entry and
// [x_t·Wv1^T ‖ x_{t−1}·Wv2^T] on exit (zero second half at t = 0 of each sequence). When
// last_out is not null, last_out [B, half] (writes) receives the second half of each
// sequence's last row from before the shift (the x_{T−1}·Wv2^T the shift drops: the decode
// state after a prefill).
template <typename T>
void cca_value_shift_inplace_forward(T* v, T* last_out, int64_t b, int64_t t, int64_t half);
// In place: dv [B, T, 2·half] holds the gradient of the shifted v on entry and the gradient of
// the unshifted [x_t·Wv1^T ‖ x_t·Wv2^T] on exit (second half moved back one position; zero at
// the last position of each sequence).
template <typename T>
void cca_value_shift_inplace_backward(T* dv, int64_t b, int64_t t, int64_t half);
// Out of place: v [B, T, 2·half] (writes) = [vcur[b, t] ‖ vprev_in[b, t−1]] with
// vcur, vprev_in [B, T, half] (x·Wv1^T and x·Wv2^T at every position).
template <typename T>
void cca_value_shift_forward(T* v, const T* vcur, const T* vprev_in, int64_t b, int64_t t,
                             int64_t half);
// dvcur [B, T, half] +=, dvprev_in [B, T, half] += from dv [B, T, 2·half].
template <typename T>
void cca_value_shift_backward(T* dvcur, T* dvprev_in, const T* dv, int64_t b, int64_t t,
                              int64_t half);

// ---- QK L2-norm with a learned temperature per KV head (spec §2 step 6) ---------------------
// qk [N, C] = pre-norm [q ‖ k]; temp [Hk]. Writes:
//   q [N, Hq·d]:  q[h] = qk[h] · √d / ‖qk[h]‖
//   k [N, Hk·d]:  k[j] = qk[Hq + j] · √d / ‖qk[Hq + j]‖ · temp[j]
//   rnorm [N, G]: 1 / ‖·‖ of each head (queries first), saved for backward,
// with ‖x‖ = sqrt(Σ x² + eps). eps keeps an all-zero head (padding) finite; 1e-6 is a good
// choice: against a head of d = 128 unit-scale values it changes the norm by ~4e-9
// (relative).
template <typename T>
void cca_qk_norm_forward(T* q, T* k, T* rnorm, const T* qk, const T* temp, int64_t n,
                         int64_t hq, int64_t hk, int64_t d, T eps);
// From dq [N, Hq·d] and dk [N, Hk·d]: dqk [N, C] +=, dtemp [Hk] +=.
template <typename T>
void cca_qk_norm_backward(T* dqk, T* dtemp, const T* dq, const T* dk, const T* qk,
                          const T* rnorm, const T* temp, int64_t n, int64_t hq, int64_t hk,
                          int64_t d);

// ---- fused: the forms a training step runs (each bitwise the composition it names) ---------
// In one pass over the rows: with b1 [C] set, qk += b1 (the bias of a grouped conv run
// without it); then cca_means_forward(qk, c, …) and cca_qk_norm_forward(q, k, rnorm, qk, …).
template <typename T>
void cca_means_qk_norm_forward(T* q, T* k, T* rnorm, T* qk, const T* c, const T* b1,
                               const T* temp, int64_t n, int64_t hq, int64_t hk, int64_t d,
                               T eps);
// In one pass over the rows: dqk and dc [N, C] (writes) = cca_qk_norm_backward into a zeroed
// dqk, then cca_means_backward of it into a zeroed dc; dtemp [Hk] +=.
template <typename T>
void cca_qk_norm_means_backward(T* dqk, T* dc, T* dtemp, const T* dq, const T* dk, const T* qk,
                                const T* rnorm, const T* temp, int64_t n, int64_t hq, int64_t hk,
                                int64_t d);

// ---- decode: one new token per row ---------------------------------------------------------
// A sequence's decoding state in one block of decode_state_floats(dims) elements: c_hist
// [t0−1, C], the last t0−1 packed c rows, oldest first; y_hist [t1−1, C], the last t1−1
// depthwise outputs y less b0 (the taps' sums); v_prev [half], the previous token's x·Wv2^T.
// All zero before the first token (the pair's zero padding, whose depthwise output is b0, and
// x_{−1} = 0).
inline int64_t decode_state_floats(const CcaDims& dims) {
  return (dims.t0 - 1 + dims.t1 - 1) * dims.channels() + dims.value_half();
}
template <typename T>
T* decode_c_hist(T* state, const CcaDims&) { return state; }
template <typename T>
T* decode_y_hist(T* state, const CcaDims& dims) { return state + (dims.t0 - 1) * dims.channels(); }
template <typename T>
T* decode_v_prev(T* state, const CcaDims& dims) {
  return state + (dims.t0 - 1 + dims.t1 - 1) * dims.channels();
}

// B sequences' states, one block each (zero at construction), for tests and single steps.
template <typename T>
struct CcaDecodeState {
  CcaDims dims;
  int64_t batch = 0;
  std::vector<T> data;  // [B, decode_state_floats(dims)]

  CcaDecodeState() = default;
  CcaDecodeState(const CcaDims& dims, int64_t batch);  // validates dims; zero state
  T* sequence(int64_t b) { return data.data() + b * decode_state_floats(dims); }
  // Each sequence's block, in order: the `states` of a step that advances them all.
  std::vector<T*> rows();
};

// Loads the state after a full-sequence forward over T ≥ 0 prompt tokens per sequence:
// c, y [B, T, C] from cca_depthwise_conv_forward's input and output (with its b0 [C]),
// v_last [B, half] from cca_value_shift_inplace_forward's last_out (or the last row of
// vprev_in per sequence; null means zero, as for T = 0).
// With T smaller than a window, the missing older rows are the padding's (zero).
template <typename T>
void cca_decode_state_load(CcaDecodeState<T>& state, const T* c, const T* y, const T* b0,
                           const T* v_last, int64_t t);
// One token of each of `rows` rows, row r's sequence state at states[r]: qk [rows, C] (writes)
// = the grouped conv output at the row's position, exactly what cca_grouped_conv_forward gives
// at that position of the full sequence (up to rounding order), from c_new [rows, C]; w0, b0,
// w1, b1 as above. Advances each state by its row. Rows that share a state are successive
// tokens of one sequence, in position order: each continues the state the one before left.
template <typename T>
void cca_conv_decode(T* qk, const CcaDims& dims, T* const* states, int64_t rows, const T* c_new,
                     const T* w0, const T* b0, const T* w1, const T* b1);
// v [rows, 2·half]: [x_t·Wv1^T ‖ x_t·Wv2^T] on entry, [x_t·Wv1^T ‖ x_{t−1}·Wv2^T] on exit;
// keeps x_t·Wv2^T in the row's state (rows sharing a state as for cca_conv_decode).
template <typename T>
void cca_value_shift_decode(T* v, const CcaDims& dims, T* const* states, int64_t rows);

}  // namespace foundry::ops
