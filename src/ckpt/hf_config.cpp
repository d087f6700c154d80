// The Hugging Face config.json of a checkpoint: Mixtral (or Llama when dense) for arch "moe",
// Qwen3 for a dense model with per-head QK-Norm, transformers' ZAYA (ZayaConfig) for arch
// "zaya1". Foundry's own model config rides along under "foundry" (exactly
// to_json(ModelConfig)), which is what Foundry reads back.
#include <fmt/format.h>

#include "ckpt/checkpoint.h"

namespace foundry {

namespace {

// The transformers class that reads a standard model's tensors under Foundry's names.
const char* standard_hf_class(const ModelConfig& c, const char** model_type) {
  const bool dense = c.n_experts == 1;
  switch (c.qk_norm) {
    case QkNorm::none:
      *model_type = dense ? "llama" : "mixtral";
      return dense ? "LlamaForCausalLM" : "MixtralForCausalLM";
    case QkNorm::head:
      *model_type = dense ? "qwen3" : nullptr;
      return dense ? "Qwen3ForCausalLM" : nullptr;
    case QkNorm::full: break;
  }
  *model_type = nullptr;
  return nullptr;
}

// Without such a class the config names none: a loader fails instead of dropping the norms.
json standard_hf_config(const ModelConfig& c) {
  const bool dense = c.n_experts == 1;
  json j;
  const char* model_type = nullptr;
  if (const char* cls = standard_hf_class(c, &model_type)) {
    j["architectures"] = json::array({cls});
    j["model_type"] = model_type;
  }
  j["vocab_size"] = c.padded_vocab();
  j["hidden_size"] = c.d_model;
  j["intermediate_size"] = c.ffn_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  if (!dense) {
    j["num_local_experts"] = c.n_experts;
    j["num_experts_per_tok"] = c.top_k;
    j["router_aux_loss_coef"] = c.aux_loss_coef;
    j["output_router_logits"] = false;
    j["sliding_window"] = nullptr;
  } else {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["max_position_embeddings"] = c.max_seq_len;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["hidden_act"] = "silu";
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = c.init_std;
  j["torch_dtype"] = "float32";
  j["foundry"] = to_json(c);
  return j;
}

// The keys of transformers' ZayaConfig. num_hidden_layers counts layers, each a CCA sublayer
// and an MoE sublayer (transformers' layout; Zyphra's original checkpoints counted the 2·L
// sublayers). A few keys of Zyphra's original hub config are added where they map exactly
// onto a Foundry setting: cca_num_q_heads, num_query_groups, zaya_use_eda.
json zaya_hf_config(const ModelConfig& c) {
  json j;
  j["architectures"] = json::array({"ZayaForCausalLM"});
  j["model_type"] = "zaya";
  j["vocab_size"] = c.padded_vocab();
  j["hidden_size"] = c.d_model;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["moe_intermediate_size"] = c.ffn_dim;
  j["num_experts"] = c.n_experts;
  j["num_experts_per_tok"] = c.top_k;
  j["router_hidden_size"] = c.router_latent_dim;
  j["cca_time0"] = c.cca_kernel_depthwise;
  j["cca_time1"] = c.cca_kernel_grouped;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", c.rope_theta},
                          {"partial_rotary_factor", c.rope_fraction}};
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["lm_head_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["output_router_logits"] = false;
  j["sliding_window"] = nullptr;
  j["initializer_range"] = c.init_std;
  j["torch_dtype"] = "float32";
  // Zyphra's original config keys.
  j["cca_num_q_heads"] = c.n_heads;
  j["num_query_groups"] = c.n_kv_heads;
  j["zaya_use_eda"] = c.router_eda;
  j["foundry"] = to_json(c);
  return j;
}

}  // namespace

json hf_config_json(const ModelConfig& c) {
  return c.is_zaya() ? zaya_hf_config(c) : standard_hf_config(c);
}

std::string hf_class_mismatch(const ModelConfig& c) {
  if (c.is_zaya()) return {};
  if (c.n_experts > 1 && !c.norm_topk_prob)
    return "model.norm_topk_prob = false: Mixtral renormalizes the top-k gate weights to sum to 1";
  if (c.rope_fraction != 1.0)
    return fmt::format(
        "model.rope_fraction = {}: Llama, Mixtral and Qwen3 rotate every dimension "
        "of a head",
        c.rope_fraction);
  return {};
}

bool has_hf_class(const ModelConfig& c) {
  const char* model_type = nullptr;
  return c.is_zaya() || standard_hf_class(c, &model_type) != nullptr;
}

}  // namespace foundry
