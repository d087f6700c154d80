// Where the model's arithmetic runs: one interface over the operations a training step needs,
// implemented by the CPU (CpuBackend, kernels/cpu_backend.h: oneDNN and the OpenMP kernels of
// ops.h, cca.h, zaya_router.h and attention.h) and by a GPU (cuda/cuda_backend.h). The model
// (src/model) calls these and never a device's kernels itself, so one sublayer's forward and
// backward read the same on every device.
//
// Every pointer is in the backend's memory (host memory for the CPU, device memory for a
// GPU), except where a name says host. The contracts are those of the CPU kernels named
// beside each group; results the host needs (the loss, the auxiliary loss, the class counts)
// are written to backend memory and read with to_host, so a GPU's step synchronizes only
// where the model asks for a value. Operations are queued in call order: a later call sees
// an earlier one's results.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "base/bf16.h"
#include "base/slab_range.h"
#include "base/timer.h"
#include "kernels/gemm.h"
#include "kernels/zaya_router.h"

namespace foundry {

namespace ops {
struct AttentionChunk;
struct AttentionShape;
struct CcaDims;
struct DecodeSpan;
}

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda:N".
  virtual const char* name() const = 0;
  // Whether the host may read and write this backend's memory directly.
  virtual bool host_memory() const = 0;
  // The clock of the op timers (base/timer.h) when the work does not run on the host (a
  // GPU's events); null: the host's wall clock.
  virtual OpClock* op_clock() { return nullptr; }

