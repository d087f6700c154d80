#include "cuda/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <vector>

#include "base/error.h"
#include "kernels/attention.h"
#include "kernels/cca.h"
#include "cuda/blas.h"
#include "cuda/cca.h"
#include "cuda/decode.h"
#include "cuda/ops.h"
#include "cuda/runtime.h"
#include "cuda/zaya.h"

namespace foundry::gpu {
namespace {

uint16_t* bits(bf16* p) { return reinterpret_cast<uint16_t*>(p); }

bool aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

ops::AttentionDims dims(const foundry::ops::AttentionShape& s) {
  return {s.b, s.t, s.h, s.kvh, s.d};
}
ops::AttentionDims dims(const foundry::ops::AttentionChunk& c) {
  return {c.b, c.k_rows, c.h, c.kvh, c.d, c.q_rows, c.q_begin, c.q_end, c.q_pos};
}

// The host's span descriptors go to the device as they are.
static_assert(sizeof(ops::DecodeSpan) == sizeof(foundry::ops::DecodeSpan) &&
              offsetof(ops::DecodeSpan, k) == offsetof(foundry::ops::DecodeSpan, k) &&
              offsetof(ops::DecodeSpan, v) == offsetof(foundry::ops::DecodeSpan, v) &&
              offsetof(ops::DecodeSpan, len) == offsetof(foundry::ops::DecodeSpan, len) &&
              offsetof(ops::DecodeSpan, capacity) == offsetof(foundry::ops::DecodeSpan, capacity));

// Each method is the GPU kernel of the same name (or a short composition of them, where said).
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const GpuInfo& gpu) : name_(fmt::format("cuda:{}", gpu.index)) {}

  const char* name() const override { return name_.c_str(); }
  bool host_memory() const override { return false; }
  OpClock* op_clock() override { return &clock_; }

  // cudaMalloc's blocks are 256-byte aligned.
  void* allocate(int64_t bytes) override { return device_allocate(bytes); }
  void release(void* block) override { device_release(block); }
  void* allocate_slab(int64_t bytes, const ByteRanges& byte_holes, Released holes_read) override {
    return device_allocate_slab(bytes, byte_holes, holes_read == Released::zeros);
  }
  int64_t release_slab_ranges(void* slab, const ByteRanges& byte_ranges, Released reads) override {
    return device_release_slab_ranges(slab, byte_ranges, reads == Released::zeros);
  }
  int64_t slab_memory_bytes(const void* slab, int64_t) const override {
    return device_slab_memory_bytes(slab);
  }
  void fill(float* x, int64_t n, float value) override { ops::fill(x, n, value); }
  void fill(int32_t* x, int64_t n, int32_t value) override { ops::fill(x, n, value); }
  void zero(void* x, int64_t bytes) override { zero_bytes(x, bytes); }
  void copy(void* dst, const void* src, int64_t bytes) override {
    copy_on_device(dst, src, bytes);
  }
  void copy_blocks(void* dst, int64_t dst_stride, const void* src, int64_t src_stride,
                   int64_t block_bytes, int64_t blocks) override {
    copy_blocks_on_device(dst, dst_stride, src, src_stride, block_bytes, blocks);
  }
  void* allocate_host(int64_t bytes) override { return host_allocate_pinned(bytes); }
  void release_host(void* block) override { host_release_pinned(block); }
  void to_host_async(void* host, const void* src, int64_t bytes) override {
    copy_to_host_async(host, src, bytes);
  }
  void wait_host_copies() override { wait_copies_to_host(); }
  std::unique_ptr<CopyQueue> copy_queue() override {
    struct Queue final : CopyQueue {
      HostCopyQueue copies;
      int64_t queue(void* host, const void* src, int64_t bytes) override {
        return copies.queue(host, src, bytes);
      }
      bool landed(int64_t i) override { return copies.landed(i); }
      void wait(int64_t i) override { copies.wait(i); }
      void restart() override { copies.restart(); }
    };
    return std::make_unique<Queue>();
  }
  void to_host(void* host, const void* src, int64_t bytes) override {
    copy_to_host(host, src, bytes);
  }
  void from_host(void* dst, const void* host, int64_t bytes) override {
    copy_to_device(dst, host, bytes);
  }
  void to_bf16(bf16* out, const float* x, int64_t n) override {
    ops::convert_to_bf16(bits(out), x, n);
  }

