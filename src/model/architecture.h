// One architecture as a composition of the sublayers (internal to model/): the standard MoE
// (model/standard_moe.cpp) and ZAYA1 (model/zaya.cpp). Model holds one, chosen once from
// model.arch; everything else about the model (slabs, initialization, balancer state,
// expert-parallel storage) is shared and lives in Model.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/error.h"
#include "kernels/zaya_router.h"
#include "model/attention_sublayer.h"
#include "model/lm_head.h"
#include "model/moe_sublayer.h"
#include "model/compute.h"
#include "model/experts.h"
#include "model/model.h"

namespace foundry {

class Architecture {
 public:
  virtual ~Architecture() = default;
  // inputs/targets [B, T], already checked against the vocabulary and max_seq_len.
  virtual ForwardResult forward(const int32_t* inputs, const int32_t* targets, BatchShape s) = 0;
  virtual void backward() = 0;
  // Logits [N, Vp] of the last forward (which had no targets).
  virtual const float* logits() const = 0;
  // Row offsets [S + 1] of the classes of MoE sublayer `layer` in the last forward, or null
  // before any forward.
  virtual const int64_t* class_offsets(int64_t layer) const = 0;
  // Drops the activations: they cannot be differentiated under another expert-parallel
  // setting (the owned experts' rows live in other buffers).
  virtual void drop_activations() = 0;
  virtual void set_data_parallel(const Communicator* group) {}

  // The buffers of decode steps of up to `batch` rows at positions below max_len, and with
  // `own_caches` the caches of `batch` sequences decoded in step (decode_step).
  virtual std::unique_ptr<DecodeScratch> new_decode(int64_t max_len, int64_t batch,
                                                    bool own_caches) const = 0;
  // tokens [rows.n], each row at its position over its spans (attention_sublayer.h's
  // DecodeRows) → logits [rows.n, Vp] (the padded entries unmasked), both in the backend's
  // memory.
  virtual void decode_rows(DecodeScratch& scratch, const DecodeRows& rows, const int32_t* tokens,
                           float* logits) = 0;
  // The caches of a scratch made with own_caches: in_step(pos) gives the rows of its B
  // sequences at position pos (decode_step).
  virtual const DecodeCaches& own_caches(const DecodeScratch& scratch) const = 0;
};

// The activations both compositions keep, beside their own (an architecture's activation
// struct derives from this one and lays everything out in `arena`).
struct CommonActivations {
  BatchShape shape;
  bool has_targets = false;
  int32_t* inputs = nullptr;   // [N]
  int32_t* targets = nullptr;  // [N] (read only when has_targets)
  const int32_t* targets_if_any() const { return has_targets ? targets : nullptr; }
  std::vector<MoeActs> moe;   // per layer
  LmHeadActs head;
  Arena arena;
  int64_t measured_bytes = 0;  // constructed to measure only: the arena's bytes
};

// What both compositions share: the activations of the last batch shape (Acts derives from
// CommonActivations and is constructed from (config, shape, experts parallel, the arena's
// block source, measure only)), the inputs
// kept for the backward, the logits and the class offsets.
template <typename Acts>
class Composition : public Architecture {
 public:
  const float* logits() const override {
    FOUNDRY_CHECK(acts_ && !acts_->has_targets);
    return acts_->head.logits;
  }
  const int64_t* class_offsets(int64_t layer) const override {
    return acts_ ? acts_->moe[layer].host_offsets.data() : nullptr;
  }
  void drop_activations() override { acts_.reset(); }
  // The bytes of the activation arena of shape s, measured from the layout itself.
  static int64_t arena_bytes(const ModelConfig& c, BatchShape s, bool expert_parallel) {
    return Acts(c, s, expert_parallel, nullptr, /*measure_only=*/true).measured_bytes;
  }

 protected:
  Composition(Compute& cx, Experts& experts) : cx_(cx), experts_(experts) {}

  // The activations for shape s (allocated again when the shape changes), inputs and
  // targets (host memory) checked and copied in.
  Acts& begin_forward(const int32_t* inputs, const int32_t* targets, BatchShape s) {
    if (targets) check_targets(targets, s.rows(), cx_.config.vocab_size);
    if (!acts_ || !(acts_->shape == s))
      acts_ = std::make_unique<Acts>(cx_.config, s, experts_.parallel(), cx_.arena_source());
    const int64_t bytes = s.rows() * static_cast<int64_t>(sizeof(int32_t));
    cx_.ops.from_host(acts_->inputs, inputs, bytes);
    if (targets) cx_.ops.from_host(acts_->targets, targets, bytes);
    acts_->has_targets = targets != nullptr;
    return *acts_;
  }
  // The activations of the last forward, which must have had targets.
  Acts& for_backward() {
    FOUNDRY_CHECK(acts_ && acts_->has_targets);
    return *acts_;
  }

  Compute& cx_;
  Experts& experts_;
  std::unique_ptr<Acts> acts_;
};

// What an architecture computes with, owned by Model.
struct ArchitectureParts {
  Compute& cx;
  Experts& experts;
  const ParamTable& table;
  std::vector<ops::ZayaBalancer>& balancers;  // ZAYA1: one per MoE sublayer
  std::vector<int64_t>& class_counts;         // ZAYA1: [n_layers × classes] of the last forward
  std::vector<int64_t>& boundary_counts;      // ZAYA1, newton rule: the same layout (else empty)
};
std::unique_ptr<Architecture> make_standard_moe(const ArchitectureParts& parts);
std::unique_ptr<Architecture> make_zaya1(const ArchitectureParts& parts);
// Composition::arena_bytes of each.
int64_t standard_moe_arena_bytes(const ModelConfig& c, BatchShape s, bool expert_parallel);
int64_t zaya1_arena_bytes(const ModelConfig& c, BatchShape s, bool expert_parallel);

}  // namespace foundry
