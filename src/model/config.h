// Model configuration: the architecture's shape, read strictly from JSON.
#pragma once
#include <cstdint>
#include <string>

#include "base/config_reader.h"

namespace foundry {

struct ModelConfig {
  std::string arch = "moe";    // "moe": the standard decoder-only MoE baseline
  int64_t vocab_size = 8192;   // tokenizer vocabulary (real ids)
  int64_t d_model = 512;
  int64_t n_layers = 4;
  int64_t n_heads = 8;
  int64_t n_kv_heads = 8;      // grouped-query attention: n_heads % n_kv_heads == 0
  int64_t head_dim = 64;
  int64_t n_experts = 8;       // 1 = a dense SwiGLU FFN
  int64_t top_k = 2;
  int64_t ffn_dim = 1024;      // SwiGLU width of each expert
  bool norm_topk_prob = true;  // renormalize the top-k gate weights to sum to 1
  double aux_loss_coef = 0.01; // load-balancing loss weight (0 = off)
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  int64_t max_seq_len = 256;
  double init_std = 0.02;
  bool tie_embeddings = true;  // only tied embeddings are supported

  // Vocabulary padded to a multiple of 128 (rows of the embedding matrix).
  int64_t padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }

  // Validates ranges and divisibility; `where` names the source in messages.
  void validate(const std::string& where) const;
};

// Reads the "model" object (strict: unknown keys are errors).
ModelConfig parse_model_config(const json& obj, const std::string& where);
json to_json(const ModelConfig& c);

}  // namespace foundry
