#include <gtest/gtest.h>

#include "ckpt/checkpoint.h"

namespace foundry {
namespace {

// vocab 300 -> padded 384, C = 32, 3 layers, 4 query / 2 KV heads of 8, 4 experts top-1,
// F = 48, R = 16, convolutions 2 and 3 taps, RoPE on a quarter of each head, no EDA.
ModelConfig small_zaya() {
  ModelConfig c;
  c.arch = Arch::zaya1;
  c.vocab_size = 300;
  c.d_model = 32;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.n_experts = 4;
  c.top_k = 1;
  c.ffn_dim = 48;
  c.router_latent_dim = 16;
  c.cca_kernel_depthwise = 2;
  c.cca_kernel_grouped = 3;
  c.rope_fraction = 0.25;
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-6;
  c.max_seq_len = 128;
  c.init_std = 0.01;
  c.router_eda = false;
  c.norm_topk_prob = false;
  c.aux_loss_coef = 0;
  return c;
}

TEST(HfConfig, ZayaKeysAndValues) {
  const ModelConfig c = small_zaya();
  c.validate("small_zaya");
  const json j = hf_config_json(c);
  EXPECT_EQ(j["architectures"], json::array({"ZayaForCausalLM"}));
  EXPECT_EQ(j["model_type"], "zaya");
  EXPECT_EQ(j["vocab_size"], 384);  // the padded vocabulary: rows of the embedding
  EXPECT_EQ(j["hidden_size"], 32);
  EXPECT_EQ(j["num_hidden_layers"], 3);  // CCA + MoE pairs
  EXPECT_EQ(j["num_attention_heads"], 4);
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_EQ(j["head_dim"], 8);
  EXPECT_EQ(j["moe_intermediate_size"], 48);
  EXPECT_EQ(j["num_experts"], 4);
  EXPECT_EQ(j["num_experts_per_tok"], 1);
  EXPECT_EQ(j["router_hidden_size"], 16);
  EXPECT_EQ(j["cca_time0"], 2);
  EXPECT_EQ(j["cca_time1"], 3);
  EXPECT_DOUBLE_EQ(j["rms_norm_eps"].get<double>(), 1e-6);
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["max_position_embeddings"], 128);
  const json rope = j["rope_parameters"];
  EXPECT_EQ(rope["rope_type"], "default");
  EXPECT_DOUBLE_EQ(rope["rope_theta"].get<double>(), 500000.0);
  EXPECT_DOUBLE_EQ(rope["partial_rotary_factor"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(j["initializer_range"].get<double>(), 0.01);
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_EQ(j["lm_head_bias"], false);
  // Zyphra's original keys that map exactly onto the config.
  EXPECT_EQ(j["cca_num_q_heads"], 4);
  EXPECT_EQ(j["num_query_groups"], 2);
  EXPECT_EQ(j["zaya_use_eda"], false);
  // No Mixtral keys, and no top-level rope_theta (it lives in rope_parameters).
  for (const char* key : {"num_local_experts", "intermediate_size", "router_aux_loss_coef",
                          "rope_theta", "partial_rotary_factor"})
    EXPECT_FALSE(j.contains(key)) << key;
  // The Foundry config reads back to the same config.
  EXPECT_EQ(j["foundry"], to_json(c));
  EXPECT_EQ(to_json(parse_model_config(j["foundry"], "foundry")), to_json(c));

  ModelConfig eda = c;
  eda.router_eda = true;
  EXPECT_EQ(hf_config_json(eda)["zaya_use_eda"], true);
}

// ZAYA1-base gives the defaults of transformers' ZayaConfig (which are ZAYA1's shape).
TEST(HfConfig, Zaya1BaseMatchesTransformersDefaults) {
  ModelConfig c = small_zaya();
  c.vocab_size = 262272;
  c.d_model = 2048;
  c.n_layers = 40;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.head_dim = 128;
  c.n_experts = 16;
  c.ffn_dim = 2048;
  c.router_latent_dim = 256;
  c.cca_kernel_grouped = 2;
  c.rope_fraction = 0.5;
  c.rms_norm_eps = 1e-5;
  const json j = hf_config_json(c);
  const json expected = {{"vocab_size", 262272},     {"hidden_size", 2048},
                         {"num_hidden_layers", 40},  {"num_attention_heads", 8},
                         {"num_key_value_heads", 2}, {"head_dim", 128},
                         {"moe_intermediate_size", 2048}, {"num_experts", 16},
                         {"num_experts_per_tok", 1}, {"router_hidden_size", 256},
                         {"cca_time0", 2},           {"cca_time1", 2},
                         {"rms_norm_eps", 1e-5},     {"tie_word_embeddings", true}};
  for (const auto& [key, value] : expected.items()) EXPECT_EQ(j[key], value) << key;
  EXPECT_EQ(j["rope_parameters"]["partial_rotary_factor"], 0.5);
}

// Moving the function out of checkpoint.cpp changed nothing for arch moe: the exact object.
TEST(HfConfig, MoeOutputUnchanged) {
  ModelConfig c;  // defaults: 8 experts, top-2
  const json expected = {
      {"architectures", json::array({"MixtralForCausalLM"})},
      {"model_type", "mixtral"},
      {"vocab_size", 8192},
      {"hidden_size", 512},
      {"intermediate_size", 1024},
      {"num_hidden_layers", 4},
      {"num_attention_heads", 8},
      {"num_key_value_heads", 8},
      {"head_dim", 64},
      {"num_local_experts", 8},
      {"num_experts_per_tok", 2},
      {"router_aux_loss_coef", 0.01},
      {"output_router_logits", false},
      {"sliding_window", nullptr},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"max_position_embeddings", 256},
      {"tie_word_embeddings", true},
      {"hidden_act", "silu"},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"torch_dtype", "float32"},
      {"foundry", to_json(c)},
  };
  EXPECT_EQ(hf_config_json(c), expected) << hf_config_json(c).dump(2);

