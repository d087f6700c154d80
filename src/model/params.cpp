#include "model/params.h"

#include <cmath>

#include "base/error.h"
#include "kernels/cca.h"

namespace foundry {

int64_t muon_matrix_elements(const ModelConfig& c) {
  const int64_t C = c.d_model;
  const int64_t attention = 2 * C * (c.q_dim() + c.kv_dim());  // q, k, v (two halves), o
  const int64_t experts = c.n_experts * 3 * c.ffn_dim * C;
  return c.n_layers * (attention + experts);
}
namespace {

ParamInfo& constant(ParamInfo& p, double value) {
  p.init = ParamInit::constant;
  p.init_value = value;
  return p;
}

}  // namespace

ParamTable::ParamTable(const ModelConfig& c) {
  const int64_t C = c.d_model;
  add("model.embed_tokens.weight", {c.padded_vocab(), C}, ParamKind::embedding, -1);
  if (c.is_zaya()) {
    // The embedding enters the residual stream through its own scale and bias.
    constant(add("model.input_hidden_states_scale", {C}, ParamKind::scale, -1), 1.0);
    constant(add("model.input_hidden_states_bias", {C}, ParamKind::scale, -1), 0.0);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    if (c.is_zaya())
      add_zaya_layer(c, l);
    else
      add_standard_layer(c, l);
  }
  constant(add("model.norm.weight", {C}, ParamKind::norm, -1), 1.0);

  // Normal initialization: init_std, with the projections that write into the residual
  // stream (attention output, expert down projection) scaled by 1/sqrt(2·n_layers).
  const double std_out = c.init_std / std::sqrt(2.0 * static_cast<double>(c.n_layers));
  for (ParamInfo& p : params_) {
    if (p.init != ParamInit::normal || p.init_value > 0) continue;  // set where added
    const bool output_proj =
        p.name.ends_with("o_proj.weight") ||
        (p.kind == ParamKind::expert &&
         (p.name.ends_with("w2.weight") || p.name.ends_with("down_proj.weight")));
    p.init_value = output_proj ? std_out : c.init_std;
  }
}

void ParamTable::add_standard_layer(const ModelConfig& c, int l) {
  const int64_t C = c.d_model;
  const std::string p = fmt::format("model.layers.{}.", l);
  constant(add(p + "input_layernorm.weight", {C}, ParamKind::norm, l), 1.0);
  add(p + "self_attn.q_proj.weight", {c.q_dim(), C}, ParamKind::attention, l);
  add(p + "self_attn.k_proj.weight", {c.kv_dim(), C}, ParamKind::attention, l);
  add(p + "self_attn.v_proj.weight", {c.kv_dim(), C}, ParamKind::attention, l);
  add(p + "self_attn.o_proj.weight", {C, c.q_dim()}, ParamKind::attention, l);
  if (c.qk_norm != QkNorm::none) {
    constant(add(p + "self_attn.q_norm.weight", {c.q_norm_width()}, ParamKind::norm, l), 1.0);
    constant(add(p + "self_attn.k_norm.weight", {c.k_norm_width()}, ParamKind::norm, l), 1.0);
  }
  constant(add(p + "post_attention_layernorm.weight", {C}, ParamKind::norm, l), 1.0);
  // The gate (w1) and up (w3) projections of an expert sit back to back in the slab, so
  // together they form one [2F, C] matrix and run as a single GEMM.
  if (c.n_experts == 1) {
    add(p + "mlp.gate_proj.weight", {c.ffn_dim, C}, ParamKind::expert, l, 0);
    add(p + "mlp.up_proj.weight", {c.ffn_dim, C}, ParamKind::expert, l, 0, true);
    add(p + "mlp.down_proj.weight", {C, c.ffn_dim}, ParamKind::expert, l, 0);
  } else {
    add(p + "block_sparse_moe.gate.weight", {c.n_experts, C}, ParamKind::router, l);
    for (int e = 0; e < c.n_experts; ++e) {
      const std::string ep = fmt::format("{}block_sparse_moe.experts.{}.", p, e);
      add(ep + "w1.weight", {c.ffn_dim, C}, ParamKind::expert, l, e);
      add(ep + "w3.weight", {c.ffn_dim, C}, ParamKind::expert, l, e, true);
      add(ep + "w2.weight", {C, c.ffn_dim}, ParamKind::expert, l, e);
    }
  }
}

// One ZAYA1 layer: a CCA sublayer and an MoE sublayer, each followed by residual scaling.
// Names follow Hugging Face's ZAYA implementation; experts are stored one tensor per matrix
// (HF fuses them into mlp.experts.gate_up_proj [E, 2F, C] and down_proj [E, C, F]).
void ParamTable::add_zaya_layer(const ModelConfig& c, int l) {
  const int64_t C = c.d_model, R = c.router_latent_dim, d = c.head_dim;
  const ops::CcaDims cca{c.n_heads, c.n_kv_heads, d, c.cca_kernel_depthwise,
                         c.cca_kernel_grouped};
  const std::string p = fmt::format("model.layers.{}.", l);
  const std::string a = p + "self_attn.";
  const std::string qkv = a + "qkv_proj.";
  constant(add(p + "input_layernorm.weight", {C}, ParamKind::norm, l), 1.0);
  // q and k back to back: one GEMM writes the packed [q0 ‖ k0]; likewise the two value halves.
  add(qkv + "q_proj.weight", {c.q_dim(), C}, ParamKind::attention, l);
  add(qkv + "k_proj.weight", {c.kv_dim(), C}, ParamKind::attention, l, -1, true);
  add(qkv + "v_proj_current.weight", {cca.value_half(), C}, ParamKind::attention, l);
  add(qkv + "v_proj_delayed.weight", {cca.value_half(), C}, ParamKind::attention, l, -1, true);
  // Convolutions: PyTorch's default Conv1d scale, Normal(0, 1/sqrt(3·fan_in)).
  const int64_t ch = cca.channels();
  add(qkv + "conv_qk_depthwise.weight", {ch, 1, cca.t0}, ParamKind::attention, l).init_value =
      1.0 / std::sqrt(3.0 * static_cast<double>(cca.t0));
  constant(add(qkv + "conv_qk_depthwise.bias", {ch}, ParamKind::attention, l), 0.0);
  add(qkv + "conv_qk_grouped.weight", {ch, d, cca.t1}, ParamKind::attention, l).init_value =
      1.0 / std::sqrt(3.0 * static_cast<double>(d * cca.t1));
  constant(add(qkv + "conv_qk_grouped.bias", {ch}, ParamKind::attention, l), 0.0);
  constant(add(a + "qk_norm.temp", {c.n_kv_heads}, ParamKind::scale, l), c.qk_temperature_init);
  add(a + "o_proj.weight", {C, c.q_dim()}, ParamKind::attention, l);
  add_residual_scaling(p + "post_attention_residual_scale.", C, l);

  constant(add(p + "post_attention_layernorm.weight", {C}, ParamKind::norm, l), 1.0);
  const std::string g = p + "mlp.gate.";
  add(g + "down_proj.weight", {R, C}, ParamKind::router, l);
  constant(add(g + "down_proj.bias", {R}, ParamKind::router, l), 0.0);
  // The first MoE sublayer has no previous router state, hence no EDA weight.
  if (c.router_eda && l > 0)
    constant(add(g + "router_states_scale", {R}, ParamKind::scale, l), 1.0);
  constant(add(g + "router_mlp.norm.weight", {R}, ParamKind::norm, l), 1.0);
  // The router MLP at fan-in scale (model.router_init_std; docs/zaya1.md "Balancing"): at
  // init_std its logits would barely differ between tokens.
  const double router_std =
      c.router_init_std > 0 ? c.router_init_std : 1.0 / std::sqrt(static_cast<double>(R));
  add(g + "router_mlp.fc1.weight", {R, R}, ParamKind::router, l).init_value = router_std;
  constant(add(g + "router_mlp.fc1.bias", {R}, ParamKind::router, l), 0.0);
  add(g + "router_mlp.fc2.weight", {R, R}, ParamKind::router, l).init_value = router_std;
  constant(add(g + "router_mlp.fc2.bias", {R}, ParamKind::router, l), 0.0);
  add(g + "router_mlp.out_proj.weight", {c.router_classes(), R}, ParamKind::router, l)
      .init_value = router_std;
  for (int e = 0; e < c.n_experts; ++e) {
    const std::string ep = fmt::format("{}mlp.experts.{}.", p, e);
    add(ep + "gate_proj.weight", {c.ffn_dim, C}, ParamKind::expert, l, e);
    add(ep + "up_proj.weight", {c.ffn_dim, C}, ParamKind::expert, l, e, true);
    add(ep + "down_proj.weight", {C, c.ffn_dim}, ParamKind::expert, l, e);
  }
  add_residual_scaling(p + "post_mlp_residual_scale.", C, l);
}

// res ← (res + residual_bias) ⊙ residual_scale + (h + hidden_states_bias) ⊙ hidden_states_scale
void ParamTable::add_residual_scaling(const std::string& prefix, int64_t channels, int layer) {
  constant(add(prefix + "residual_scale", {channels}, ParamKind::scale, layer), 1.0);
  constant(add(prefix + "residual_bias", {channels}, ParamKind::scale, layer), 0.0);
  constant(add(prefix + "hidden_states_scale", {channels}, ParamKind::scale, layer), 1.0);
  constant(add(prefix + "hidden_states_bias", {channels}, ParamKind::scale, layer), 0.0);
}

ParamInfo& ParamTable::add(std::string name, std::vector<int64_t> shape, ParamKind kind,
                           int layer, int expert, bool follows_previous) {
  ParamInfo info;
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  info.offset = follows_previous ? total_ : (total_ + 15) / 16 * 16;
  info.numel = numel;
  info.name = std::move(name);
  info.shape = std::move(shape);
  info.kind = kind;
  info.layer = layer;
  info.expert = expert;
  info.weight_decay = kind != ParamKind::norm && kind != ParamKind::embedding &&
                      kind != ParamKind::scale && info.shape.size() >= 2;
  total_ = info.offset + numel;
  index_[info.name] = params_.size();
  params_.push_back(std::move(info));
  return params_.back();
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
