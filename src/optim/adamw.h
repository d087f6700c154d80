// AdamW (Loshchilov & Hutter) over the parameter slab: fp32 parameters, gradients and two
// fp32 moment slabs laid out exactly like the parameter slab (ParamTable::total_elements()).
//
// For step t (1-based), learning rate lr, and each element with gradient g:
//   m  = beta1 * m + (1 - beta1) * g                          ("exp_avg")
//   v  = beta2 * v + (1 - beta2) * g * g                      ("exp_avg_sq")
//   p  = p * (1 - lr * weight_decay)                          (decay group only; decoupled)
//   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// This is the order and form of torch.optim.AdamW. Scalars are computed in double and
// rounded to float once; the elementwise math is float.
//
// Weight-decay group: tensors with ParamInfo::weight_decay (every matrix except the
// embedding), plus the embedding when AdamWOptions::decay_embeddings is set. Norm weights
// are never decayed. Alignment padding between tensors is never read or written.
//
// Tensors for which AdamWOptions::applies returns false (e.g. the matrices that Muon
// updates, see optim/muon.h) are skipped: neither they nor their moments are read or
// written, so their moments stay zero. Unset, every tensor is updated.
//
// Deterministic: the slab is cut into fixed chunks (optim/slab_chunks.h) processed in
// parallel, and each element's update depends only on its own values, so results are
// bitwise identical for any OpenMP thread count.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/bf16.h"
#include "base/page_slab.h"
#include "model/params.h"
#include "optim/slab_chunks.h"

namespace foundry {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  bool decay_embeddings = false;  // put the (tied) embedding matrix in the decay group
  // Which tensors this optimizer updates; empty = all of them.
  std::function<bool(const ParamInfo&)> applies;
};

// Work fused into an update's one pass over the slab. The gradient is used as g · grad_scale
// (the clip factor, rounded to float: the same bits as scaling the slab first, and g itself
// at 1). When weights_bf16 is set (a slab laid out like the parameters), the bf16 copy of
// every updated weight is written there while the weight is still in cache.
struct StepFusion {
  float grad_scale = 1.0f;
  bf16* weights_bf16 = nullptr;
};

// Per-step constants of the update, each rounded to float once; and the elementwise update
// of n consecutive elements (p16: their bf16 copy, or null). Shared by AdamW and the ZeRO-1
// optimizer (optim/zero1.h), so a sharded step does exactly the single-process arithmetic.
struct AdamWScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float step_size;         // lr / (1 - beta1^t)
  float sqrt_correction2;  // sqrt(1 - beta2^t)
  float eps;
  float decay_factor;  // 1 - lr * weight_decay
};
AdamWScalars adamw_scalars(const AdamWOptions& options, double lr, int64_t step);
void adamw_chunk(float* __restrict p, const float* __restrict g, float* __restrict m,
                 float* __restrict v, int64_t n, const AdamWScalars& s, bool decay,
                 float grad_scale = 1.0f, bf16* __restrict p16 = nullptr);

class AdamW {
 public:
  // Allocates zeroed moment slabs of table.total_elements() floats each.
  AdamW(const ParamTable& table, const AdamWOptions& options);

  // One update of `params` from `grads` (both slabs of table.total_elements() floats).
  // `step` is the 1-based index of this update; it sets the bias corrections, so a resumed
  // run passes the same step numbers it would have without the interruption.
  void step(float* params, const float* grads, double lr, int64_t step,
            const StepFusion& fusion = {});

  // The moment slabs by name ("exp_avg", "exp_avg_sq"), for checkpoints. Fails on an
  // unknown name.
  std::span<float> state(std::string_view name);
  std::span<const float> state(std::string_view name) const;
  static const std::vector<std::string>& state_names();

  void reset();                               // zeroes both moments
  bool decays(const ParamInfo& info) const;   // is the tensor in the weight-decay group?
  bool updates(const ParamInfo& info) const;  // does this optimizer update the tensor?
  const AdamWOptions& options() const { return options_; }
  int64_t slab_elements() const { return static_cast<int64_t>(exp_avg_.size()); }

 private:
  AdamWOptions options_;
  std::vector<SlabChunk> chunks_;
  PageSlab<float> exp_avg_, exp_avg_sq_;
};

}  // namespace foundry
