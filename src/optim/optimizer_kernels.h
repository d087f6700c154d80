// The arithmetic of a device optimizer's step (optim/device_optimizer.h), on memory of its
// backend: the GPU's kernels (cuda/adamw.h, cuda/muon.h, cuda/reductions.h), or the CPU's
// (optim/adamw.h, optim/muon.h, optim/clip.h) for a CPU backend posing as a device
// (make_cpu_backend_posing_as_device), so that the device optimizers, their sharding and
// their communication are tested on machines without a GPU.
//
// Both do the same elementwise arithmetic in the same order (no fused multiply-adds); their
// sums of squares and Newton–Schulz products add in other orders.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "base/bf16.h"
#include "optim/adamw.h"
#include "optim/slab_chunks.h"

namespace foundry {

class OptimizerKernels {
 public:
  virtual ~OptimizerKernels() = default;

  // The runs the gradient norm sums over and the runs AdamW updates (SlabChunk: offset,
  // size, decay), as offsets from the pointers the calls below are given. Set once, before
  // the first call.
  virtual void set_runs(const std::vector<SlabChunk>& norm,
                        const std::vector<SlabChunk>& adamw) = 0;

  // Σ g² over the norm runs, in double.
  virtual double sum_of_squares(const float* grads) = 0;
  // AdamW (adamw_chunk's arithmetic) over the AdamW runs: params, grads, moments and (when
  // not null) the bf16 copy all indexed by the runs' offsets.
  virtual void adamw(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                     bf16* params_bf16, const AdamWScalars& s, float grad_scale) = 0;
  // Muon's steps for one matrix of n elements (Muon::step's arithmetic): g' = g·grad_scale;
  // buf = mu·buf + g'; u = nesterov ? g' + mu·buf : buf.
  virtual void muon_momentum(float* u, float* buf, const float* g, int64_t n, float mu,
                             bool nesterov, float grad_scale) = 0;
  // u (rows × cols) = NewtonSchulz(u), in place.
  virtual void newton_schulz(float* u, int64_t rows, int64_t cols, int steps, bool use_bf16) = 0;
  // w = w·keep − step_size·o; w16 (when not null) = w rounded to bf16.
  virtual void muon_apply(float* w, const float* o, int64_t n, float keep, float step_size,
                          bf16* w16) = 0;
};

// The GPU's (in a build without CUDA, its calls fail as every GPU call does).
std::unique_ptr<OptimizerKernels> gpu_optimizer_kernels();
// The CPU's, on host memory.
std::unique_ptr<OptimizerKernels> cpu_optimizer_kernels();

}  // namespace foundry
