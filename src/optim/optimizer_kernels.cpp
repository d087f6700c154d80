#include "optim/optimizer_kernels.h"

#include <algorithm>
#include <cmath>

#include "cuda/adamw.h"
#include "cuda/muon.h"
#include "cuda/reductions.h"
#include "cuda/runtime.h"
#include "optim/clip.h"
#include "optim/muon.h"

namespace foundry {
namespace {

class GpuOptimizerKernels final : public OptimizerKernels {
 public:
  void set_runs(const std::vector<SlabChunk>& norm, const std::vector<SlabChunk>& adamw) override {
    norm_ = upload(norm, norm_count_);
    adamw_ = upload(adamw, adamw_count_);
    sum_ = gpu::DeviceBuffer(sizeof(double));
  }

  double sum_of_squares(const float* grads) override {
    gpu::ops::sum_of_squares(sum_.as<double>(), grads, norm_.as<gpu::AdamWRange>(), norm_count_,
                             workspace_);
    double sum = 0;
    sum_.download(&sum, sizeof sum);
    return sum;
  }

  void adamw(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
             bf16* params_bf16, const AdamWScalars& s, float grad_scale) override {
    if (adamw_count_ == 0) return;
    const gpu::AdamWCoefficients c{s.beta1,     s.one_minus_beta1,  s.beta2, s.one_minus_beta2,
                                   s.step_size, s.sqrt_correction2, s.eps,   s.decay_factor};
    gpu::adamw_update(params, grads, exp_avg, exp_avg_sq, reinterpret_cast<uint16_t*>(params_bf16),
                      adamw_.as<gpu::AdamWRange>(), adamw_count_, c, grad_scale);
  }

  void muon_momentum(float* u, float* buf, const float* g, int64_t n, float mu, bool nesterov,
                     float grad_scale) override {
    gpu::muon_momentum(u, buf, g, n, mu, nesterov, grad_scale);
  }
  void newton_schulz(float* u, int64_t rows, int64_t cols, int steps, bool use_bf16) override {
    gpu::ops::newton_schulz(u, u, rows, cols, steps, use_bf16, workspace_);
  }
  void muon_apply(float* w, const float* o, int64_t n, float keep, float step_size,
                  bf16* w16) override {
    gpu::muon_apply(w, o, n, keep, step_size, reinterpret_cast<uint16_t*>(w16));
  }

 private:
  static gpu::DeviceBuffer upload(const std::vector<SlabChunk>& runs, int64_t& count) {
    std::vector<gpu::AdamWRange> ranges;
    for (const SlabChunk& r : runs) ranges.push_back({r.offset, r.size, r.decay ? 1 : 0});
    count = static_cast<int64_t>(ranges.size());
    const int64_t bytes = count * static_cast<int64_t>(sizeof(gpu::AdamWRange));
    gpu::DeviceBuffer b(std::max<int64_t>(1, bytes));
    if (bytes > 0) b.upload(ranges.data(), bytes);
    return b;
  }

  gpu::DeviceBuffer norm_, adamw_, sum_;
  int64_t norm_count_ = 0, adamw_count_ = 0;
  gpu::Workspace workspace_;
};

class CpuOptimizerKernels final : public OptimizerKernels {
 public:
  void set_runs(const std::vector<SlabChunk>& norm, const std::vector<SlabChunk>& adamw) override {
    norm_ = cut(norm);
    adamw_ = cut(adamw);
    partial_.resize(norm_.size());
  }

  double sum_of_squares(const float* grads) override {
    chunk_sums_of_squares(
        norm_, [&](int64_t offset) { return grads + offset; }, partial_.data());
    double total = 0;
    for (double s : partial_) total += s;  // fixed order
    return total;
  }

  void adamw(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
             bf16* params_bf16, const AdamWScalars& s, float grad_scale) override {
    const int64_t n = static_cast<int64_t>(adamw_.size());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const SlabChunk& c = adamw_[static_cast<size_t>(i)];
      adamw_chunk(params + c.offset, grads + c.offset, exp_avg + c.offset, exp_avg_sq + c.offset,
                  c.size, s, c.decay, grad_scale, params_bf16 ? params_bf16 + c.offset : nullptr);
    }
  }

  void muon_momentum(float* u, float* buf, const float* g, int64_t n, float mu, bool nesterov,
                     float grad_scale) override {
    foundry::muon_momentum(u, buf, g, n, mu, nesterov, grad_scale);
  }
  void newton_schulz(float* u, int64_t rows, int64_t cols, int steps, bool use_bf16) override {
    newton_schulz_.run(u, u, rows, cols, steps, use_bf16);
  }
  void muon_apply(float* w, const float* o, int64_t n, float keep, float step_size,
                  bf16* w16) override {
    foundry::muon_apply(w, o, n, keep, step_size, w16);
  }

 private:
  // Runs that touch and share a decay setting merged, then cut into the optimizer's fixed
  // chunks (slab_chunks' rule): on the whole slab the norm's chunks are clip's, so its sum
  // has clip's bits.
  static std::vector<SlabChunk> cut(const std::vector<SlabChunk>& runs) {
    std::vector<SlabChunk> merged, out;
    for (const SlabChunk& r : runs) {
      if (!merged.empty() && merged.back().offset + merged.back().size == r.offset &&
          merged.back().decay == r.decay)
        merged.back().size += r.size;
      else
        merged.push_back(r);
    }
    for (const SlabChunk& r : merged)
      for (int64_t at = 0; at < r.size; at += kSlabChunkElements)
        out.push_back({r.offset + at, std::min(kSlabChunkElements, r.size - at), r.decay});
    return out;
  }

  std::vector<SlabChunk> norm_, adamw_;
  std::vector<double> partial_;
  NewtonSchulz newton_schulz_;
};

}  // namespace

std::unique_ptr<OptimizerKernels> gpu_optimizer_kernels() {
  return std::make_unique<GpuOptimizerKernels>();
}
std::unique_ptr<OptimizerKernels> cpu_optimizer_kernels() {
  return std::make_unique<CpuOptimizerKernels>();
}

}  // namespace foundry
