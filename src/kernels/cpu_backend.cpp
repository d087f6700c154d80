#include "kernels/cpu_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <vector>

#include "base/aligned_memory.h"
#include "base/error.h"
#include "base/slab_chunks.h"
#include "kernels/attention.h"
#include "kernels/cca.h"
#include "kernels/ops.h"
#include "kernels/zaya_router.h"

namespace foundry {

void* Backend::allocate_host(int64_t bytes) {
  constexpr size_t kAlign = 64;
  const size_t size = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + kAlign - 1) / kAlign * kAlign;
  return allocate_aligned(kAlign, size);
}

void Backend::release_host(void* block) { free_aligned(block); }

void Backend::copy_blocks(void* dst, int64_t dst_stride, const void* src, int64_t src_stride,
                          int64_t block_bytes, int64_t blocks) {
  FOUNDRY_CHECK(block_bytes >= 0 && blocks >= 0 && dst_stride >= block_bytes &&
                src_stride >= block_bytes);
  for (int64_t i = 0; i < blocks; ++i)
    copy(static_cast<char*>(dst) + i * dst_stride, static_cast<const char*>(src) + i * src_stride,
         block_bytes);
}

namespace {

// Copies made at once (host memory), or, posing as a device, late: a copy lands when waited
// for, or at the second landed() query of it (never at the first), so that a caller meets
// both copies that are still on their way and copies that landed while it did other work.
class CpuCopyQueue final : public Backend::CopyQueue {
 public:
  explicit CpuCopyQueue(bool deferred) : deferred_(deferred) {}
  int64_t queue(void* host, const void* src, int64_t bytes) override {
    if (deferred_)
      copies_.push_back({host, src, bytes});
    else
      std::memcpy(host, src, static_cast<size_t>(bytes));
    return next_++;
  }
  bool landed(int64_t i) override {
    FOUNDRY_CHECK(i >= 0 && i < next_);
    if (!deferred_ || i < done_) return true;
    if (asked_.insert(i).second) return false;
    wait(i);
    return true;
  }
  void wait(int64_t i) override {
    FOUNDRY_CHECK(i >= 0 && i < next_);
    for (; done_ <= i && deferred_; ++done_) {
      const Copy& c = copies_[static_cast<size_t>(done_)];
      std::memcpy(c.host, c.src, static_cast<size_t>(c.bytes));
    }
  }
  void restart() override {
    copies_.clear();
    asked_.clear();
    next_ = done_ = 0;
  }

 private:
  struct Copy {
    void* host;
    const void* src;
    int64_t bytes;
  };
  bool deferred_;
  std::vector<Copy> copies_;
  std::set<int64_t> asked_;  // copies landed() was asked about once
  int64_t next_ = 0, done_ = 0;
};

}  // namespace

std::unique_ptr<Backend::CopyQueue> Backend::copy_queue() {
  FOUNDRY_CHECK(host_memory());  // a device's backend has its own
  return std::make_unique<CpuCopyQueue>(/*deferred=*/false);
}

namespace {

// A thin forwarding layer: each call is the CPU kernel of the same name.
class CpuBackend final : public Backend {
 public:
  static constexpr size_t kAlign = 256;
  explicit CpuBackend(bool posing_as_device = false) : posing_(posing_as_device) {}

  const char* name() const override { return posing_ ? "cpu (posing as a device)" : "cpu"; }
  bool host_memory() const override { return !posing_; }

