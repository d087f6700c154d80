// What every sublayer computes with (internal to model/): the config, the backend that runs
// the arithmetic (kernels/backend.h: every kernel call, product, fill and copy of a sublayer
// goes through `ops`), the parameter and gradient slabs with the bf16 GEMM copies, the op
// timers, the hook that reports finished gradients, and the bf16 conversion scratch. Model
// owns one; the sublayer functions (attention.h, cca_sublayer.h, moe_sublayer.h, routers.h,
// lm_head.h) take it by reference.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

#include "base/arena.h"
#include "base/bf16.h"
#include "base/timer.h"
#include "kernels/backend.h"
#include "kernels/gemm.h"
#include "model/config.h"

namespace foundry {

class ContextParallel;

// The batch shape of a forward/backward: B sequences of T tokens, N = B·T rows. With context
// parallelism over C ranks (`context` = C > 1) the rows are this rank's two chunks of each
// sequence (model/context_parallel.h): seq = 2·Tc local rows of sequences of C·seq tokens.
struct BatchShape {
  int64_t batch = 0, seq = 0;
  int64_t context = 1;
  int64_t rows() const { return batch * seq; }
  int64_t full_seq() const { return seq * context; }
  int64_t chunk() const { return seq / 2; }  // Tc (context parallel only)
  bool operator==(const BatchShape&) const = default;
};

// Where a sublayer's backward puts d loss/d its input x through the pre-norm: added to dx,
// or, with a residual (ZAYA1's residual scaling, folded into the norm's pass), written as
// dx = residual_scale ⊙ residual + the norm's gradient.
struct InputGradient {
  InputGradient(float* dx) : dx(dx) {}  // NOLINT: a plain gradient buffer accumulates
  InputGradient(float* dx, const float* residual, const float* residual_scale)
      : dx(dx), residual(residual), residual_scale(residual_scale) {}
  float* dx;
  const float* residual = nullptr;        // [N, C]
  const float* residual_scale = nullptr;  // [C]
};

class Compute {
 public:
  Compute(const ModelConfig& config, DType precision, Backend& backend, float* params,
          float* grads, const bf16* params_bf16, OpTimes* times,
          const std::function<void(int64_t)>* gradients_final)
      : config(config), precision(precision), ops(backend), params_(params), grads_(grads),
        params_bf16_(params_bf16), times_(times), gradients_final_(gradients_final) {}

  const ModelConfig& config;
  const DType precision;
  Backend& ops;
  // The context-parallel group, or null (Model::set_context_parallel).
  ContextParallel* context_parallel = nullptr;
  // Gradient accumulation (Model::set_loss_weight, Model::backward): the weight of the
  // forward's losses in the gradient, and whether backward adds to the experts' gradients
  // (which it otherwise writes whole).
  double loss_weight = 1;
  bool accumulate_grads = false;

  const float* p(int64_t offset) const { return params_ + offset; }  // fp32 parameters
  float* g(int64_t offset) const { return grads_ + offset; }         // their gradients
  // A GEMM weight operand: the bf16 copy in bf16, the fp32 tensor otherwise.
  const void* weight(int64_t offset) const;
  // A GEMM input operand in the GEMM precision: x itself in fp32, else a bf16 copy in
  // scratch slot `slot` (0..2; a slot is reused by the next call with the same slot), or in
  // `keep`, a buffer the caller owns (grown as needed) to use the copy again later.
  const void* input(const float* x, int64_t n, int slot);
  const void* input(const float* x, int64_t n, GrowingBuffer& keep) const;

  // Where activation arenas come from: host pages (null) for a backend with host memory,
  // else the backend's allocations.
  const BlockSource* arena_source() const {
    return ops.host_memory() ? nullptr : &arena_source_;
  }

  // y [n, out] = x [n, in] · Wᵀ (accumulated into y when `accumulate`), W [out, in] at
  // `weight_offset`; x is converted in scratch slot `slot`.
  void linear_forward(float* y, const float* x, int64_t weight_offset, int64_t n, int64_t out,
                      int64_t in, int slot = 0, bool accumulate = false);
  // dx [n, in] (+)= dy · W (skipped when dx is null); dW [out, in] += dyᵀ · x.
  void linear_backward(float* dx, const float* dy, const float* x, int64_t weight_offset,
                       int64_t n, int64_t out, int64_t in, bool accumulate_dx);
  // The same with dy already in the GEMM precision (`dy_in`: float in fp32, bf16 in bf16),
  // its rows `dy_ld` elements apart.
  void linear_backward(float* dx, const void* dy_in, int64_t dy_ld, const float* x,
                       int64_t weight_offset, int64_t n, int64_t out, int64_t in,
                       bool accumulate_dx);

  // Several projections of one input x [n, in] (q/k/v of attention, the CCA's qk and v):
  // dx [n, in] = Σ_i dy_i · W_i (written, not accumulated), dW_i += dy_iᵀ · x.
  struct Projection {
    const float* dy;     // [n, out]
    int64_t weight;      // slab offset of W [out, in]
    int64_t out;
  };
  void projections_backward(float* dx, const float* x, int64_t n, int64_t in,
                            std::initializer_list<Projection> projections);

  // A pre-norm's backward: `to` gets d loss/d x from dn [n, c] = d loss/d rmsnorm(x) (timed
  // as "rmsnorm").
  void rmsnorm_backward(const InputGradient& to, int64_t weight_offset, const float* dn,
                        const float* x, const float* rstd, int64_t n, int64_t c);

  ScopedOpTimer time(const char* op) { return ScopedOpTimer(times_, op); }
  OpTimes& op_times() { return *times_; }
  // Every gradient at slab offset >= `offset` is final for this backward (model.h).
  void gradients_final(int64_t offset) const {
    if (*gradients_final_) (*gradients_final_)(offset);
  }
  // A layer's forward or backward is done (model.h, set_progress_hook).
  void progress(const char* phase) const {
    if (progress_ && *progress_) (*progress_)(phase);
  }
  void set_progress(const std::function<void(const char*)>* hook) { progress_ = hook; }

 private:
  float* params_;
  float* grads_;
  const bf16* params_bf16_;
  OpTimes* times_;
  const std::function<void(int64_t)>* gradients_final_;
  const std::function<void(const char*)>* progress_ = nullptr;
  GrowingBuffer scratch_[3]{GrowingBuffer(ops), GrowingBuffer(ops), GrowingBuffer(ops)};
  BlockSource arena_source_{
      [this](size_t bytes) { return ops.allocate(static_cast<int64_t>(bytes)); },
      [this](void* block) { ops.release(block); }};
};

}  // namespace foundry
