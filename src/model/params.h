// The parameter table: every trainable tensor's name, shape and offset into one contiguous
// slab. Gradients and optimizer moments are slabs with the same layout. The table is the
// single source of truth for initialization, parameter counts, weight-decay groups,
// checkpoint contents and tensor names (Hugging Face names: Mixtral's for arch "moe", ZAYA's
// for arch "zaya1").
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/config.h"

namespace foundry {

// scale: learned per-channel scalars (residual scaling, the QK temperature, the EDA gamma).
enum class ParamKind { embedding, norm, attention, router, expert, scale };

// How init_weights fills a tensor: Normal(0, value) or the constant value.
enum class ParamInit { normal, constant };

struct ParamInfo {
  std::string name;            // e.g. "model.layers.0.block_sparse_moe.experts.3.w1.weight"
  std::vector<int64_t> shape;  // row-major
  int64_t offset = 0;          // elements into the slab (aligned to 16 elements)
  int64_t numel = 0;
  ParamKind kind = ParamKind::attention;
  int layer = -1;              // -1 for model-wide tensors
  int expert = -1;             // expert index for ParamKind::expert
  bool weight_decay = true;    // false for norms, scales, biases (1-D) and embeddings
  ParamInit init = ParamInit::normal;
  double init_value = 0;       // the standard deviation (normal) or the constant
};

// The 2-D attention and expert weights: what Muon updates when train.optimizer is Muon (the
// embedding, norms, scales and router stay with AdamW; optim/muon.h says why).
inline bool is_muon_matrix(const ParamInfo& info) {
  return (info.kind == ParamKind::attention || info.kind == ParamKind::expert) &&
         info.shape.size() == 2;
}

// The elements of those matrices, from the config alone (no table built: the sizing search
// asks for thousands of configs): q, k, v and o of every layer, and each expert's three
// (a dense model's MLP is its one expert).
int64_t muon_matrix_elements(const ModelConfig& config);

class ParamTable {
 public:
  explicit ParamTable(const ModelConfig& config);

  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo& get(const std::string& name) const;  // fails on an unknown name
  const ParamInfo* find(const std::string& name) const;
  int64_t total_elements() const { return total_; }      // slab size incl. alignment padding
  int64_t parameter_count() const;                       // sum of numel

 private:
  void add_standard_layer(const ModelConfig& c, int layer);
  void add_zaya_layer(const ModelConfig& c, int layer);
  void add_residual_scaling(const std::string& prefix, int64_t channels, int layer);
  // Appends a tensor, on a 64-byte boundary unless `follows_previous` (then it starts right
  // after the previous tensor, so the two form one matrix for a fused GEMM).
  ParamInfo& add(std::string name, std::vector<int64_t> shape, ParamKind kind, int layer,
                 int expert = -1, bool follows_previous = false);
  std::vector<ParamInfo> params_;
  std::unordered_map<std::string, size_t> index_;
  int64_t total_ = 0;
};

}  // namespace foundry
