#include "model/info.h"

#include <cmath>

#include "base/error.h"

namespace foundry {

namespace {

constexpr int64_t kF32Bytes = 4, kBf16Bytes = 2, kI32Bytes = 4;

// Experts a token runs through: top_k, and the one FFN of a dense model.
int64_t active_experts(const ModelConfig& c) { return c.n_experts == 1 ? 1 : c.top_k; }

}  // namespace

ParamCounts count_parameters(const ModelConfig& c) {
  const int64_t C = c.d_model, L = c.n_layers;
  ParamCounts p;
  p.embedding = c.padded_vocab() * C;
  p.attention_per_layer = 2 * c.q_dim() * C + 2 * c.kv_dim() * C;
  p.norms_per_layer = 2 * C;
  p.router_per_layer = c.n_experts == 1 ? 0 : c.n_experts * C;
  p.per_expert = 3 * c.ffn_dim * C;
  p.experts_per_layer = c.n_experts * p.per_expert;
  p.per_layer =
      p.attention_per_layer + p.norms_per_layer + p.router_per_layer + p.experts_per_layer;
  p.final_norm = C;
  p.total = p.embedding + L * p.per_layer + p.final_norm;
  p.non_embedding = p.total - p.embedding;
  const int64_t active_layer = p.attention_per_layer + p.norms_per_layer + p.router_per_layer +
                               active_experts(c) * p.per_expert;
  p.active = p.embedding + L * active_layer + p.final_norm;
  p.active_non_embedding = p.active - p.embedding;
  return p;
}

FlopsPerToken flops_per_token(const ModelConfig& c, int64_t seq) {
  const ParamCounts p = count_parameters(c);
  const double L = static_cast<double>(c.n_layers);
  const double T = static_cast<double>(seq);
  const double q_dim = static_cast<double>(c.q_dim());
  FlopsPerToken f;
  // Norm weights scale elementwise and the input embedding is a lookup; the LM head (the
  // same matrix) is a GEMM over the padded vocabulary.
  f.matmul_params = c.n_layers * (p.attention_per_layer + p.router_per_layer +
                                  active_experts(c) * p.per_expert) +
                    p.embedding;
  f.matmul_flops = 6.0 * static_cast<double>(f.matmul_params);
  f.attention_flops = 6.0 * 2.0 * L * T * q_dim;
  f.attention_causal_flops = 6.0 * 2.0 * L * q_dim * (T + 1.0) / 2.0;
  f.train_flops = f.matmul_flops + f.attention_flops;
  f.forward_flops = f.train_flops / 3.0;
  return f;
}

double train_flops_per_token(const ModelConfig& c, int64_t seq) {
  return flops_per_token(c, seq).train_flops;
}

MemoryEstimate estimate_memory(const ModelConfig& c, int64_t batch, int64_t seq,
                               DType precision) {
  const int64_t P = count_parameters(c).total;
  const int64_t B = batch, T = seq, N = batch * seq, C = c.d_model, L = c.n_layers;
  const int64_t H = c.n_heads, E = c.n_experts, K = active_experts(c), F = c.ffn_dim;
  const int64_t Dq = c.q_dim(), Dkv = c.kv_dim(), Vp = c.padded_vocab();

  MemoryEstimate m;
  m.weights_fp32_bytes = kF32Bytes * P;
  m.weights_bf16_bytes = precision == DType::bf16 ? kBf16Bytes * P : 0;
  m.grads_bytes = kF32Bytes * P;
  m.optimizer_bytes = 2 * kF32Bytes * P;

  auto add = [](std::vector<MemoryItem>& items, std::string name, std::string shape,
                int64_t copies, int64_t bytes_each) {
    items.push_back({std::move(name), std::move(shape), copies, copies * bytes_each});
  };
  auto& a = m.activations;
  add(a, "layer input (residual)", "[N,C]", L, kF32Bytes * N * C);
  add(a, "norm 1 output", "[N,C]", L, kF32Bytes * N * C);
  add(a, "norm 1 1/rms", "[N]", L, kF32Bytes * N);
  add(a, "q (after RoPE)", "[N,Dq]", L, kF32Bytes * N * Dq);
  add(a, "k, v (k after RoPE)", "2*[N,Dkv]", L, kF32Bytes * 2 * N * Dkv);
  add(a, "attention probabilities", "[B,H,T,T]", L, kF32Bytes * B * H * T * T);
  add(a, "attention output", "[N,Dq]", L, kF32Bytes * N * Dq);
  add(a, "residual after attention", "[N,C]", L, kF32Bytes * N * C);
  add(a, "norm 2 output", "[N,C]", L, kF32Bytes * N * C);
  add(a, "norm 2 1/rms", "[N]", L, kF32Bytes * N);
  add(a, "router probabilities", "[N,E]", L, kF32Bytes * N * E);
  add(a, "top-k ids and weights", "2*[N,K]", L, (kI32Bytes + kF32Bytes) * N * K);
  add(a, "dispatch plan", "2*[N*K]", L, kI32Bytes * 2 * N * K);
  add(a, "expert inputs", "[N*K,C]", L, kF32Bytes * N * K * C);
  add(a, "expert hidden (gate|up)", "[N*K,2F]", L, kF32Bytes * N * K * 2 * F);
  add(a, "SwiGLU output", "[N*K,F]", L, kF32Bytes * N * K * F);
  add(a, "expert outputs", "[N*K,C]", L, kF32Bytes * N * K * C);
  add(a, "final residual", "[N,C]", 1, kF32Bytes * N * C);
  add(a, "final norm output and 1/rms", "[N,C] + [N]", 1, kF32Bytes * (N * C + N));
  add(a, "logits (then their gradient)", "[N,Vp]", 1, kF32Bytes * N * Vp);
  add(a, "per-token losses", "[N]", 1, kF32Bytes * N);
  add(a, "input and target ids", "2*[N]", 1, kI32Bytes * 2 * N);

  auto& g = m.backward_buffers;
  add(g, "residual and norm gradients", "2*[N,C]", 1, kF32Bytes * 2 * N * C);
  add(g, "dq, dk, dv", "[N,Dq] + 2*[N,Dkv]", 1, kF32Bytes * N * (Dq + 2 * Dkv));
  add(g, "attention output gradient", "[N,Dq]", 1, kF32Bytes * N * Dq);
  add(g, "attention score gradient", "[B,H,T,T]", 1, kF32Bytes * B * H * T * T);
  add(g, "expert input and output gradients", "2*[N*K,C]", 1, kF32Bytes * 2 * N * K * C);
  add(g, "expert hidden and SwiGLU gradients", "[N*K,2F] + [N*K,F]", 1,
      kF32Bytes * N * K * 3 * F);
  add(g, "gate weight and router gradients", "[N,K] + [N,E]", 1, kF32Bytes * N * (K + E));

  for (const MemoryItem& item : a) m.activations_bytes += item.bytes;
  for (const MemoryItem& item : g) m.backward_buffers_bytes += item.bytes;
  m.total_bytes = m.weights_fp32_bytes + m.weights_bf16_bytes + m.grads_bytes +
                  m.optimizer_bytes + m.activations_bytes + m.backward_buffers_bytes;
  return m;
}

ModelInfo model_info(const ModelConfig& config, int64_t batch, int64_t seq, DType precision) {
  if (batch < 1 || seq < 1)
    fail(fmt::format("batch size {} and sequence length {} must both be >= 1", batch, seq));
  ModelInfo info;
  info.config = config;
  info.batch = batch;
  info.seq = seq;
  info.precision = precision;
  info.params = count_parameters(config);
  info.flops = flops_per_token(config, seq);
  info.train_flops_per_step =
      info.flops.train_flops * static_cast<double>(batch) * static_cast<double>(seq);
  info.memory = estimate_memory(config, batch, seq, precision);
  return info;
}

// ---- reporting ---------------------------------------------------------------------------

namespace {

const char* precision_name(DType d) { return d == DType::bf16 ? "bf16" : "fp32"; }

json items_to_json(const std::vector<MemoryItem>& items) {
  json out = json::array();
  for (const MemoryItem& item : items)
    out.push_back(
        {{"name", item.name}, {"shape", item.shape}, {"copies", item.copies}, {"bytes", item.bytes}});
  return out;
}

// 12345678 -> "12,345,678"
std::string with_separators(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

// 12345678 -> "12.35 M"
std::string short_count(int64_t n) {
  const double x = static_cast<double>(n);
  if (x >= 1e9) return fmt::format("{:.2f} B", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.2f} M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.2f} K", x / 1e3);
  return fmt::format("{}", n);
}

std::string human_bytes(int64_t bytes) {
  const double x = static_cast<double>(bytes);
  constexpr double kMiB = 1024.0 * 1024.0, kGiB = 1024.0 * kMiB;
  if (x >= kGiB) return fmt::format("{:.2f} GiB", x / kGiB);
  return fmt::format("{:.2f} MiB", x / kMiB);
}

std::string human_flops(double flops) {
  if (flops >= 1e15) return fmt::format("{:.3f} PFLOP", flops / 1e15);
  if (flops >= 1e12) return fmt::format("{:.3f} TFLOP", flops / 1e12);
  if (flops >= 1e9) return fmt::format("{:.3f} GFLOP", flops / 1e9);
  if (flops >= 1e6) return fmt::format("{:.3f} MFLOP", flops / 1e6);
  return fmt::format("{:.0f} FLOP", flops);
}

}  // namespace

json to_json(const ModelInfo& info) {
  const ParamCounts& p = info.params;
  const FlopsPerToken& f = info.flops;
  const MemoryEstimate& m = info.memory;
  return json{
      {"model", to_json(info.config)},
      {"batch_size", info.batch},
      {"seq_len", info.seq},
      {"tokens_per_step", info.batch * info.seq},
      {"precision", precision_name(info.precision)},
      {"parameters",
       {{"total", p.total},
        {"embedding", p.embedding},
        {"non_embedding", p.non_embedding},
        {"active", p.active},
        {"active_non_embedding", p.active_non_embedding},
        {"attention_per_layer", p.attention_per_layer},
        {"norms_per_layer", p.norms_per_layer},
        {"router_per_layer", p.router_per_layer},
        {"per_expert", p.per_expert},
        {"experts_per_layer", p.experts_per_layer},
        {"per_layer", p.per_layer},
        {"final_norm", p.final_norm}}},
      {"flops_per_token",
       {{"matmul_params", f.matmul_params},
        {"matmul", f.matmul_flops},
        {"attention", f.attention_flops},
        {"attention_causal", f.attention_causal_flops},
        {"forward", f.forward_flops},
        {"train", f.train_flops},
        {"attention_convention", "full T x T scores, not halved for the causal mask"}}},
      {"train_flops_per_step", info.train_flops_per_step},
      {"memory_bytes",
       {{"weights_fp32", m.weights_fp32_bytes},
        {"weights_bf16", m.weights_bf16_bytes},
        {"grads", m.grads_bytes},
        {"optimizer", m.optimizer_bytes},
        {"activations", m.activations_bytes},
        {"backward_buffers", m.backward_buffers_bytes},
        {"total", m.total_bytes}}},
      {"activations", items_to_json(m.activations)},
      {"backward_buffers", items_to_json(m.backward_buffers)},
  };
}

std::string format_model_info(const ModelInfo& info) {
  const ModelConfig& c = info.config;
  const ParamCounts& p = info.params;
  const FlopsPerToken& f = info.flops;
  const MemoryEstimate& m = info.memory;
  std::string out;
  auto line = [&out](const std::string& text) { out += text + "\n"; };
  auto count_row = [&](const std::string& label, int64_t n) {
    line(fmt::format("  {:<36} {:>17}  {:>10}", label, with_separators(n), short_count(n)));
  };
  auto flops_row = [&](const std::string& label, double flops) {
    line(fmt::format("  {:<36} {:>17}", label, human_flops(flops)));
  };
  auto bytes_row = [&](const std::string& label, int64_t bytes) {
    line(fmt::format("  {:<36} {:>17}", label, human_bytes(bytes)));
  };

  const std::string experts =
      c.n_experts == 1 ? std::string("dense SwiGLU")
                       : fmt::format("{} experts, top-{}", c.n_experts, c.top_k);
  line(fmt::format("model: {} layers, d_model {}, {} heads x {} ({} kv heads), {}, ffn_dim {}, "
                   "vocab {} (padded {})",
                   c.n_layers, c.d_model, c.n_heads, c.head_dim, c.n_kv_heads, experts, c.ffn_dim,
                   c.vocab_size, c.padded_vocab()));
  line(fmt::format("step:  batch {} x seq {} = {} tokens, precision {}", info.batch, info.seq,
                   with_separators(info.batch * info.seq), precision_name(info.precision)));
  line("");
  line("parameters");
  count_row("total", p.total);
  count_row("embedding (tied with the LM head)", p.embedding);
  count_row("non-embedding", p.non_embedding);
  count_row("active per token", p.active);
  count_row("active per token, non-embedding", p.active_non_embedding);
  count_row("per layer: attention (q, k, v, o)", p.attention_per_layer);
  if (c.n_experts > 1) count_row("per layer: router", p.router_per_layer);
  count_row(c.n_experts > 1 ? "per expert (w1, w3, w2)" : "per layer: FFN (gate, up, down)",
            p.per_expert);
  if (c.n_experts > 1) count_row("per layer: all experts", p.experts_per_layer);
  count_row("per layer: norms", p.norms_per_layer);
  count_row("per layer: total", p.per_layer);
  count_row("final norm", p.final_norm);
  line("");
  line("training FLOPs per token (forward + backward)");
  flops_row(fmt::format("matmuls (6 x {} weights)", short_count(f.matmul_params)),
            f.matmul_flops);
  flops_row("attention (12*L*T*Dq, full T x T)", f.attention_flops);
  flops_row("total (used for MFU)", f.train_flops);
  flops_row("  of which forward", f.forward_flops);
  flops_row("attention if causal-halved (info)", f.attention_causal_flops);
  flops_row("per step", info.train_flops_per_step);
  line("");
  line("memory");
  bytes_row("weights fp32", m.weights_fp32_bytes);
  if (m.weights_bf16_bytes) bytes_row("weights bf16 (GEMM copies)", m.weights_bf16_bytes);
  bytes_row("gradients fp32", m.grads_bytes);
  bytes_row("AdamW state (exp_avg, exp_avg_sq)", m.optimizer_bytes);
  bytes_row("activations saved for backward", m.activations_bytes);
  bytes_row("backward working buffers", m.backward_buffers_bytes);
  bytes_row("total", m.total_bytes);
  line("");
  line(fmt::format("activations (B = {}, T = {}, N = B*T, K = {} experts per token; xL = one "
                   "copy per layer)",
                   info.batch, info.seq, active_experts(c)));
  for (const MemoryItem& item : m.activations) {
    const std::string label =
        item.copies > 1 ? fmt::format("{} x{}", item.name, item.copies) : item.name;
    line(fmt::format("  {:<36} {:<19} {:>12}", label, item.shape, human_bytes(item.bytes)));
  }
  return out;
}

}  // namespace foundry
