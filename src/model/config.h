// Model configuration: the architecture's shape, read strictly from JSON.
#pragma once
#include <cstdint>
#include <string>

#include "base/config_reader.h"

namespace foundry {

// model.arch. "moe": the standard decoder-only MoE baseline (attention + MoE per layer, linear
// router). "zaya1": the ZAYA1 architecture: per layer a CCA attention sublayer then an MoE
// sublayer with the ZAYA1 router, residual scaling after every sublayer
// (../shared/spec/zaya1.md).
enum class Arch { moe, zaya1 };
inline const char* arch_name(Arch a) { return a == Arch::zaya1 ? "zaya1" : "moe"; }
// The architecture named `name` ("moe" | "zaya1"); fails naming `what` (a key or flag) otherwise.
Arch parse_arch(const std::string& name, const std::string& what);

// model.qk_norm (arch "moe"): RMSNorm of the queries and keys after their projections, before
// RoPE. "none"; "head": over each head's head_dim, one weight [head_dim] shared by all heads
// (Qwen3); "full": over the whole q projection [Dq] and the whole k projection [Dkv], one
// weight each (OLMo 2, OLMoE). ZAYA1's CCA has a normalization of its own.
enum class QkNorm { none, head, full };
const char* qk_norm_name(QkNorm n);

struct ModelConfig {
  Arch arch = Arch::moe;
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
  // Share of each head's dimensions that RoPE rotates (the first rope_fraction·head_dim;
  // ZAYA1: 0.5). rotary_dim() must be even.
  double rope_fraction = 1.0;
  QkNorm qk_norm = QkNorm::none;

  // ---- arch "zaya1" only (rejected for "moe" unless left at their defaults) ----------------
  int64_t cca_kernel_depthwise = 2;  // t0: taps of the depthwise causal convolution
  int64_t cca_kernel_grouped = 2;    // t1: taps of the grouped causal convolution
  double qk_temperature_init = 1.0;  // learned per-KV-head key temperature, initial value
  int64_t router_latent_dim = 256;   // R: the router's down-projection width
  bool router_eda = true;            // exponential depth averaging of the router state
  bool router_skip_class = true;     // one extra router class that runs no expert
  bool skip_passes_input = false;    // a skipped token gets p_skip·x instead of zero
  // Normal std of the router MLP's three weights; 0 = 1/sqrt(router_latent_dim) (fan-in).
  double router_init_std = 0;
  // How the per-class balancing bias moves (kernels/zaya_router.h, docs/zaya1.md "Balancing"):
  // "proportional" (bias −= gain × load error), "sign_adaptive" (Rprop-like steps) or
  // "adamw" (the ZAYA1 description's fixed-lr AdamW).
  std::string balance_rule = "newton";
  // What the balancing bias is added to when the router chooses: "logits" (the choice is
  // argmax(log p + b), invariant to how much probability the other classes hold) or "probs"
  // (the ZAYA1 description's argmax(p + b)).
  std::string balance_bias_on = "logits";
  // proportional: the gain; adamw: its lr; sign_adaptive: the initial step. 0 = the rule's
  // default (model.h, default_balance_bias_lr).
  double balance_bias_lr = 0;
  double skip_bias_init = -1.0;      // initial balancing bias of the skip class

  bool is_zaya() const { return arch == Arch::zaya1; }
  // Rows before a context-parallel chunk that its sublayers read: the CCA convolutions'
  // windows, (t0 − 1) + (t1 − 1), for zaya1; none for moe (docs/long-context.md).
  int64_t context_halo_rows() const {
    return is_zaya() ? (cca_kernel_depthwise - 1) + (cca_kernel_grouped - 1) : 0;
  }
  // Router classes: experts plus the skip class when enabled (zaya1); experts otherwise.
  int64_t router_classes() const { return n_experts + (is_zaya() && router_skip_class ? 1 : 0); }
  int64_t rotary_dim() const {
    return static_cast<int64_t>(rope_fraction * static_cast<double>(head_dim) + 0.5);
  }

  // Vocabulary padded to a multiple of 128 (rows of the embedding matrix).
  int64_t padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  // Widths of the rows model.qk_norm normalizes (0 without it): the q and k norms' weights.
  int64_t q_norm_width() const { return qk_norm == QkNorm::full ? q_dim() : qk_width(); }
  int64_t k_norm_width() const { return qk_norm == QkNorm::full ? kv_dim() : qk_width(); }
  int64_t qk_width() const { return qk_norm == QkNorm::head ? head_dim : 0; }

  // Validates ranges and divisibility; `where` names the source in messages.
  void validate(const std::string& where) const;
};

// Reads the "model" object (strict: unknown keys are errors).
ModelConfig parse_model_config(const json& obj, const std::string& where);
json to_json(const ModelConfig& c);

}  // namespace foundry
