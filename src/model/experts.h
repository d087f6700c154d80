// The experts of the MoE sublayers (internal to model/): each expert is a SwiGLU MLP,
//   h = xs·W13ᵀ [rows, 2F] (gate | up),  act = swiglu(h) [rows, F],  ys = act·W2ᵀ [rows, C],
// run on the rows routed to it, which sit contiguous in a matrix sorted by expert. Locally
// (every expert here) or, with an expert-parallel group, by the experts' owners: the rows
// travel to them and back around the computation (model/expert_parallel.h).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/compute.h"
#include "model/expert_parallel.h"

namespace foundry {

namespace gpu {
class NcclGroup;
}

// Slab offsets of one MoE sublayer's experts.
struct ExpertWeights {
  std::vector<int64_t> w13;  // per expert: [2F, C] (gate rows then up rows)
  std::vector<int64_t> w2;   // per expert: [C, F]
};

class Experts {
 public:
  Experts(Compute& cx, int64_t n_layers);
  ~Experts();

  // Shards the experts over `group` (null: all local). Validates before changing anything.
  // `nccl` (on a device, optional): the same group over NCCL, which then carries the rows.
  void set_group(const Communicator* group, gpu::NcclGroup* nccl = nullptr);
  const Communicator* group() const;
  const ExpertSharding* sharding() const;
  // True when the owners keep the hidden activations (h, act) of the rows they compute, so
  // the caller needs none.
  bool parallel() const { return ep_ != nullptr; }
  // Whether backward writes the whole gradient of `p`: the expert weights this process
  // computes (all of them without a group, the owned ones with one).
  bool writes_whole_gradient(const ParamInfo& p) const;

  // Sublayer `layer`'s experts e < E on sorted rows (offsets [E+1] or more; rows from
  // offsets[E] on, the ZAYA1 skip class, are not touched): xs [R, C] → ys [R, C], keeping
  // h [R, 2F] and act [R, F] for the backward (unused when parallel()). act holds the GEMM
  // dtype: under bf16 precision, R·F bf16 values at the start of the buffer.
  void forward(int64_t layer, const int64_t* offsets, const float* xs, float* h, float* act,
               float* ys, const ExpertWeights& w);
  // The backward of the same layer's last forward from dys: dxs [R, C] and the weight
  // gradients of the experts this process computes (both written whole: zero for an expert
  // without rows); dh and dact are scratch shaped like h and act (dh, like act, in the GEMM
  // dtype).
  void backward(int64_t layer, const int64_t* offsets, const float* dys, const float* xs,
                const float* h, const float* act, float* dxs, float* dh, float* dact,
                const ExpertWeights& w);

  // Decoding (never the group): every expert e < E on its sorted rows, as forward does
  // locally; xs [R, C] → ys [R, C], h [R, 2F] and act [R, F] scratch. Each expert's rows run
  // as one GEMM, so the batch's tokens read an expert's weights once.
  void decode(const int64_t* offsets, const float* xs, float* h, float* act, float* ys,
              const ExpertWeights& w) {
    local_forward(offsets, cx_.config.n_experts, xs, h, act, ys, w.w13, w.w2, nullptr);
  }

 private:
  struct Parallel;  // the group, its sharding and per-layer exchanges and buffers
  // `xs_gemm`: the layer's copy of xs in the GEMM dtype, written by the forward and read by
  // the backward (bf16 only; null: no copy kept, as in decoding).
  void local_forward(const int64_t* offsets, int64_t n_experts, const float* xs, float* h,
                     float* act, float* ys, const std::vector<int64_t>& w13,
                     const std::vector<int64_t>& w2, GrowingBuffer* xs_gemm);
  void local_backward(const int64_t* offsets, int64_t n_experts, const float* dys,
                      const float* xs, const float* h, const float* act, float* dxs, float* dh,
                      float* dact, const std::vector<int64_t>& w13,
                      const std::vector<int64_t>& w2, GrowingBuffer* xs_gemm);

  Compute& cx_;
  int64_t n_layers_;
  std::unique_ptr<Parallel> ep_;
  std::vector<GrowingBuffer> xs_gemm_;  // per layer: its rows in bf16 (bf16 precision)
};

}  // namespace foundry
