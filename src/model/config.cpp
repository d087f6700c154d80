#include "model/config.h"

#include <cmath>

namespace foundry {

Arch parse_arch(const std::string& name, const std::string& what) {
  if (name == "moe") return Arch::moe;
  if (name == "zaya1") return Arch::zaya1;
  fail(fmt::format("{} {}: unknown architecture", what, name), "use zaya1 or moe");
}

const char* qk_norm_name(QkNorm n) {
  switch (n) {
    case QkNorm::head: return "head";
    case QkNorm::full: return "full";
    case QkNorm::none: break;
  }
  return "none";
}

ModelConfig parse_model_config(const json& obj, const std::string& where) {
  ModelConfig c;
  ConfigReader r(obj, where, "model.");
  r.get_choice<Arch>("arch", c.arch, {{"moe", Arch::moe}, {"zaya1", Arch::zaya1}});
  if (c.is_zaya()) {
    // The ZAYA1 router chooses one class, the argmax (spec §3), gates with its unbiased,
    // unnormalized probability and balances with its bias, not an auxiliary loss.
    c.top_k = 1;
    c.norm_topk_prob = false;
    c.aux_loss_coef = 0.0;
    c.rope_fraction = 0.5;
  }
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
  r.get("rope_fraction", c.rope_fraction, 0.0, 1.0);
  r.get_choice<QkNorm>("qk_norm", c.qk_norm,
                       {{"none", QkNorm::none}, {"head", QkNorm::head}, {"full", QkNorm::full}});
  r.get("cca_kernel_depthwise", c.cca_kernel_depthwise, int64_t{1}, int64_t{64});
  r.get("cca_kernel_grouped", c.cca_kernel_grouped, int64_t{1}, int64_t{64});
  r.get("qk_temperature_init", c.qk_temperature_init, -1e3, 1e3);
  r.get("router_latent_dim", c.router_latent_dim, int64_t{1}, int64_t{1} << 16);
  r.get("router_eda", c.router_eda);
  r.get("router_skip_class", c.router_skip_class);
  r.get("skip_passes_input", c.skip_passes_input);
  r.get("router_init_std", c.router_init_std, 0.0, 1e3);
  r.get_choice("balance_rule", c.balance_rule,
               {"proportional", "newton", "sign_adaptive", "adamw"});
  r.get_choice("balance_bias_on", c.balance_bias_on, {"logits", "probs"});
  r.get("balance_bias_lr", c.balance_bias_lr, 0.0, 100.0);
  r.get("skip_bias_init", c.skip_bias_init, -1e3, 1e3);
  r.finish();
  if (!c.is_zaya()) {
    // The ZAYA1 keys mean nothing to the standard model: setting one is a mistake.
    for (const char* key :
         {"cca_kernel_depthwise", "cca_kernel_grouped", "qk_temperature_init", "router_latent_dim",
          "router_eda", "router_skip_class", "skip_passes_input", "router_init_std", "balance_rule",
          "balance_bias_on", "balance_bias_lr", "skip_bias_init"})
      if (obj.contains(key))
        fail(fmt::format("{}: model.{} applies only to model.arch = \"zaya1\" (arch is \"{}\")",
                         where, key, arch_name(c.arch)),
             "remove the key or set model.arch to \"zaya1\"");
  }
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
  if (!(init_std > 0))
    bad(fmt::format("model.init_std = {}: the weights would start at zero, where no gradient "
                    "reaches them",
                    init_std),
        "give the initial weights' standard deviation, e.g. model.init_std = 0.02");
  if (head_dim % 2 != 0)
    bad(fmt::format("model.head_dim = {} must be even (RoPE rotates pairs)", head_dim),
        "choose an even head_dim, e.g. 64 or 128");
  if (top_k > n_experts)
    bad(fmt::format("model.top_k = {} exceeds model.n_experts = {}", top_k, n_experts),
        "choose top_k <= n_experts");
  if (std::abs(rope_fraction * static_cast<double>(head_dim) - static_cast<double>(rotary_dim())) >
      1e-9)
    bad(fmt::format("model.rope_fraction = {} of head_dim {} gives {} rotary dims: not a whole "
                    "number",
                    rope_fraction, head_dim, rope_fraction * static_cast<double>(head_dim)),
        fmt::format("choose rope_fraction so that rope_fraction * head_dim is an even whole "
                    "number (e.g. {} for {} dims)",
                    static_cast<double>(rotary_dim() / 2 * 2) / static_cast<double>(head_dim),
                    rotary_dim() / 2 * 2));
  if (rotary_dim() % 2 != 0)
    bad(fmt::format("model.rope_fraction = {} gives {} rotary dims of head_dim {}: must be even",
                    rope_fraction, rotary_dim(), head_dim),
        "choose rope_fraction so that rope_fraction * head_dim is even (e.g. 0.5 or 1.0)");
  if (is_zaya()) {
    if ((n_kv_heads * head_dim) % 2 != 0)
      bad(fmt::format("model.n_kv_heads * model.head_dim = {} must be even (CCA splits the "
                      "values into a current and a delayed half)", n_kv_heads * head_dim),
          "choose an even n_kv_heads or head_dim");
    if (skip_passes_input && !router_skip_class)
      bad("model.skip_passes_input = true needs model.router_skip_class = true",
          "enable the skip class or leave skip_passes_input false");
    if (norm_topk_prob || aux_loss_coef != 0)
      bad("model.norm_topk_prob and model.aux_loss_coef belong to the standard router",
          "arch zaya1 gates with the unnormalized probability and balances with a bias: "
          "set norm_topk_prob false and aux_loss_coef 0 (the defaults for zaya1)");
    if (qk_norm != QkNorm::none)
      bad(fmt::format("model.qk_norm = \"{}\" applies only to model.arch = \"moe\"",
                      qk_norm_name(qk_norm)),
          "remove the key: arch zaya1's CCA normalizes its queries and keys itself");
    if (n_experts < 2)
      bad(fmt::format("model.n_experts = {}: arch zaya1 needs at least 2 experts", n_experts),
          "use arch \"moe\" with n_experts = 1 for a dense model");
  }
  if (!tie_embeddings)
    bad("model.tie_embeddings = false is not supported", "set it to true");
}

json to_json(const ModelConfig& c) {
  json j{{"arch", arch_name(c.arch)},
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
  j["rope_fraction"] = c.rope_fraction;
  if (c.qk_norm != QkNorm::none) j["qk_norm"] = qk_norm_name(c.qk_norm);
  if (c.is_zaya()) {
    j["cca_kernel_depthwise"] = c.cca_kernel_depthwise;
    j["cca_kernel_grouped"] = c.cca_kernel_grouped;
    j["qk_temperature_init"] = c.qk_temperature_init;
    j["router_latent_dim"] = c.router_latent_dim;
    j["router_eda"] = c.router_eda;
    j["router_skip_class"] = c.router_skip_class;
    j["skip_passes_input"] = c.skip_passes_input;
    j["router_init_std"] = c.router_init_std;
    j["balance_rule"] = c.balance_rule;
    j["balance_bias_on"] = c.balance_bias_on;
    j["balance_bias_lr"] = c.balance_bias_lr;
    j["skip_bias_init"] = c.skip_bias_init;
  }
  return j;
}

}  // namespace foundry