  // ---- memory --------------------------------------------------------------------------------
  // A zeroed block of `bytes` (> 0) in the backend's memory, 256-byte aligned, until release.
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* block) = 0;
  // ---- slabs: a device's parameter, gradient and bf16 slabs, of which an expert-parallel
  // rank stores only a part ---------------------------------------------------------------
  // What a slab's holes read as.
  enum class Released {
    zeros,    // zeros; nothing may write there (read-only where the device can enforce it)
    scratch,  // anything: writes are allowed and lost; nothing may rely on what it reads
  };
  // A zeroed block as allocate() gives (released by release()) whose address range is backed
  // in chunks (base/slab_chunks.h: a GPU's allocation granularity, pages on the CPU posing as
  // a device): the chunks wholly inside `byte_holes` (sorted, disjoint) take no memory of
  // their own and read as `holes_read`, and every address stays valid. A backend whose
  // memory cannot have holes backs them too.
  virtual void* allocate_slab(int64_t bytes, const ByteRanges& byte_holes = {},
                              Released holes_read = Released::zeros) {
    return allocate(bytes);
  }
  // Makes the chunks inside the byte ranges (sorted, disjoint) of a slab holes as
  // allocate_slab's, after the work queued so far; the bytes around them keep their memory and
  // values. Returns the bytes handed back (0 where the memory cannot have holes).
  virtual int64_t release_slab_ranges(void* slab, const ByteRanges& byte_ranges, Released reads) {
    return 0;
  }
  // The memory backing a slab of `bytes` now: its chunks and the chunks its holes read.
  virtual int64_t slab_memory_bytes(const void* slab, int64_t bytes) const { return bytes; }
  virtual void fill(float* x, int64_t n, float value) = 0;
  virtual void fill(int32_t* x, int64_t n, int32_t value) = 0;
  virtual void zero(void* x, int64_t bytes) = 0;
  virtual void copy(void* dst, const void* src, int64_t bytes) = 0;
  // `blocks` copies of `block_bytes` each, block i from src + i·src_stride to
  // dst + i·dst_stride (strides in bytes, at least block_bytes): one call where the device has
  // a strided copy (a GPU's cudaMemcpy2D), a copy per block otherwise.
  virtual void copy_blocks(void* dst, int64_t dst_stride, const void* src, int64_t src_stride,
                           int64_t block_bytes, int64_t blocks);
  // Between host memory and the backend's; to_host waits for the value.
  virtual void to_host(void* host, const void* src, int64_t bytes) = 0;
  virtual void from_host(void* dst, const void* host, int64_t bytes) = 0;
  // Host memory that copies from this backend's memory land in fastest, and beside its work
  // (page-locked on a GPU); until release_host. The CPU's: plain memory.
  virtual void* allocate_host(int64_t bytes);
  virtual void release_host(void* block);
  // Queues a copy to the host of what the work queued so far leaves at `src`, beside the work
  // queued after it; wait_host_copies() returns once every queued copy is done (any thread).
  // The CPU's copies at once.
  virtual void to_host_async(void* host, const void* src, int64_t bytes) {
    to_host(host, src, bytes);
  }
  virtual void wait_host_copies() {}
  // Copies to the host collected one by one as they land, for work that starts on each part
  // of a result while the rest is computed (a data-parallel reduction of the gradients during
  // backward). queue() queues a copy of what the work queued so far leaves at `src` into
  // `host` (from allocate_host) and returns its number: 0, 1, … since the queue was made or
  // restarted. landed(i) tells without waiting whether copies 0 … i are done, wait(i) waits
  // for them; restart() (every copy waited for) numbers from 0 again.
  class CopyQueue {
   public:
    virtual ~CopyQueue() = default;
    virtual int64_t queue(void* host, const void* src, int64_t bytes) = 0;
    virtual bool landed(int64_t i) = 0;
    virtual void wait(int64_t i) = 0;
    virtual void restart() = 0;
  };
  // The CPU's copies at once; posing as a device, each is made only when wait() or a second
  // landed() asks for it, so a caller that reads a copy before asking is caught by the tests.
  // A backend without host memory must give its own.
  virtual std::unique_ptr<CopyQueue> copy_queue();
  // out [n] = x rounded to bf16 (convert_to_bf16).
  virtual void to_bf16(bf16* out, const float* x, int64_t n) = 0;

  // ---- products (kernels/gemm.h) ------------------------------------------------------------
  // C [m, n] (+)= op(A) · op(B), foundry::gemm's contract; lda > 0 gives A's rows (as stored)
  // that many elements apart.
  virtual void gemm(const void* a, bool trans_a, const void* b, bool trans_b, float* c,
                    int64_t m, int64_t n, int64_t k, DType dtype, bool accumulate = false,
                    int64_t lda = 0) = 0;
  // task(i) for each i < costs.size(), independent products (run_products); a backend may run
  // them side by side.
  virtual void products(const std::vector<int64_t>& costs,
                        const std::function<void(int64_t)>& task) = 0;

  // ---- embedding, norms, RoPE, SwiGLU (kernels/ops.h) ----------------------------------------
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t n,
                                 int64_t c) = 0;
  virtual void embedding_backward(float* dwte, const float* dout, const int32_t* tokens,
                                  int64_t n, int64_t c, int64_t v) = 0;
  virtual void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight,
                               int64_t n, int64_t c, float eps) = 0;
  virtual void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in,
                                const float* weight, const float* rstd, int64_t n,
                                int64_t c) = 0;
  // din (writes) = residual_scale ⊙ residual + the norm's input gradient.
  virtual void rmsnorm_backward_residual(float* din, float* dweight, const float* dout,
                                         const float* in, const float* weight, const float* rstd,
                                         const float* residual, const float* residual_scale,
                                         int64_t n, int64_t c) = 0;
  virtual void rope_apply(float* x, int64_t b, int64_t t, int64_t h, int64_t d,
                          int64_t rotary_dim, int64_t pos_offset, double theta,
                          bool inverse) = 0;
  virtual void swiglu_forward(float* out, const float* h, int64_t n, int64_t f) = 0;
  virtual void swiglu_backward(float* dh, const float* dout, const float* h, int64_t n,
                               int64_t f) = 0;
  virtual void swiglu_forward_bf16(bf16* out, const float* h, int64_t n, int64_t f) = 0;
  virtual void swiglu_backward_bf16(bf16* dh, const float* dout, const float* h, int64_t n,
                                    int64_t f) = 0;

  // ---- causal GQA attention (kernels/attention.h) ------------------------------------------
  virtual void attention_forward(float* out, float* lse, const float* q, const float* k,
                                 const float* v, const ops::AttentionShape& s, DType dtype) = 0;
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                  const float* out, const float* lse, const float* q,
                                  const float* k, const float* v, const ops::AttentionShape& s,
                                  DType dtype) = 0;
  // One chunk of a sequence's queries against the keys up to it (context parallelism): the
  // contract of ops::attention_chunk_forward and _backward (dk, dv accumulate). The host runs
  // `between_blocks` between blocks of query rows (a caller's communication progresses
  // there); a device queues the chunk whole and does not call it.
  virtual void attention_chunk_forward(float* out, float* lse, const float* q, const float* k,
                                       const float* v, const ops::AttentionChunk& c, DType dtype,
                                       const std::function<void()>& between_blocks) = 0;
  virtual void attention_chunk_backward(float* dq, float* dk, float* dv, const float* dout,
                                        const float* out, const float* lse, const float* q,
                                        const float* k, const float* v,
                                        const ops::AttentionChunk& c, DType dtype,
                                        const std::function<void()>& between_blocks) = 0;

  // ---- routing and the experts' rows (kernels/ops.h) -----------------------------------------
  virtual void router_forward(float* probs, int32_t* topk_idx, float* topk_w,
                              const float* logits, int64_t n, int64_t e, int64_t k,
                              bool renormalize) = 0;
  // counts [classes] (writes): how many of the n·k choices picked each class.
  virtual void class_counts(int64_t* counts, const int32_t* choice, int64_t n, int64_t k,
                            int64_t classes) = 0;
  // fractions [e] (writes) = class_counts / (n·k): the f_e of the load-balancing loss.
  virtual void expert_fractions(double* fractions, const int32_t* topk_idx, int64_t n, int64_t e,
                                int64_t k) = 0;
  // *aux (writes) = E · Σ_e f_e · mean over rows of probs[:, e].
  virtual void router_aux_loss(double* aux, const float* probs, const double* fractions,
                               int64_t n, int64_t e) = 0;
  virtual void router_backward(float* dlogits, const float* dtopk_w, const float* probs,
                               const int32_t* topk_idx, const float* topk_w, int64_t n,
                               int64_t e, int64_t k, bool renormalize, float aux_coef,
                               const double* fractions) = 0;
  virtual void moe_dispatch_plan(int64_t* expert_offsets, int32_t* slot_token,
                                 int32_t* assignment_slot, const int32_t* topk_idx, int64_t n,
                                 int64_t e, int64_t k) = 0;
  virtual void moe_gather(float* xs, const float* x, const int32_t* slot_token, int64_t rows,
                          int64_t c) = 0;
  virtual void moe_combine(float* out, const float* ys, const float* topk_w,
                           const int32_t* assignment_slot, int64_t n, int64_t k, int64_t c) = 0;
  virtual void moe_combine_backward(float* dys, float* dtopk_w, const float* dout,
                                    const float* ys, const float* topk_w,
                                    const int32_t* assignment_slot, int64_t n, int64_t k,
                                    int64_t c) = 0;
  virtual void moe_gather_backward(float* dx, const float* dxs, const int32_t* assignment_slot,
                                   int64_t n, int64_t k, int64_t c) = 0;

  // ---- cross-entropy over a padded vocabulary (kernels/ops.h) --------------------------------
  // *mean_loss (writes) = the mean of losses [n]; dlogits may alias logits.
  virtual void cross_entropy(float* dlogits, float* losses, double* mean_loss,
                             const float* logits, const int32_t* targets, int64_t n, int64_t v,
                             int64_t vp, float grad_scale) = 0;
  // The same with dlogits written in bf16, rows `ld` elements apart (in place of the logits:
  // ld = 2·vp).
  virtual void cross_entropy_bf16(bf16* dlogits, int64_t ld, float* losses, double* mean_loss,
                                  const float* logits, const int32_t* targets, int64_t n,
                                  int64_t v, int64_t vp, float grad_scale) = 0;

  // ---- ZAYA1's CCA (kernels/cca.h) ------------------------------------------------------------
  virtual void cca_means_forward(float* qk, const float* c, int64_t n, int64_t hq, int64_t hk,
                                 int64_t d) = 0;
  virtual void cca_means_backward(float* dc, const float* dqk, int64_t n, int64_t hq,
                                  int64_t hk, int64_t d) = 0;
  virtual void cca_depthwise_conv_forward(float* y, const float* c, const float* w0,
                                          const float* b0, int64_t b, int64_t t,
                                          int64_t channels, int64_t taps) = 0;
  virtual void cca_depthwise_conv_backward(float* dc, float* dw0, float* db0, const float* dy,
                                           const float* c, const float* w0, int64_t b,
                                           int64_t t, int64_t channels, int64_t taps) = 0;
  // z written; b1 null: no bias (the fused norm below adds it); before: y before position 0
  // (null: zero). dy written (not +=); dbefore null: not wanted.
  virtual void cca_grouped_conv_forward(float* z, const float* y, const float* w1, const float* b1,
                                        const float* before, int64_t b, int64_t t, int64_t groups,
                                        int64_t d, int64_t taps, DType dtype) = 0;
  virtual void cca_grouped_conv_backward(float* dy, float* dw1, float* db1, float* dbefore,
                                         const float* dz, const float* y, const float* w1,
                                         const float* before, int64_t b, int64_t t, int64_t groups,
                                         int64_t d, int64_t taps, DType dtype) = 0;
  // A training step's two convolutions: qk = grouped(depthwise(c)), without the grouped
  // bias (the fused norm below adds it), keeping in `kept` ([B·T, G·d] floats) what the
  // backward needs; by default the composition, keeping y (the grouped convolution reads b0
  // before each sequence: kernels/cca.h). The backward: dc +=, the four weight gradients +=,
  // dy [B·T, G·d] scratch.
  virtual void cca_convs_forward(float* qk, float* kept, const float* c, const float* w0,
                                 const float* b0, const float* w1, int64_t b, int64_t t,
                                 int64_t groups, int64_t d, int64_t t0, int64_t t1,
                                 DType dtype) {
    cca_depthwise_conv_forward(kept, c, w0, b0, b, t, groups * d, t0);
    cca_grouped_conv_forward(qk, kept, w1, nullptr, b0, b, t, groups, d, t1, dtype);
  }
  virtual void cca_convs_backward(float* dc, float* dw0, float* db0, float* dw1, float* db1,
                                  float* dy, const float* dqk, const float* kept, const float* c,
                                  const float* w0, const float* b0, const float* w1, int64_t b,
                                  int64_t t, int64_t groups, int64_t d, int64_t t0, int64_t t1,
                                  DType dtype) {
    cca_grouped_conv_backward(dy, dw1, db1, db0, dqk, kept, w1, b0, b, t, groups, d, t1, dtype);
    cca_depthwise_conv_backward(dc, dw0, db0, dy, c, w0, b, t, groups * d, t0);
  }
  // Both forwards above and then cca_means_qk_norm_forward (below) with the grouped bias:
  // a step's CCA from c to q, k (groups = hq + hk); by default that composition.
  virtual void cca_convs_qk_norm_forward(float* q, float* k, float* rnorm, float* qk,
                                         float* kept, const float* c, const float* w0,
                                         const float* b0, const float* w1, const float* b1,
                                         const float* temp, int64_t b, int64_t t, int64_t hq,
                                         int64_t hk, int64_t d, int64_t t0, int64_t t1,
                                         float eps, DType dtype) {
    cca_convs_forward(qk, kept, c, w0, b0, w1, b, t, hq + hk, d, t0, t1, dtype);
    cca_means_qk_norm_forward(q, k, rnorm, qk, c, b1, temp, b * t, hq, hk, d, eps);
  }
  // The backward of the two above, from the attention's dq, dk to dc (written) and the
  // parameters' gradients (+=): cca_qk_norm_means_backward (below) into dqk, then
  // cca_convs_backward; dqk and dy [B·T, G·d] scratch. By default that composition (the CPU's
  // blocked form uses dy alone).
  virtual void cca_qk_norm_convs_backward(float* dc, float* dtemp, float* dw0, float* db0,
                                          float* dw1, float* db1, float* dqk, float* dy,
                                          const float* dq, const float* dk, const float* qk,
                                          const float* rnorm, const float* temp, const float* kept,
                                          const float* c, const float* w0, const float* b0,
                                          const float* w1, int64_t b, int64_t t, int64_t hq,
                                          int64_t hk, int64_t d, int64_t t0, int64_t t1,
                                          DType dtype) {
    cca_qk_norm_means_backward(dqk, dc, dtemp, dq, dk, qk, rnorm, temp, b * t, hq, hk, d);
    cca_convs_backward(dc, dw0, db0, dw1, db1, dy, dqk, kept, c, w0, b0, w1, b, t, hq + hk, d, t0,
                       t1, dtype);
  }
  virtual void cca_value_shift_forward(float* v, int64_t b, int64_t t, int64_t half) = 0;
  virtual void cca_value_shift_backward(float* dv, int64_t b, int64_t t, int64_t half) = 0;
  virtual void cca_qk_norm_forward(float* q, float* k, float* rnorm, const float* qk,
                                   const float* temp, int64_t n, int64_t hq, int64_t hk,
                                   int64_t d, float eps) = 0;
  virtual void cca_qk_norm_backward(float* dqk, float* dtemp, const float* dq, const float* dk,
                                    const float* qk, const float* rnorm, const float* temp,
                                    int64_t n, int64_t hq, int64_t hk, int64_t d) = 0;
  // The fused forms a step runs (kernels/cca.h); by default, the compositions they stand for.
  virtual void cca_means_qk_norm_forward(float* q, float* k, float* rnorm, float* qk,
                                         const float* c, const float* b1, const float* temp,
                                         int64_t n, int64_t hq, int64_t hk, int64_t d,
                                         float eps) {
    if (b1) bias_add_forward(qk, b1, n, (hq + hk) * d);
    cca_means_forward(qk, c, n, hq, hk, d);
    cca_qk_norm_forward(q, k, rnorm, qk, temp, n, hq, hk, d, eps);
  }
  virtual void cca_qk_norm_means_backward(float* dqk, float* dc, float* dtemp, const float* dq,
                                          const float* dk, const float* qk, const float* rnorm,
                                          const float* temp, int64_t n, int64_t hq, int64_t hk,
                                          int64_t d) {
    const int64_t bytes = n * (hq + hk) * d * static_cast<int64_t>(sizeof(float));
    zero(dqk, bytes);
    cca_qk_norm_backward(dqk, dtemp, dq, dk, qk, rnorm, temp, n, hq, hk, d);
    zero(dc, bytes);
    cca_means_backward(dc, dqk, n, hq, hk, d);
  }

  // ---- ZAYA1's router and residual scaling (kernels/zaya_router.h) ---------------------------
  virtual void bias_add_forward(float* y, const float* bias, int64_t n, int64_t m) = 0;
  virtual void bias_add_backward(float* dbias, const float* dy, int64_t n, int64_t m) = 0;
  virtual void gelu_forward(float* out, const float* in, int64_t n, int64_t c) = 0;
  virtual void gelu_backward(float* din, const float* dout, const float* in, int64_t n,
                             int64_t c) = 0;
  // The router layer's bias and GELU (kernels/zaya_router.h): a [n, c] += bias, g = gelu(a),
  // keeping in `a` what the backward reads (by default a itself; the CPU keeps gelu'(a)).
  // The backward: da (writes) from dg and what the forward kept, dbias +=.
  virtual void gelu_bias_forward(float* g, float* a, const float* bias, int64_t n, int64_t c) {
    bias_add_forward(a, bias, n, c);
    gelu_forward(g, a, n, c);
  }
  virtual void gelu_bias_backward(float* da, float* dbias, const float* dg, const float* kept,
                                  int64_t n, int64_t c) {
    gelu_backward(da, dg, kept, n, c);
    bias_add_backward(dbias, da, n, c);
  }
  virtual void eda_forward(float* r, const float* r_prev, const float* gamma, int64_t n,
                           int64_t r_dim) = 0;
  virtual void eda_backward(float* dr_prev, float* dgamma, const float* dr, const float* r_prev,
                            const float* gamma, int64_t n, int64_t r_dim) = 0;
  virtual void zaya_gating_forward(float* probs, int32_t* choice, float* gate,
                                   const float* logits, const float* balance_bias,
                                   ops::BiasOn bias_on, int64_t n, int64_t e, int64_t k,
                                   bool skip_class, bool skip_passes_input) = 0;
  virtual void zaya_gating_backward(float* dlogits, const float* dgate, const float* probs,
                                    const int32_t* choice, int64_t n, int64_t e, int64_t k,
                                    bool skip_class, bool skip_passes_input) = 0;
  virtual void zaya_boundary_counts(int64_t* near, const float* probs, const float* logits,
                                    const float* balance_bias, ops::BiasOn bias_on,
                                    const int32_t* choice, int64_t n, int64_t classes,
                                    int64_t k, double window) = 0;
  virtual void residual_scale_forward(float* out, const float* res, const float* h,
                                      const float* alpha_res, const float* beta_res,
                                      const float* alpha_h, const float* beta_h, int64_t n,
                                      int64_t c) = 0;
  virtual void residual_scale_backward(float* dres, float* dh, float* dalpha_res,
                                       float* dbeta_res, float* dalpha_h, float* dbeta_h,
                                       const float* dout, const float* res, const float* h,
                                       const float* alpha_res, const float* beta_res,
                                       const float* alpha_h, const float* beta_h, int64_t n,
                                       int64_t c) = 0;
  // residual_scale_backward without dres; dh (writes) in `dh_type`: f32, or bf16 for the
  // sublayer's first product.
  virtual void residual_scale_backward_params(void* dh, DType dh_type, float* dalpha_res,
                                              float* dbeta_res, float* dalpha_h, float* dbeta_h,
                                              const float* dout, const float* res,
                                              const float* h, const float* alpha_res,
                                              const float* beta_res, const float* alpha_h,
                                              const float* beta_h, int64_t n, int64_t c) = 0;
  // out [n, c] = (x + β) ⊙ α; backward: dx (writes) = α ⊙ dout, dα += Σ (x + β) ⊙ dout,
  // dβ += α ⊙ Σ dout.
  virtual void scale_shift_forward(float* out, const float* x, const float* alpha,
                                   const float* beta, int64_t n, int64_t c) = 0;
  virtual void scale_shift_backward(float* dx, float* dalpha, float* dbeta, const float* dout,
                                    const float* x, const float* alpha, const float* beta,
                                    int64_t n, int64_t c) = 0;

  // ---- incremental decoding (attention.h's decode caches, cca.h's decode states) ----------
  // The arrays named host are the host's: descriptors whose pointers (a span's k and v, a
  // CCA state) are in the backend's memory.
  // y [n] += x [n].
  virtual void add(float* y, const float* x, int64_t n) = 0;
  // x [rows, h, d] rotated in place (ops::rope_apply), row r at position pos[r] (host).
  virtual void rope_apply_rows(float* x, const int64_t* pos, int64_t rows, int64_t h, int64_t d,
                               int64_t rotary_dim, double theta) = 0;
  // Row r's key and value rows k, v [rows, kvh·d] stored at index store_at[r] of spans[r] (host
  // arrays; ops::decode_span_store, whose error for an index outside a span it gives).
  virtual void decode_kv_store(const ops::DecodeSpan* spans, const int64_t* store_at,
                               const float* k, const float* v, int64_t rows, int64_t kvh,
                               int64_t d) = 0;
  // ops::attention_decode_rows, spans [first[rows]] and first [rows + 1] host arrays.
  virtual void attention_decode_rows(float* out, float* scores, int64_t max_len, const float* q,
                                     const ops::DecodeSpan* spans, const int64_t* first,
                                     int64_t rows, int64_t h, int64_t kvh, int64_t d) = 0;
  // ops::cca_conv_decode and ops::cca_value_shift_decode, states [rows] a host array.
  virtual void cca_conv_decode(float* qk, const ops::CcaDims& dims, float* const* states,
                               int64_t rows, const float* c_new, const float* w0,
                               const float* b0, const float* w1, const float* b1) = 0;
  virtual void cca_value_shift_decode(float* v, const ops::CcaDims& dims, float* const* states,
                                      int64_t rows) = 0;
};