  void gemm(const void* a, bool trans_a, const void* b, bool trans_b, float* c, int64_t m,
            int64_t n, int64_t k, DType dtype, bool accumulate, int64_t lda) override {
    gpu::gemm(a, trans_a, b, trans_b, c, m, n, k, dtype, accumulate, lda);
  }
  // In order, each product queued behind the last (grouped GEMMs are the next step here).
  void products(const std::vector<int64_t>& costs,
                const std::function<void(int64_t)>& task) override {
    for (size_t i = 0; i < costs.size(); ++i) task(static_cast<int64_t>(i));
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t n,
                         int64_t c) override {
    ops::embedding_forward(out, tokens, wte, n, c);
  }
  void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t n,
                          int64_t c, int64_t v) override {
    ops::embedding_backward(dwte, dout, tokens, n, c, v, sort_workspace_);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t n,
                       int64_t c, float eps) override {
    ops::rmsnorm_forward(out, rstd, in, weight, n, c, eps);
  }
  void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in,
                        const float* weight, const float* rstd, int64_t n, int64_t c) override {
    ops::rmsnorm_backward(din, dweight, dout, in, weight, rstd, n, c,
                          floats(ops::rmsnorm_backward_scratch(n, c)));
  }
  void rmsnorm_backward_residual(float* din, float* dweight, const float* dout, const float* in,
                                 const float* weight, const float* rstd, const float* residual,
                                 const float* residual_scale, int64_t n, int64_t c) override {
    ops::rmsnorm_backward_residual(din, dweight, dout, in, weight, rstd, residual, residual_scale,
                                   n, c, floats(ops::rmsnorm_backward_scratch(n, c)));
  }
  void rope_apply(float* x, int64_t b, int64_t t, int64_t h, int64_t d, int64_t rotary_dim,
                  int64_t pos_offset, double theta, bool inverse) override {
    ops::rope_apply(x, b, t, h, d, rotary_dim, pos_offset, theta, inverse);
  }
  void swiglu_forward(float* out, const float* h, int64_t n, int64_t f) override {
    ops::swiglu_forward(out, h, n, f);
  }
  void swiglu_backward(float* dh, const float* dout, const float* h, int64_t n,
                       int64_t f) override {
    ops::swiglu_backward(dh, dout, h, n, f);
  }
  void swiglu_forward_bf16(bf16* out, const float* h, int64_t n, int64_t f) override {
    ops::swiglu_forward_bf16(bits(out), h, n, f);
  }
  void swiglu_backward_bf16(bf16* dh, const float* dout, const float* h, int64_t n,
                            int64_t f) override {
    ops::swiglu_backward_bf16(bits(dh), dout, h, n, f);
  }

  // bf16 on tensor cores where the shape allows (attention_on_tensor_cores), else fp32. A
  // chunk runs the same kernels over its query rows.
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const foundry::ops::AttentionShape& s, DType dtype) override {
    attention_forward(out, lse, q, k, v, dims(s), dtype);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          const foundry::ops::AttentionShape& s, DType dtype) override {
    attention_backward(dq, dk, dv, dout, out, lse, q, k, v, dims(s), dtype);
  }
  void attention_chunk_forward(float* out, float* lse, const float* q, const float* k,
                               const float* v, const foundry::ops::AttentionChunk& c, DType dtype,
                               const std::function<void()>&) override {
    attention_forward(out, lse, q, k, v, dims(c), dtype);
  }
  void attention_chunk_backward(float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* lse, const float* q, const float* k,
                                const float* v, const foundry::ops::AttentionChunk& c, DType dtype,
                                const std::function<void()>&) override {
    attention_backward(dq, dk, dv, dout, out, lse, q, k, v, dims(c), dtype);
  }

  void router_forward(float* probs, int32_t* topk_idx, float* topk_w, const float* logits,
                      int64_t n, int64_t e, int64_t k, bool renormalize) override {
    ops::router_forward(probs, topk_idx, topk_w, logits, n, e, k, renormalize);
  }
  void class_counts(int64_t* counts, const int32_t* choice, int64_t n, int64_t k,
                    int64_t classes) override {
    ops::zaya_class_counts(counts, choice, n, k, classes);
  }
  // The counts in the workspace, then their shares.
  void expert_fractions(double* fractions, const int32_t* topk_idx, int64_t n, int64_t e,
                        int64_t k) override {
    auto* counts = static_cast<int64_t*>(workspace_.get(e * static_cast<int64_t>(sizeof(int64_t))));
    ops::zaya_class_counts(counts, topk_idx, n, k, e);
    ops::fractions_of_counts(fractions, counts, e, n * k);
  }
  void router_aux_loss(double* aux, const float* probs, const double* fractions, int64_t n,
                       int64_t e) override {
    const int64_t doubles = ops::router_aux_scratch(n, e);
    ops::router_aux_loss(aux, probs, fractions, n, e,
                         static_cast<double*>(workspace_.get(doubles * 8)));
  }
  void router_backward(float* dlogits, const float* dtopk_w, const float* probs,
                       const int32_t* topk_idx, const float* topk_w, int64_t n, int64_t e,
                       int64_t k, bool renormalize, float aux_coef,
                       const double* fractions) override {
    ops::router_backward(dlogits, dtopk_w, probs, topk_idx, topk_w, n, e, k, renormalize,
                         aux_coef, fractions);
  }
  void moe_dispatch_plan(int64_t* expert_offsets, int32_t* slot_token, int32_t* assignment_slot,
                         const int32_t* topk_idx, int64_t n, int64_t e, int64_t k) override {
    ops::moe_dispatch_plan(expert_offsets, slot_token, assignment_slot, topk_idx, n, e, k,
                           sort_workspace_);
  }
  void moe_gather(float* xs, const float* x, const int32_t* slot_token, int64_t rows,
                  int64_t c) override {
    ops::moe_gather(xs, x, slot_token, rows, c);
  }
  void moe_combine(float* out, const float* ys, const float* topk_w,
                   const int32_t* assignment_slot, int64_t n, int64_t k, int64_t c) override {
    ops::moe_combine(out, ys, topk_w, assignment_slot, n, k, c);
  }
  void moe_combine_backward(float* dys, float* dtopk_w, const float* dout, const float* ys,
                            const float* topk_w, const int32_t* assignment_slot, int64_t n,
                            int64_t k, int64_t c) override {
    ops::moe_combine_backward(dys, dtopk_w, dout, ys, topk_w, assignment_slot, n, k, c);
  }
  void moe_gather_backward(float* dx, const float* dxs, const int32_t* assignment_slot,
                           int64_t n, int64_t k, int64_t c) override {
    ops::moe_gather_backward(dx, dxs, assignment_slot, n, k, c);
  }

  void cross_entropy(float* dlogits, float* losses, double* mean_loss, const float* logits,
                     const int32_t* targets, int64_t n, int64_t v, int64_t vp,
                     float grad_scale) override {
    ops::cross_entropy(dlogits, losses, mean_loss, logits, targets, n, v, vp, grad_scale);
  }
  void cross_entropy_bf16(bf16* dlogits, int64_t ld, float* losses, double* mean_loss,
                          const float* logits, const int32_t* targets, int64_t n, int64_t v,
                          int64_t vp, float grad_scale) override {
    ops::cross_entropy_bf16(bits(dlogits), ld, losses, mean_loss, logits, targets, n, v, vp,
                            grad_scale);
  }

  void cca_means_forward(float* qk, const float* c, int64_t n, int64_t hq, int64_t hk,
                         int64_t d) override {
    ops::cca_means_forward(qk, c, n, hq, hk, d);
  }
  void cca_means_backward(float* dc, const float* dqk, int64_t n, int64_t hq, int64_t hk,
                          int64_t d) override {
    ops::cca_means_backward(dc, dqk, n, hq, hk, d);
  }
  void cca_depthwise_conv_forward(float* y, const float* c, const float* w0, const float* b0,
                                  int64_t b, int64_t t, int64_t channels,
                                  int64_t taps) override {
    ops::cca_depthwise_conv_forward(y, c, w0, b0, b, t, channels, taps);
  }
  void cca_depthwise_conv_backward(float* dc, float* dw0, float* db0, const float* dy,
                                   const float* c, const float* w0, int64_t b, int64_t t,
                                   int64_t channels, int64_t taps) override {
    ops::cca_depthwise_conv_backward(dc, dw0, db0, dy, c, w0, b, t, channels, taps,
                                     floats(ops::cca_depthwise_conv_scratch(b, t, channels, taps)));
  }
  void cca_grouped_conv_forward(float* z, const float* y, const float* w1, const float* b1,
                                const float* before, int64_t b, int64_t t, int64_t groups,
                                int64_t d, int64_t taps, DType) override {
    ops::cca_grouped_conv_forward(
        z, y, w1, b1, before, b, t, groups, d, taps,
        floats(ops::cca_grouped_conv_forward_scratch(b, t, groups, d, taps)));
  }
  void cca_grouped_conv_backward(float* dy, float* dw1, float* db1, float* dbefore, const float* dz,
                                 const float* y, const float* w1, const float* before, int64_t b,
                                 int64_t t, int64_t groups, int64_t d, int64_t taps,
                                 DType) override {
    zero(dy, b * t * groups * d * static_cast<int64_t>(sizeof(float)));  // dy is written
    ops::cca_grouped_conv_backward(dy, dw1, db1, dbefore, dz, y, w1, before, b, t, groups, d, taps,
                                   floats(ops::cca_grouped_conv_scratch(b, t, groups, d, taps)));
  }
  void cca_value_shift_forward(float* v, int64_t b, int64_t t, int64_t half) override {
    ops::cca_value_shift_inplace_forward(v, nullptr, b, t, half);
  }
  void cca_value_shift_backward(float* dv, int64_t b, int64_t t, int64_t half) override {
    ops::cca_value_shift_inplace_backward(dv, b, t, half);
  }
  void cca_qk_norm_forward(float* q, float* k, float* rnorm, const float* qk, const float* temp,
                           int64_t n, int64_t hq, int64_t hk, int64_t d, float eps) override {
    ops::cca_qk_norm_forward(q, k, rnorm, qk, temp, n, hq, hk, d, eps);
  }
  void cca_qk_norm_backward(float* dqk, float* dtemp, const float* dq, const float* dk,
                            const float* qk, const float* rnorm, const float* temp, int64_t n,
                            int64_t hq, int64_t hk, int64_t d) override {
    ops::cca_qk_norm_backward(dqk, dtemp, dq, dk, qk, rnorm, temp, n, hq, hk, d,
                              floats(ops::cca_qk_norm_scratch(n, hk)));
  }

  void bias_add_forward(float* y, const float* bias, int64_t n, int64_t m) override {
    ops::bias_add_forward(y, bias, n, m);
  }
  void bias_add_backward(float* dbias, const float* dy, int64_t n, int64_t m) override {
    ops::bias_add_backward(dbias, dy, n, m, floats(ops::column_sum_scratch(n, m)));
  }
  void gelu_forward(float* out, const float* in, int64_t n, int64_t c) override {
    ops::gelu_forward(out, in, n, c);
  }
  void gelu_backward(float* din, const float* dout, const float* in, int64_t n,
                     int64_t c) override {
    ops::gelu_backward(din, dout, in, n, c);
  }
  void eda_forward(float* r, const float* r_prev, const float* gamma, int64_t n,
                   int64_t r_dim) override {
    ops::eda_forward(r, r_prev, gamma, n, r_dim);
  }
  void eda_backward(float* dr_prev, float* dgamma, const float* dr, const float* r_prev,
                    const float* gamma, int64_t n, int64_t r_dim) override {
    ops::eda_backward(dr_prev, dgamma, dr, r_prev, gamma, n, r_dim,
                      floats(ops::column_sum_scratch(n, r_dim)));
  }
  void zaya_gating_forward(float* probs, int32_t* choice, float* gate, const float* logits,
                           const float* balance_bias, foundry::ops::BiasOn bias_on, int64_t n,
                           int64_t e, int64_t k, bool skip_class,
                           bool skip_passes_input) override {
    ops::zaya_gating_forward(probs, choice, gate, logits, balance_bias,
                             bias_on == foundry::ops::BiasOn::logits, n, e, k, skip_class,
                             skip_passes_input);
  }
  void zaya_gating_backward(float* dlogits, const float* dgate, const float* probs,
                            const int32_t* choice, int64_t n, int64_t e, int64_t k,
                            bool skip_class, bool skip_passes_input) override {
    ops::zaya_gating_backward(dlogits, dgate, probs, choice, n, e, k, skip_class,
                              skip_passes_input);
  }
  void zaya_boundary_counts(int64_t* near, const float* probs, const float* logits,
                            const float* balance_bias, foundry::ops::BiasOn bias_on,
                            const int32_t* choice, int64_t n, int64_t classes, int64_t k,
                            double window) override {
    ops::zaya_boundary_counts(near, probs, logits, balance_bias,
                              bias_on == foundry::ops::BiasOn::logits, choice, n, classes, k,
                              window);
  }
  void residual_scale_forward(float* out, const float* res, const float* h,
                              const float* alpha_res, const float* beta_res,
                              const float* alpha_h, const float* beta_h, int64_t n,
                              int64_t c) override {
    ops::residual_scale_forward(out, res, h, alpha_res, beta_res, alpha_h, beta_h, n, c);
  }
  void residual_scale_backward(float* dres, float* dh, float* dalpha_res, float* dbeta_res,
                               float* dalpha_h, float* dbeta_h, const float* dout,
                               const float* res, const float* h, const float* alpha_res,
                               const float* beta_res, const float* alpha_h, const float* beta_h,
                               int64_t n, int64_t c) override {
    ops::residual_scale_backward(dres, dh, dalpha_res, dbeta_res, dalpha_h, dbeta_h, dout, res,
                                 h, alpha_res, beta_res, alpha_h, beta_h, n, c,
                                 floats(ops::column_sum_scratch(n, 3 * c)));
  }
  void residual_scale_backward_params(void* dh, DType dh_type, float* dalpha_res,
                                      float* dbeta_res, float* dalpha_h, float* dbeta_h,
                                      const float* dout, const float* res, const float* h,
                                      const float* alpha_res, const float* beta_res,
                                      const float* alpha_h, const float* beta_h, int64_t n,
                                      int64_t c) override {
    ops::residual_scale_backward_params(dh, dh_type == DType::bf16, dalpha_res, dbeta_res,
                                        dalpha_h, dbeta_h, dout, res, h, alpha_res, beta_res,
                                        alpha_h, beta_h, n, c,
                                        floats(ops::column_sum_scratch(n, 3 * c)));
  }
  void scale_shift_forward(float* out, const float* x, const float* alpha, const float* beta,
                           int64_t n, int64_t c) override {
    ops::scale_shift_forward(out, x, alpha, beta, n, c);
  }
  // Residual scaling's backward with res = h = x: its first half is this one's; the second
  // half's outputs (dh [N, C], dα_h, dβ_h [C]) land in the workspace, after the column sums.
  void scale_shift_backward(float* dx, float* dalpha, float* dbeta, const float* dout,
                            const float* x, const float* alpha, const float* beta, int64_t n,
                            int64_t c) override {
    const int64_t sums = ops::column_sum_scratch(n, 3 * c);
    float* scratch = floats(sums + n * c + 2 * c);
    float* discard = scratch + sums;
    zero_bytes(discard + n * c, 2 * c * static_cast<int64_t>(sizeof(float)));
    ops::residual_scale_backward(dx, discard, dalpha, dbeta, discard + n * c,
                                 discard + n * c + c, dout, x, x, alpha, beta, alpha, beta, n, c,
                                 scratch);
  }

  void add(float* y, const float* x, int64_t n) override { ops::add(y, x, n); }
  void rope_apply_rows(float* x, const int64_t* pos, int64_t rows, int64_t h, int64_t d,
                       int64_t rotary_dim, double theta) override {
    ops::rope_apply_rows(x, upload(pos, rows), rows, h, d, rotary_dim, theta);
  }
  void decode_kv_store(const foundry::ops::DecodeSpan* spans, const int64_t* store_at,
                       const float* k, const float* v, int64_t rows, int64_t kvh,
                       int64_t d) override {
    for (int64_t r = 0; r < rows; ++r) foundry::ops::check_decode_store(spans[r], store_at[r]);
    Descriptors up;
    const size_t at_spans = up.add(spans, rows), at_store = up.add(store_at, rows);
    up.upload(descriptors_);
    ops::decode_kv_store(up.at<ops::DecodeSpan>(at_spans), up.at<int64_t>(at_store), k, v, rows,
                         kvh, d);
  }
  void attention_decode_rows(float* out, float* scores, int64_t max_len, const float* q,
                             const foundry::ops::DecodeSpan* spans, const int64_t* first,
                             int64_t rows, int64_t h, int64_t kvh, int64_t d) override {
    for (int64_t r = 0; r < rows; ++r) {  // the scores' room, as the CPU checks it
      int64_t len = 0;
      for (int64_t s = first[r]; s < first[r + 1]; ++s) len += spans[s].len;
      FOUNDRY_CHECK(len >= 1 && len <= max_len);
    }
    if (attention_decode_by_groups(out, scores, max_len, q, spans, first, rows, h, kvh, d)) return;
    Descriptors up;
    const size_t at_spans = up.add(spans, first[rows]), at_first = up.add(first, rows + 1);
    up.upload(descriptors_);
    ops::attention_decode_rows(out, scores, max_len, q, up.at<ops::DecodeSpan>(at_spans),
                               up.at<int64_t>(at_first), rows, h, kvh, d);
  }

  void cca_conv_decode(float* qk, const foundry::ops::CcaDims& c, float* const* states,
                       int64_t rows, const float* c_new, const float* w0, const float* b0,
                       const float* w1, const float* b1) override {
    ops::cca_conv_decode(qk, floats(rows * c.channels() * c.t1), upload(states, rows), rows,
                         c.hq, c.hk, c.d, c.t0, c.t1, c_new, w0, b0, w1, b1);
  }
  void cca_value_shift_decode(float* v, const foundry::ops::CcaDims& c, float* const* states,
                              int64_t rows) override {
    ops::cca_value_shift_decode(v, upload(states, rows), rows, c.hq, c.hk, c.d, c.t0, c.t1);
  }

 private:
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const ops::AttentionDims& a, DType dtype) {
    if (dtype == DType::bf16 && ops::attention_on_tensor_cores(a, q, k, v, out))
      ops::attention_forward_bf16(out, lse, q, k, v, a);
    else
      ops::attention_forward(out, lse, q, k, v, a);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          const ops::AttentionDims& a, DType dtype) {
    float* scratch = floats(ops::attention_backward_scratch(a));
    if (dtype == DType::bf16 && ops::attention_on_tensor_cores(a, q, k, v, out) &&
        aligned16({dq, dk, dv, dout}))
      ops::attention_backward_bf16(dq, dk, dv, dout, out, lse, q, k, v, a, scratch);
    else
      ops::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, a, scratch);
  }
  // attention_decode_rows by ops::attention_decode_grouped (decode.h), its parts as large as
  // the GPU's shared memory holds (false, nothing done, where not even one row's query heads
  // fit): each span read once per part of the rows sharing it. Its partial results go in
  // `scores` where they fit there, else in the workspace.
  bool attention_decode_by_groups(float* out, float* scores, int64_t max_len, const float* q,
                                  const foundry::ops::DecodeSpan* spans, const int64_t* first,
                                  int64_t rows, int64_t h, int64_t kvh, int64_t d) {
    if (rows * h * d == 0) return true;
    auto [known, fresh] = query_caps_.try_emplace(d, 0);  // the GPU's answer, asked once per d
    if (fresh) known->second = ops::attention_decode_query_cap(d);
    const int64_t cap = known->second;
    if (cap < h / kvh) return false;  // not even one row's query heads fit
    std::vector<ops::DecodeSpan> chains(first[rows]);
    std::memcpy(chains.data(), spans, chains.size() * sizeof(ops::DecodeSpan));
    const ops::DecodePlan plan =
        ops::plan_attention_decode(chains.data(), first, rows, h, kvh, cap);
    Descriptors up;
    const size_t at_work = up.add(plan.work.data(), std::ssize(plan.work)),
                 at_rows = up.add(plan.work_rows.data(), std::ssize(plan.work_rows)),
                 at_slots = up.add(plan.slots.data(), std::ssize(plan.slots));
    up.upload(descriptors_);
    const int64_t partials = ops::attention_decode_partials(plan, h, d);
    ops::attention_decode_grouped(out, partials <= rows * h * max_len ? scores : floats(partials),
                                  q, up.at<ops::DecodeWork>(at_work), std::ssize(plan.work),
                                  up.at<ops::DecodeWorkRow>(at_rows), up.at<int32_t>(at_slots),
                                  rows, h, kvh, d, plan.queries);
    return true;
  }


  // The decode operations' host arrays on their way to the device: written into a ring of
  // page-locked memory and copied in behind the kernels queued so far, so the host does not
  // wait for the GPU. Before a lap writes its first slot again the host waits for the GPU
  // once: by then every copy of the lap before, and every kernel that read it, has run.
  class DescriptorRing {
   public:
    DescriptorRing() = default;
    DescriptorRing(const DescriptorRing&) = delete;
    DescriptorRing& operator=(const DescriptorRing&) = delete;
    ~DescriptorRing() {
      if (host_) host_release_pinned(host_);
    }
    // The device address where `bytes` will be (16-byte aligned) once the queued copy runs.
    char* upload(const std::vector<char>& bytes) {
      const int64_t size = std::max<int64_t>(16, (std::ssize(bytes) + 15) / 16 * 16);
      if (size > capacity_) grow(size);
      if (head_ + size > capacity_) {
        synchronize();
        head_ = 0;
      }
      char* device = static_cast<char*>(device_.data()) + head_;
      std::memcpy(host_ + head_, bytes.data(), bytes.size());
      copy_to_device_queued(device, host_ + head_, std::ssize(bytes));
      head_ += size;
      return device;
    }

   private:
    void grow(int64_t size) {
      synchronize();  // nothing queued still reads the old buffers
      if (host_) host_release_pinned(host_);
      host_ = nullptr;
      capacity_ = std::max<int64_t>(size, int64_t{1} << 20);
      host_ = static_cast<char*>(host_allocate_pinned(capacity_));
      device_ = DeviceBuffer(capacity_);
      head_ = 0;
    }

    char* host_ = nullptr;
    DeviceBuffer device_;
    int64_t capacity_ = 0, head_ = 0;
  };

  // The host arrays of one decode operation, packed into one upload (16-byte aligned each).
  class Descriptors {
   public:
    // Appends n elements; returns their offset in the upload.
    template <typename T>
    size_t add(const T* host, int64_t n) {
      const size_t at = (bytes_.size() + 15) / 16 * 16, size = static_cast<size_t>(n) * sizeof(T);
      bytes_.resize(at + size);
      if (size > 0) std::memcpy(bytes_.data() + at, host, size);
      return at;
    }
    void upload(DescriptorRing& ring) { base_ = ring.upload(bytes_); }
    // The device address of the elements added at `offset` (after upload).
    template <typename T>
    T* at(size_t offset) const {
      return reinterpret_cast<T*>(base_ + offset);
    }

   private:
    std::vector<char> bytes_;
    char* base_ = nullptr;
  };

  // One host array of a decode operation on its way to the device (a Descriptors of one).
  template <typename T>
  T* upload(const T* host, int64_t n) {
    Descriptors up;
    const size_t at = up.add(host, n);
    up.upload(descriptors_);
    return up.at<T>(at);
  }

  float* floats(int64_t n) {
    return static_cast<float*>(workspace_.get(n * static_cast<int64_t>(sizeof(float))));
  }

  std::string name_;
  EventClock clock_;
  Workspace workspace_;         // the float and double scratch of one operation at a time
  Workspace sort_workspace_;    // CUB's temporary storage for the radix sorts
  DescriptorRing descriptors_;  // the decode operations' host arrays
  std::map<int64_t, int64_t> query_caps_;  // grouped decode attention's queries a block, by d
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int index, const std::string& what) {
  return std::make_unique<CudaBackend>(open_gpu(index, what));
}

}  // namespace foundry::gpu
