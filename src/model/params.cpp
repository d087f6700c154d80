#include "model/params.h"

#include "base/error.h"

namespace foundry {

ParamTable::ParamTable(const ModelConfig& c) {
  const int64_t C = c.d_model;
  add("model.embed_tokens.weight", {c.padded_vocab(), C}, ParamKind::embedding, -1);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add(p + "input_layernorm.weight", {C}, ParamKind::norm, l);
    add(p + "self_attn.q_proj.weight", {c.q_dim(), C}, ParamKind::attention, l);
    add(p + "self_attn.k_proj.weight", {c.kv_dim(), C}, ParamKind::attention, l);
    add(p + "self_attn.v_proj.weight", {c.kv_dim(), C}, ParamKind::attention, l);
    add(p + "self_attn.o_proj.weight", {C, c.q_dim()}, ParamKind::attention, l);
    add(p + "post_attention_layernorm.weight", {C}, ParamKind::norm, l);
    // The gate (w1) and up (w3) projections of an expert sit back to back in the slab, so
    // together they form one [2F, C] matrix and run as a single GEMM.
    if (c.n_experts == 1) {
      add(p + "mlp.gate_proj.weight", {c.ffn_dim, C}, ParamKind::expert, l, 0);
      add(p + "mlp.up_proj.weight", {c.ffn_dim, C}, ParamKind::expert, l, 0);
      add(p + "mlp.down_proj.weight", {C, c.ffn_dim}, ParamKind::expert, l, 0);
    } else {
      add(p + "block_sparse_moe.gate.weight", {c.n_experts, C}, ParamKind::router, l);
      for (int e = 0; e < c.n_experts; ++e) {
        const std::string ep = fmt::format("{}block_sparse_moe.experts.{}.", p, e);
        add(ep + "w1.weight", {c.ffn_dim, C}, ParamKind::expert, l, e);
        add(ep + "w3.weight", {c.ffn_dim, C}, ParamKind::expert, l, e);
        add(ep + "w2.weight", {C, c.ffn_dim}, ParamKind::expert, l, e);
      }
    }
  }
  add("model.norm.weight", {C}, ParamKind::norm, -1);
}

void ParamTable::add(std::string name, std::vector<int64_t> shape, ParamKind kind, int layer,
                     int expert) {
  ParamInfo info;
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  // Tensors start on 64-byte boundaries, except an up projection, which directly follows
  // its gate projection (see above).
  const bool follows_gate = name.ends_with("w3.weight") || name.ends_with("up_proj.weight");
  info.offset = follows_gate ? total_ : (total_ + 15) / 16 * 16;
  info.numel = numel;
  info.name = std::move(name);
  info.shape = std::move(shape);
  info.kind = kind;
  info.layer = layer;
  info.expert = expert;
  info.weight_decay = kind != ParamKind::norm && kind != ParamKind::embedding;
  total_ = info.offset + numel;
  index_[info.name] = params_.size();
  params_.push_back(std::move(info));
}

const ParamInfo* ParamTable::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &params_[it->second];
}

const ParamInfo& ParamTable::get(const std::string& name) const {
  const ParamInfo* p = find(name);
  if (!p) fail(fmt::format("unknown parameter '{}'", name));
  return *p;
}

int64_t ParamTable::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.numel;
  return n;
}

}  // namespace foundry
