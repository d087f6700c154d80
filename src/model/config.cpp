#include "model/config.h"

namespace foundry {

ModelConfig parse_model_config(const json& obj, const std::string& where) {
  ModelConfig c;
  ConfigReader r(obj, where, "model.");
  r.get_choice("arch", c.arch, {"moe"});
  r.get("vocab_size", c.vocab_size, int64_t{2}, int64_t{1} << 24);
  r.get("d_model", c.d_model, int64_t{1}, int64_t{1} << 16);
  r.get("n_layers", c.n_layers, int64_t{1}, int64_t{4096});
  r.get("n_heads", c.n_heads, int64_t{1}, int64_t{4096});
  r.get("n_kv_heads", c.n_kv_heads, int64_t{1}, int64_t{4096});
  r.get("head_dim", c.head_dim, int64_t{2}, int64_t{4096});
  r.get("n_experts", c.n_experts, int64_t{1}, int64_t{4096});
  r.get("top_k", c.top_k, int64_t{1}, int64_t{4096});
  r.get("ffn_dim", c.ffn_dim, int64_t{1}, int64_t{1} << 20);
  r.get("norm_topk_prob", c.norm_topk_prob);
  r.get("aux_loss_coef", c.aux_loss_coef, 0.0, 1e3);
  r.get("rope_theta", c.rope_theta, 1.0, 1e12);
  r.get("rms_norm_eps", c.rms_norm_eps, 0.0, 1.0);
  r.get("max_seq_len", c.max_seq_len, int64_t{1}, int64_t{1} << 22);
  r.get("init_std", c.init_std, 0.0, 10.0);
  r.get("tie_embeddings", c.tie_embeddings);
  r.finish();
  c.validate(where);
  return c;
}

void ModelConfig::validate(const std::string& where) const {
  auto bad = [&](const std::string& what, const std::string& hint) {
    fail(fmt::format("{}: {}", where, what), hint);
  };
  if (n_heads % n_kv_heads != 0)
    bad(fmt::format("model.n_heads = {} is not a multiple of model.n_kv_heads = {}", n_heads,
                    n_kv_heads),
        "grouped-query attention shares each kv head among n_heads / n_kv_heads query heads");
  if (head_dim % 2 != 0)
    bad(fmt::format("model.head_dim = {} must be even (RoPE rotates pairs)", head_dim), "");
  if (top_k > n_experts)
    bad(fmt::format("model.top_k = {} exceeds model.n_experts = {}", top_k, n_experts),
        "choose top_k <= n_experts");
  if (!tie_embeddings)
    bad("model.tie_embeddings = false is not supported", "set it to true");
}

json to_json(const ModelConfig& c) {
  return json{{"arch", c.arch},
              {"vocab_size", c.vocab_size},
              {"d_model", c.d_model},
              {"n_layers", c.n_layers},
              {"n_heads", c.n_heads},
              {"n_kv_heads", c.n_kv_heads},
              {"head_dim", c.head_dim},
              {"n_experts", c.n_experts},
              {"top_k", c.top_k},
              {"ffn_dim", c.ffn_dim},
              {"norm_topk_prob", c.norm_topk_prob},
              {"aux_loss_coef", c.aux_loss_coef},
              {"rope_theta", c.rope_theta},
              {"rms_norm_eps", c.rms_norm_eps},
              {"max_seq_len", c.max_seq_len},
              {"init_std", c.init_std},
              {"tie_embeddings", c.tie_embeddings}};
}

}  // namespace foundry