// One block of a backend's memory, released with the object (move-only). Empty by default.
class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(Backend& backend, int64_t bytes)
      : backend_(&backend), data_(bytes > 0 ? backend.allocate(bytes) : nullptr), bytes_(bytes) {}
  // A slab (Backend::allocate_slab).
  static BackendBuffer slab(Backend& backend, int64_t bytes, const ByteRanges& byte_holes = {},
                            Backend::Released holes_read = Backend::Released::zeros) {
    BackendBuffer b;
    b.backend_ = &backend;
    b.data_ = bytes > 0 ? backend.allocate_slab(bytes, byte_holes, holes_read) : nullptr;
    b.bytes_ = bytes;
    return b;
  }
  ~BackendBuffer() { reset(); }
  BackendBuffer(BackendBuffer&& o) noexcept
      : backend_(o.backend_), data_(o.data_), bytes_(o.bytes_) {
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  BackendBuffer& operator=(BackendBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      data_ = o.data_;
      bytes_ = o.bytes_;
      o.data_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  int64_t bytes() const { return bytes_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  void reset() {
    if (data_) backend_->release(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// Scratch in a backend's memory that grows to the largest request and then stays (its
// contents do not survive a larger request). A `growth` above 1 grows it to at least that many
// times its size, for sizes that creep up from step to step (an expert's rows as routing
// shifts): a few reallocations instead of one every few steps, each of which on a GPU waits
// for the whole device.
class GrowingBuffer {
 public:
  explicit GrowingBuffer(Backend& backend, double growth = 1.0)
      : backend_(&backend), growth_(growth) {}
  void* get(int64_t bytes) {
    if (bytes > buffer_.bytes()) {
      const auto grown = static_cast<int64_t>(growth_ * static_cast<double>(buffer_.bytes()));
      buffer_ = BackendBuffer(*backend_, std::max(bytes, grown));
    }
    return buffer_.as<void>();
  }
  // Room for `count` elements of T.
  template <class T>
  T* get_as(int64_t count) {
    return static_cast<T*>(get(count * static_cast<int64_t>(sizeof(T))));
  }
  void* data() const { return buffer_.as<void>(); }

 private:
  Backend* backend_;
  double growth_;
  BackendBuffer buffer_;
};

}  // namespace foundry