  void* allocate(int64_t bytes) override {
    const size_t size = (static_cast<size_t>(bytes) + kAlign - 1) / kAlign * kAlign;
    void* p = allocate_aligned(kAlign, size);
    std::memset(p, 0, size);
    return p;
  }
  void release(void* block) override {
    {
      if (posing_) wait_host_copies();  // the work queued so far, as a GPU's free waits for it
      std::lock_guard<std::mutex> lock(slabs_mutex_);
      if (auto it = slabs_.find(block); it != slabs_.end()) {
        it->second.unmap(block);
        slabs_.erase(it);
        return;
      }
    }
    free_aligned(block);
  }
  // Posing as a device, a slab is made as a GPU's (cuda/slab.cu): chunks (of pages), its
  // holes' chunks mapping one chunk of its own each kind (a memfd mapped shared at each place),
  // the zeros read-only, so that a write there is a crash the tests see and a read of scratch
  // finds whatever another place last wrote, as on a GPU.
  void* allocate_slab(int64_t bytes, const ByteRanges& byte_holes, Released holes_read) override {
    if (!posing_) return allocate(bytes);
    PosingSlab s;
    s.chunk = static_cast<size_t>(slab_chunk_bytes(bytes, page_bytes()));
    s.mapped = (static_cast<size_t>(bytes) + s.chunk - 1) / s.chunk * s.chunk;
    void* p = mmap(nullptr, s.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    s.own.assign(s.mapped / s.chunk, true);
    try {
      make_holes(p, s, byte_holes, holes_read);
    } catch (...) {
      s.unmap(p);
      throw;
    }
    std::lock_guard<std::mutex> lock(slabs_mutex_);
    slabs_.emplace(p, std::move(s));
    return p;
  }
  int64_t release_slab_ranges(void* slab, const ByteRanges& byte_ranges, Released reads) override {
    if (!posing_) return 0;
    wait_host_copies();  // after the work queued so far, as on a GPU
    std::lock_guard<std::mutex> lock(slabs_mutex_);
    auto it = slabs_.find(slab);
    FOUNDRY_CHECK(it != slabs_.end());
    return make_holes(slab, it->second, byte_ranges, reads);
  }
  int64_t slab_memory_bytes(const void* slab, int64_t bytes) const override {
    if (!posing_) return bytes;
    std::lock_guard<std::mutex> lock(slabs_mutex_);
    auto it = slabs_.find(const_cast<void*>(slab));
    FOUNDRY_CHECK(it != slabs_.end());
    const PosingSlab& s = it->second;
    const int64_t own = std::count(s.own.begin(), s.own.end(), true);
    const int64_t aliases = (s.zeros_fd >= 0) + (s.scratch_fd >= 0);
    return (own + aliases) * static_cast<int64_t>(s.chunk);
  }
  void fill(float* x, int64_t n, float value) override { std::fill(x, x + n, value); }
  void fill(int32_t* x, int64_t n, int32_t value) override { std::fill(x, x + n, value); }
  void zero(void* x, int64_t bytes) override { std::memset(x, 0, static_cast<size_t>(bytes)); }
  void copy(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void to_host(void* host, const void* src, int64_t bytes) override { copy(host, src, bytes); }
  // Posing as a device, a copy to the host is made only when wait_host_copies() runs (from
  // any thread), as late as a GPU's may land: a caller that reads the destination before
  // waiting, or changes the source before the wait, is caught by the tests taking this path.
  void to_host_async(void* host, const void* src, int64_t bytes) override {
    if (!posing_) return copy(host, src, bytes);
    std::lock_guard<std::mutex> lock(copies_mutex_);
    queued_copies_.push_back({host, src, bytes});
  }
  void wait_host_copies() override {
    std::lock_guard<std::mutex> lock(copies_mutex_);
    for (const QueuedCopy& c : queued_copies_) copy(c.host, c.src, c.bytes);
    queued_copies_.clear();
  }
  void from_host(void* dst, const void* host, int64_t bytes) override { copy(dst, host, bytes); }
  std::unique_ptr<CopyQueue> copy_queue() override {
    return std::make_unique<CpuCopyQueue>(/*deferred=*/posing_);
  }
  void to_bf16(bf16* out, const float* x, int64_t n) override { convert_to_bf16(x, out, n); }

  void gemm(const void* a, bool trans_a, const void* b, bool trans_b, float* c, int64_t m,
            int64_t n, int64_t k, DType dtype, bool accumulate, int64_t lda) override {
    if (lda == 0) return foundry::gemm(a, trans_a, b, trans_b, c, m, n, k, dtype, accumulate);
    const MatView av = trans_a ? MatView::transposed(a, dtype, m, k, lda)
                               : MatView::rows_major(a, dtype, m, k, lda);
    const MatView bv =
        trans_b ? MatView::transposed(b, dtype, k, n) : MatView::rows_major(b, dtype, k, n);
    matmul(av, bv, OutView::rows_major(c, m, n), accumulate);
  }
  void products(const std::vector<int64_t>& costs,
                const std::function<void(int64_t)>& task) override {
    run_products(costs, task);
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t n,
                         int64_t c) override {
    ops::embedding_forward(out, tokens, wte, n, c);
  }
  void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t n,
                          int64_t c, int64_t v) override {
    ops::embedding_backward(dwte, dout, tokens, n, c, v);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t n,
                       int64_t c, float eps) override {
    ops::rmsnorm_forward(out, rstd, in, weight, n, c, eps);
  }
  void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in,
                        const float* weight, const float* rstd, int64_t n, int64_t c) override {
    ops::rmsnorm_backward(din, dweight, dout, in, weight, rstd, n, c);
  }
  void rmsnorm_backward_residual(float* din, float* dweight, const float* dout, const float* in,
                                 const float* weight, const float* rstd, const float* residual,
                                 const float* residual_scale, int64_t n, int64_t c) override {
    ops::rmsnorm_backward_residual(din, dweight, dout, in, weight, rstd, residual, residual_scale,
                                   n, c);
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
    ops::swiglu_forward_bf16(out, h, n, f);
  }
  void swiglu_backward_bf16(bf16* dh, const float* dout, const float* h, int64_t n,
                            int64_t f) override {
    ops::swiglu_backward_bf16(dh, dout, h, n, f);
  }

  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const ops::AttentionShape& s, DType dtype) override {
    ops::attention_forward(out, lse, q, k, v, s, dtype);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          const ops::AttentionShape& s, DType dtype) override {
    ops::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, s, dtype);
  }
  void attention_chunk_forward(float* out, float* lse, const float* q, const float* k,
                               const float* v, const ops::AttentionChunk& c, DType dtype,
                               const std::function<void()>& between_blocks) override {
    ops::attention_chunk_forward(out, lse, q, k, v, c, dtype, between_blocks);
  }
  void attention_chunk_backward(float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* lse, const float* q, const float* k,
                                const float* v, const ops::AttentionChunk& c, DType dtype,
                                const std::function<void()>& between_blocks) override {
    ops::attention_chunk_backward(dq, dk, dv, dout, out, lse, q, k, v, c, dtype, between_blocks);
  }

  void router_forward(float* probs, int32_t* topk_idx, float* topk_w, const float* logits,
                      int64_t n, int64_t e, int64_t k, bool renormalize) override {
    ops::router_forward(probs, topk_idx, topk_w, logits, n, e, k, renormalize);
  }
  void class_counts(int64_t* counts, const int32_t* choice, int64_t n, int64_t k,
                    int64_t classes) override {
    ops::zaya_class_counts(counts, choice, n, k, classes);
  }
  void expert_fractions(double* fractions, const int32_t* topk_idx, int64_t n, int64_t e,
                        int64_t k) override {
    const std::vector<int64_t> counts = ops::expert_counts(topk_idx, n, e, k);
    for (int64_t j = 0; j < e; ++j)
      fractions[j] = static_cast<double>(counts[j]) / static_cast<double>(n * k);
  }
  void router_aux_loss(double* aux, const float* probs, const double* fractions, int64_t n,
                       int64_t e) override {
    *aux = ops::router_aux_loss<float>(probs, nullptr, n, e, 0, fractions);
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
    ops::moe_dispatch_plan(expert_offsets, slot_token, assignment_slot, topk_idx, n, e, k);
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
    *mean_loss = ops::cross_entropy(dlogits, losses, logits, targets, n, v, vp, grad_scale);
  }
  void cross_entropy_bf16(bf16* dlogits, int64_t ld, float* losses, double* mean_loss,
                          const float* logits, const int32_t* targets, int64_t n, int64_t v,
                          int64_t vp, float grad_scale) override {
    *mean_loss = ops::cross_entropy(dlogits, ld, losses, logits, targets, n, v, vp, grad_scale);
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
    ops::cca_depthwise_conv_backward(dc, dw0, db0, dy, c, w0, b, t, channels, taps);
  }
  void cca_grouped_conv_forward(float* z, const float* y, const float* w1, const float* b1,
                                const float* before, int64_t b, int64_t t, int64_t groups,
                                int64_t d, int64_t taps, DType dtype) override {
    ops::cca_grouped_conv_forward_gemm(z, y, w1, b1, before, b, t, groups, d, taps, dtype);
  }
  void cca_grouped_conv_backward(float* dy, float* dw1, float* db1, float* dbefore, const float* dz,
                                 const float* y, const float* w1, const float* before, int64_t b,
                                 int64_t t, int64_t groups, int64_t d, int64_t taps,
                                 DType dtype) override {
    ops::cca_grouped_conv_backward_gemm(dy, dw1, db1, dbefore, dz, y, w1, before, b, t, groups, d,
                                        taps, dtype);
  }
  // bf16 with t1 ≤ 2: y goes straight into the grouped convolution's stacked rows, which
  // `kept` holds in its place (kernels/cca.h).
  void cca_convs_forward(float* qk, float* kept, const float* c, const float* w0,
                         const float* b0, const float* w1, int64_t b, int64_t t, int64_t groups,
                         int64_t d, int64_t t0, int64_t t1, DType dtype) override {
    if (!ops::cca_convs_fused(t1, dtype))
      return Backend::cca_convs_forward(qk, kept, c, w0, b0, w1, b, t, groups, d, t0, t1, dtype);
    ops::cca_convs_forward_gemm(qk, kept, c, w0, b0, w1, b, t, groups, d, t0, t1);
  }
  void cca_convs_qk_norm_forward(float* q, float* k, float* rnorm, float* qk, float* kept,
                                 const float* c, const float* w0, const float* b0,
                                 const float* w1, const float* b1, const float* temp, int64_t b,
                                 int64_t t, int64_t hq, int64_t hk, int64_t d, int64_t t0,
                                 int64_t t1, float eps, DType dtype) override {
    if (!ops::cca_convs_fused(t1, dtype))
      return Backend::cca_convs_qk_norm_forward(q, k, rnorm, qk, kept, c, w0, b0, w1, b1, temp, b,
                                                t, hq, hk, d, t0, t1, eps, dtype);
    ops::cca_convs_qk_norm_forward_gemm(q, k, rnorm, qk, kept, c, w0, b0, w1, b1, temp, b, t, hq,
                                        hk, d, t0, t1, eps);
  }
  void cca_convs_backward(float* dc, float* dw0, float* db0, float* dw1, float* db1, float* dy,
                          const float* dqk, const float* kept, const float* c, const float* w0,
                          const float* b0, const float* w1, int64_t b, int64_t t, int64_t groups,
                          int64_t d, int64_t t0, int64_t t1, DType dtype) override {
    if (!ops::cca_convs_fused(t1, dtype))
      return Backend::cca_convs_backward(dc, dw0, db0, dw1, db1, dy, dqk, kept, c, w0, b0, w1, b, t,
                                         groups, d, t0, t1, dtype);
    ops::cca_convs_backward_gemm(dc, dw0, db0, dw1, db1, dy, dqk, kept, c, w0, w1, b, t, groups, d,
                                 t0, t1);
  }
  void cca_qk_norm_convs_backward(float* dc, float* dtemp, float* dw0, float* db0, float* dw1,
                                  float* db1, float* dqk, float* dy, const float* dq,
                                  const float* dk, const float* qk, const float* rnorm,
                                  const float* temp, const float* kept, const float* c,
                                  const float* w0, const float* b0, const float* w1, int64_t b,
                                  int64_t t, int64_t hq, int64_t hk, int64_t d, int64_t t0,
                                  int64_t t1, DType dtype) override {
    if (!ops::cca_convs_fused(t1, dtype))
      return Backend::cca_qk_norm_convs_backward(dc, dtemp, dw0, db0, dw1, db1, dqk, dy, dq, dk, qk,
                                                 rnorm, temp, kept, c, w0, b0, w1, b, t, hq, hk, d,
                                                 t0, t1, dtype);
    ops::cca_qk_norm_convs_backward_gemm(dc, dtemp, dw0, db0, dw1, db1, /*scratch=*/dy, dq, dk, qk,
                                         rnorm, temp, kept, c, w0, w1, b, t, hq, hk, d, t0, t1);
  }
  void cca_value_shift_forward(float* v, int64_t b, int64_t t, int64_t half) override {
    ops::cca_value_shift_inplace_forward(v, static_cast<float*>(nullptr), b, t, half);
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
    ops::cca_qk_norm_backward(dqk, dtemp, dq, dk, qk, rnorm, temp, n, hq, hk, d);
  }
  void cca_means_qk_norm_forward(float* q, float* k, float* rnorm, float* qk, const float* c,
                                 const float* b1, const float* temp, int64_t n, int64_t hq,
                                 int64_t hk, int64_t d, float eps) override {
    ops::cca_means_qk_norm_forward(q, k, rnorm, qk, c, b1, temp, n, hq, hk, d, eps);
  }
  void cca_qk_norm_means_backward(float* dqk, float* dc, float* dtemp, const float* dq,
                                  const float* dk, const float* qk, const float* rnorm,
                                  const float* temp, int64_t n, int64_t hq, int64_t hk,
                                  int64_t d) override {
    ops::cca_qk_norm_means_backward(dqk, dc, dtemp, dq, dk, qk, rnorm, temp, n, hq, hk, d);
  }

  void bias_add_forward(float* y, const float* bias, int64_t n, int64_t m) override {
    ops::bias_add_forward(y, bias, n, m);
  }
  void bias_add_backward(float* dbias, const float* dy, int64_t n, int64_t m) override {
    ops::bias_add_backward(dbias, dy, n, m);
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
  void gelu_bias_forward(float* g, float* a, const float* bias, int64_t n, int64_t c) override {
    ops::gelu_bias_forward(g, a, bias, n, c);
  }
  void gelu_bias_backward(float* da, float* dbias, const float* dg, const float* kept, int64_t n,
                          int64_t c) override {
    ops::gelu_bias_backward(da, dbias, dg, kept, n, c);
  }
  void eda_backward(float* dr_prev, float* dgamma, const float* dr, const float* r_prev,
                    const float* gamma, int64_t n, int64_t r_dim) override {
    ops::eda_backward(dr_prev, dgamma, dr, r_prev, gamma, n, r_dim);
  }
  void zaya_gating_forward(float* probs, int32_t* choice, float* gate, const float* logits,
                           const float* balance_bias, ops::BiasOn bias_on, int64_t n, int64_t e,
                           int64_t k, bool skip_class, bool skip_passes_input) override {
    ops::zaya_gating_forward(probs, choice, gate, logits, balance_bias, bias_on, n, e, k,
                             skip_class, skip_passes_input);
  }
  void zaya_gating_backward(float* dlogits, const float* dgate, const float* probs,
                            const int32_t* choice, int64_t n, int64_t e, int64_t k,
                            bool skip_class, bool skip_passes_input) override {
    ops::zaya_gating_backward(dlogits, dgate, probs, choice, n, e, k, skip_class,
                              skip_passes_input);
  }
  void zaya_boundary_counts(int64_t* near, const float* probs, const float* logits,
                            const float* balance_bias, ops::BiasOn bias_on,
                            const int32_t* choice, int64_t n, int64_t classes, int64_t k,
                            double window) override {
    ops::zaya_boundary_counts(near, probs, logits, balance_bias, bias_on, choice, n, classes, k,
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
                                 h, alpha_res, beta_res, alpha_h, beta_h, n, c);
  }
  void residual_scale_backward_params(void* dh, DType dh_type, float* dalpha_res,
                                      float* dbeta_res, float* dalpha_h, float* dbeta_h,
                                      const float* dout, const float* res, const float* h,
                                      const float* alpha_res, const float* beta_res,
                                      const float* alpha_h, const float* beta_h, int64_t n,
                                      int64_t c) override {
    if (dh_type == DType::bf16)
      ops::residual_scale_backward_params(static_cast<bf16*>(dh), dalpha_res, dbeta_res, dalpha_h,
                                          dbeta_h, dout, res, h, alpha_res, beta_res, alpha_h,
                                          beta_h, n, c);
    else
      ops::residual_scale_backward_params(static_cast<float*>(dh), dalpha_res, dbeta_res,
                                          dalpha_h, dbeta_h, dout, res, h, alpha_res, beta_res,
                                          alpha_h, beta_h, n, c);
  }

  void scale_shift_forward(float* out, const float* x, const float* alpha, const float* beta,
                           int64_t n, int64_t c) override {
    ops::scale_shift_forward(out, x, alpha, beta, n, c);
  }
  void scale_shift_backward(float* dx, float* dalpha, float* dbeta, const float* dout,
                            const float* x, const float* alpha, const float* beta, int64_t n,
                            int64_t c) override {
    ops::scale_shift_backward(dx, dalpha, dbeta, dout, x, alpha, beta, n, c);
  }

  void add(float* y, const float* x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }
  void rope_apply_rows(float* x, const int64_t* pos, int64_t rows, int64_t h, int64_t d,
                       int64_t rotary_dim, double theta) override {
    ops::rope_apply_rows(x, pos, rows, h, d, rotary_dim, theta);
  }
  void decode_kv_store(const ops::DecodeSpan* spans, const int64_t* store_at, const float* k,
                       const float* v, int64_t rows, int64_t kvh, int64_t d) override {
    for (int64_t r = 0; r < rows; ++r)
      ops::decode_span_store(spans[r], store_at[r], k + r * kvh * d, v + r * kvh * d, kvh, d);
  }
  void attention_decode_rows(float* out, float* scores, int64_t max_len, const float* q,
                             const ops::DecodeSpan* spans, const int64_t* first, int64_t rows,
                             int64_t h, int64_t kvh, int64_t d) override {
    ops::attention_decode_rows(out, scores, max_len, q, spans, first, rows, h, kvh, d);
  }
  void cca_conv_decode(float* qk, const ops::CcaDims& dims, float* const* states, int64_t rows,
                       const float* c_new, const float* w0, const float* b0, const float* w1,
                       const float* b1) override {
    ops::cca_conv_decode(qk, dims, states, rows, c_new, w0, b0, w1, b1);
  }
  void cca_value_shift_decode(float* v, const ops::CcaDims& dims, float* const* states,
                              int64_t rows) override {
    ops::cca_value_shift_decode(v, dims, states, rows);
  }

 private:
  struct QueuedCopy {
    void* host;
    const void* src;
    int64_t bytes;
  };
  // A slab of the CPU posing as a device: its mapping, chunks, which are its own (not a hole's
  // alias) and the aliases' files.
  struct PosingSlab {
    size_t mapped = 0, chunk = 0;
    std::vector<bool> own;
    int zeros_fd = -1, scratch_fd = -1;
    void unmap(void* base) const {
      munmap(base, mapped);
      for (int fd : {zeros_fd, scratch_fd})
        if (fd >= 0) close(fd);
    }
  };
  static int64_t page_bytes() {
    static const int64_t page = sysconf(_SC_PAGESIZE);
    return page;
  }
  // Maps the alias of `reads` over the chunks of `s` wholly inside `byte_ranges` that are
  // still its own; returns their bytes.
  static int64_t make_holes(void* base, PosingSlab& s, const ByteRanges& byte_ranges,
                            Released reads) {
    int& fd = reads == Released::zeros ? s.zeros_fd : s.scratch_fd;
    int64_t made = 0;
    for (const auto& [begin, end] : byte_ranges) {
      FOUNDRY_CHECK(begin >= 0 && begin <= end && end <= static_cast<int64_t>(s.mapped));
      const auto [first, last] = chunks_inside(begin, end, static_cast<int64_t>(s.chunk));
      for (int64_t i = first; i < last; ++i) {
        if (!s.own[static_cast<size_t>(i)]) continue;
        if (fd < 0) {
          fd = memfd_create("foundry-slab-alias", MFD_CLOEXEC);
          if (fd < 0 || ftruncate(fd, static_cast<off_t>(s.chunk)) != 0) throw std::bad_alloc();
        }
        void* at = static_cast<char*>(base) + i * static_cast<int64_t>(s.chunk);
        const int prot = reads == Released::zeros ? PROT_READ : PROT_READ | PROT_WRITE;
        if (mmap(at, s.chunk, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
          throw std::bad_alloc();
        s.own[static_cast<size_t>(i)] = false;
        made += static_cast<int64_t>(s.chunk);
      }
    }
    return made;
  }
  bool posing_;
  mutable std::mutex slabs_mutex_;
  std::map<void*, PosingSlab> slabs_;  // posing: the slabs
  std::mutex copies_mutex_;
  std::vector<QueuedCopy> queued_copies_;
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

std::unique_ptr<Backend> make_cpu_backend_posing_as_device() {
  return std::make_unique<CpuBackend>(/*posing_as_device=*/true);
}

}  // namespace foundry