  c.n_experts = 1;  // dense: Llama
  c.top_k = 1;
  const json dense = hf_config_json(c);
  EXPECT_EQ(dense["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(dense["model_type"], "llama");
  EXPECT_EQ(dense["attention_bias"], false);
  EXPECT_EQ(dense["mlp_bias"], false);
  EXPECT_FALSE(dense.contains("num_local_experts"));
  EXPECT_EQ(dense.size(), expected.size() - 5 + 2);
}

// Per-head QK-Norm on a dense model is Qwen3 (q_norm, k_norm [head_dim] under the same names);
// with experts, or over whole projections, no class reads the tensors: none is named.
TEST(HfConfig, QkNormNamesQwen3OrNoClass) {
  ModelConfig c;
  c.n_experts = 1;
  c.top_k = 1;
  c.qk_norm = QkNorm::head;
  const json qwen3 = hf_config_json(c);
  EXPECT_EQ(qwen3["architectures"], json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(qwen3["model_type"], "qwen3");
  EXPECT_EQ(qwen3["head_dim"], 64);
  EXPECT_EQ(qwen3["foundry"]["qk_norm"], "head");
  EXPECT_TRUE(has_hf_class(c));
  for (auto [experts, qk] : {std::pair{8, QkNorm::head}, std::pair{1, QkNorm::full},
                             std::pair{8, QkNorm::full}}) {
    c.n_experts = experts;
    c.top_k = experts > 1 ? 2 : 1;
    c.qk_norm = qk;
    const json j = hf_config_json(c);
    EXPECT_FALSE(j.contains("architectures")) << j.dump();
    EXPECT_FALSE(j.contains("model_type")) << j.dump();
    EXPECT_FALSE(has_hf_class(c));
  }
}

}  // namespace
}  // namespace foundry
