#include "model/info.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "base/error.h"
#include "base/format.h"
#include "kernels/attention.h"
#include "kernels/cca.h"
#include "model/cca_sublayer.h"

namespace foundry {

namespace {

constexpr int64_t kF32Bytes = 4, kBf16Bytes = 2, kI32Bytes = 4;

// Experts a token runs through: top_k, and the one FFN of a dense model. For zaya1 these
// are top_k REAL experts (at most E): a token routed to the skip class runs no expert, so
// the active count is the most a token can use.
int64_t active_experts(const ModelConfig& c) {
  return c.n_experts == 1 ? 1 : std::min(c.top_k, c.n_experts);
}

// Weights of one ZAYA1 router that take part in a GEMM: down_proj, fc1, fc2, out_proj.
int64_t zaya_router_matmul_params(const ModelConfig& c) {
  const int64_t R = c.router_latent_dim;
  return R * c.d_model + 2 * R * R + c.router_classes() * R;
}

}  // namespace

ParamCounts count_parameters(const ModelConfig& c) {
  const int64_t C = c.d_model, L = c.n_layers;
  ParamCounts p;
  p.embedding = c.padded_vocab() * C;
  p.norms_per_layer = 2 * C + c.q_norm_width() + c.k_norm_width();
  p.per_expert = 3 * c.ffn_dim * C;
  p.experts_per_layer = c.n_experts * p.per_expert;
  p.final_norm = C;
  if (c.is_zaya()) {
    const ops::CcaDims cca = cca_dims(c);
    const int64_t R = c.router_latent_dim;
    p.cca.q = c.q_dim() * C;
    p.cca.k = c.kv_dim() * C;
    p.cca.v_half = cca.value_half() * C;
    p.cca.convolutions = cca.conv_parameter_count();
    p.cca.o = C * c.q_dim();
    p.cca.temperature = cca.temperature_size();
    p.cca.total = p.cca.q + p.cca.k + 2 * p.cca.v_half + p.cca.convolutions + p.cca.o +
                  p.cca.temperature;
    p.attention_per_layer = p.cca.total;
    // down_proj (weight, bias), router norm, fc1, fc2 (weights, biases), out_proj (no bias)
    p.router_first_layer = (R * C + R) + R + 2 * (R * R + R) + c.router_classes() * R;
    // The EDA weight (router_states_scale) exists from the second MoE sublayer on.
    p.router_per_layer = p.router_first_layer + (c.router_eda ? R : 0);
    p.residual_scales_per_layer = 2 * 4 * C;
    p.input_scales = 2 * C;
  } else {
    p.attention_per_layer = 2 * c.q_dim() * C + 2 * c.kv_dim() * C;
    p.router_per_layer = c.n_experts == 1 ? 0 : c.n_experts * C;
    p.router_first_layer = p.router_per_layer;
  }
  p.per_layer = p.attention_per_layer + p.norms_per_layer + p.router_per_layer +
                p.experts_per_layer + p.residual_scales_per_layer;
  // Layer 0 differs from the others only in its router.
  const int64_t first_layer_saving = p.router_per_layer - p.router_first_layer;
  p.total = p.embedding + p.input_scales + L * p.per_layer - first_layer_saving + p.final_norm;
  p.non_embedding = p.total - p.embedding;
  const int64_t active_layer = p.attention_per_layer + p.norms_per_layer + p.router_per_layer +
                               active_experts(c) * p.per_expert + p.residual_scales_per_layer;
  p.active =
      p.embedding + p.input_scales + L * active_layer - first_layer_saving + p.final_norm;
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
  if (c.is_zaya()) {
    // CCA: q, k, both value halves and o (not the convolutions, temperature); the router's
    // four linear maps (not its biases, EDA gamma or norm); top_k real experts.
    const int64_t cca_gemm = p.cca.q + p.cca.k + 2 * p.cca.v_half + p.cca.o;
    f.matmul_params = c.n_layers * (cca_gemm + zaya_router_matmul_params(c) +
                                    active_experts(c) * p.per_expert) +
                      p.embedding;
    // The convolutions, counted like matmuls: per token forward 2·Cc·t0 (depthwise) and
    // 2·Cc·d·t1 (grouped) FLOPs, three times that for a training step.
    const ops::CcaDims cca = cca_dims(c);
    f.conv_flops = 6.0 * L *
                   static_cast<double>(cca.depthwise_weight_size() + cca.grouped_weight_size());
  } else {
    f.matmul_params = c.n_layers * (p.attention_per_layer + p.router_per_layer +
                                    active_experts(c) * p.per_expert) +
                      p.embedding;
  }
  f.matmul_flops = 6.0 * static_cast<double>(f.matmul_params);
  f.attention_flops = 6.0 * 2.0 * L * T * q_dim;
  f.attention_causal_flops = 6.0 * 2.0 * L * q_dim * (T + 1.0) / 2.0;
  f.train_flops = f.matmul_flops + f.conv_flops + f.attention_causal_flops;
  f.forward_flops = f.train_flops / 3.0;
  return f;
}

double train_flops_per_token(const ModelConfig& c, int64_t seq) {
  return flops_per_token(c, seq).train_flops;
}

double expert_train_flops_per_token(const ModelConfig& c) {
  return 6.0 * static_cast<double>(c.n_layers * active_experts(c) * count_parameters(c).per_expert);
}

namespace {

void add_item(std::vector<MemoryItem>& items, std::string name, std::string shape,
              int64_t copies, int64_t bytes_each) {
  items.push_back({std::move(name), std::move(shape), copies, copies * bytes_each});
}

void standard_activations(const ModelConfig& c, int64_t B, int64_t T, int64_t Tk, DType precision,
                          MemoryEstimate& m) {
  const int64_t N = B * T, C = c.d_model, L = c.n_layers;
  const int64_t H = c.n_heads, E = c.n_experts, K = active_experts(c), F = c.ffn_dim;
  const int64_t Dq = c.q_dim(), Dkv = c.kv_dim();
  auto& a = m.activations;
  add_item(a, "layer input (residual)", "[N,C]", L, kF32Bytes * N * C);
  add_item(a, "norm 1 output", "[N,C]", L, kF32Bytes * N * C);
  add_item(a, "norm 1 1/rms", "[N]", L, kF32Bytes * N);
  if (c.qk_norm != QkNorm::none) {
    add_item(a, "q, k before their norms", "[N,Dq] + [N,Dkv]", L, kF32Bytes * N * (Dq + Dkv));
    add_item(a, "q, k norms' 1/rms", c.qk_norm == QkNorm::head ? "[N,H] + [N,KVH]" : "2*[N]", L,
             kF32Bytes * N * (Dq / c.q_norm_width() + Dkv / c.k_norm_width()));
  }
  add_item(a, "q (after RoPE)", "[N,Dq]", L, kF32Bytes * N * Dq);
  add_item(a, "k, v (k after RoPE)", "2*[N,Dkv]", L, kF32Bytes * 2 * N * Dkv);
  add_item(a, "attention row log-sum-exp", "[B,H,T]", L, kF32Bytes * B * H * T);
  add_item(a, "attention output", "[N,Dq]", L, kF32Bytes * N * Dq);
  add_item(a, "residual after attention", "[N,C]", L, kF32Bytes * N * C);
  add_item(a, "norm 2 output", "[N,C]", L, kF32Bytes * N * C);
  add_item(a, "norm 2 1/rms", "[N]", L, kF32Bytes * N);
  add_item(a, "router probabilities", "[N,E]", L, kF32Bytes * N * E);
  add_item(a, "top-k ids and weights", "2*[N,K]", L, (kI32Bytes + kF32Bytes) * N * K);
  add_item(a, "dispatch plan", "2*[N*K]", L, kI32Bytes * 2 * N * K);
  add_item(a, "expert inputs", "[N*K,C]", L, kF32Bytes * N * K * C);
  if (precision == DType::bf16)
    add_item(a, "expert inputs in bf16 (for the weight gradient)", "[N*K,C]", L,
             kBf16Bytes * N * K * C);
  add_item(a, "expert hidden (gate|up)", "[N*K,2F]", L, kF32Bytes * N * K * 2 * F);
  add_item(a, "SwiGLU output", "[N*K,F]", L, kF32Bytes * N * K * F);
  add_item(a, "expert outputs", "[N*K,C]", L, kF32Bytes * N * K * C);

  auto& g = m.backward_buffers;
  add_item(g, "residual gradient and the two norms' gradients", "3*[N,C]", 1,
           kF32Bytes * 3 * N * C);
  add_item(g, "dq, dk, dv", "[N,Dq] + 2*[N,Dkv]", 1, kF32Bytes * N * (Dq + 2 * Dkv));
  if (c.qk_norm != QkNorm::none)
    add_item(g, "dq, dk before their norms", "[N,Dq] + [N,Dkv]", 1, kF32Bytes * N * (Dq + Dkv));
  add_item(g, "attention output gradient", "[N,Dq]", 1, kF32Bytes * N * Dq);
  add_item(g, "attention tiles, k, v in key tiles and their gradients",
           "tiles + 2*[N,Dkv]*(dtype + fp32)", 1,
           ops::attention_scratch_bytes({B, Tk, H, c.n_kv_heads, c.head_dim}, precision));
  add_item(g, "expert input and output gradients", "2*[N*K,C]", 1, kF32Bytes * 2 * N * K * C);
  add_item(g, "expert hidden and SwiGLU gradients", "[N*K,2F] + [N*K,F]", 1,
           kF32Bytes * N * K * 3 * F);
  add_item(g, "gate weight and router gradients", "[N,K] + [N,E]", 1, kF32Bytes * N * (K + E));
}

void zaya_activations(const ModelConfig& c, int64_t B, int64_t T, int64_t Tk, DType precision,
                      MemoryEstimate& m) {
  const int64_t N = B * T, C = c.d_model, L = c.n_layers;
  const int64_t Hq = c.n_heads, Hk = c.n_kv_heads, K = active_experts(c), F = c.ffn_dim;
  const int64_t Dq = c.q_dim(), Dkv = c.kv_dim(), Cc = cca_dims(c).channels();
  const int64_t R = c.router_latent_dim, S = c.router_classes();
  auto& a = m.activations;
  // The CCA sublayer.
  add_item(a, "CCA: residual in", "[N,C]", L, kF32Bytes * N * C);
  add_item(a, "CCA: norm output and 1/rms", "[N,C] + [N]", L, kF32Bytes * (N * C + N));
  add_item(a, "CCA: packed c = [q0|k0]", "[N,Cc]", L, kF32Bytes * N * Cc);
  const bool split = T != Tk;  // context parallel: y and dy live in the halo-row buffers
  if (!split) add_item(a, "CCA: depthwise conv output y", "[N,Cc]", L, kF32Bytes * N * Cc);
  add_item(a, "CCA: pre-norm qk", "[N,Cc]", L, kF32Bytes * N * Cc);
  add_item(a, "CCA: QK-norm 1/norms", "[N,Hq+Hk]", L, kF32Bytes * N * (Hq + Hk));
  add_item(a, "CCA: q (after RoPE)", "[N,Hq*d]", L, kF32Bytes * N * Dq);
  add_item(a, "CCA: k, v", "2*[N,Hk*d]", L, kF32Bytes * 2 * N * Dkv);
  add_item(a, "CCA: attention row log-sum-exp", "[B,Hq,T]", L, kF32Bytes * B * Hq * T);
  add_item(a, "CCA: attention output", "[N,Hq*d]", L, kF32Bytes * N * Dq);
  add_item(a, "CCA: sublayer output h", "[N,C]", L, kF32Bytes * N * C);
  // The MoE sublayer.
  add_item(a, "MoE: residual in", "[N,C]", L, kF32Bytes * N * C);
  add_item(a, "MoE: norm output and 1/rms", "[N,C] + [N]", L, kF32Bytes * (N * C + N));
  add_item(a, "MoE: router state r", "[N,R]", L, kF32Bytes * N * R);
  add_item(a, "MoE: router norm output and 1/rms", "[N,R] + [N]", L, kF32Bytes * (N * R + N));
  add_item(a, "MoE: router MLP a1, g1, a2, g2", "4*[N,R]", L, kF32Bytes * 4 * N * R);
  add_item(a, "MoE: router probabilities", "[N,S]", L, kF32Bytes * N * S);
  add_item(a, "MoE: choice (int) and gate", "2*[N,K]", L, (kI32Bytes + kF32Bytes) * N * K);
  add_item(a, "MoE: dispatch plan", "2*[N*K]", L, kI32Bytes * 2 * N * K);
  add_item(a, "MoE: expert inputs", "[N*K,C]", L, kF32Bytes * N * K * C);
  if (precision == DType::bf16)
    add_item(a, "MoE: expert inputs in bf16 (for the weight gradient)", "[N*K,C]", L,
             kBf16Bytes * N * K * C);
  add_item(a, "MoE: expert hidden (gate|up)", "[N*K,2F]", L, kF32Bytes * N * K * 2 * F);
  add_item(a, "MoE: SwiGLU output", "[N*K,F]", L, kF32Bytes * N * K * F);
  add_item(a, "MoE: expert outputs", "[N*K,C]", L, kF32Bytes * N * K * C);
  add_item(a, "MoE: sublayer output h", "[N,C]", L, kF32Bytes * N * C);
  add_item(a, "embedding output", "[N,C]", 1, kF32Bytes * N * C);

  auto& g = m.backward_buffers;
  add_item(g, "residual (two), output and the two norms' gradients", "5*[N,C]", 1,
           kF32Bytes * 5 * N * C);
  add_item(g, split ? "dc, dqk" : "dc, dy, dqk", split ? "2*[N,Cc]" : "3*[N,Cc]", 1,
           kF32Bytes * (split ? 2 : 3) * N * Cc);
  add_item(g, "dq, dk, dv", "[N,Hq*d] + 2*[N,Hk*d]", 1, kF32Bytes * N * (Dq + 2 * Dkv));
  add_item(g, "attention output gradient", "[N,Hq*d]", 1, kF32Bytes * N * Dq);
  add_item(g, "attention tiles, k, v in key tiles and their gradients",
           "tiles + 2*[N,Hk*d]*(dtype + fp32)", 1,
           ops::attention_scratch_bytes({B, Tk, Hq, Hk, c.head_dim}, precision));
  add_item(g, "router state gradients d_r, d_r_prev", "2*[N,R]", 1, kF32Bytes * 2 * N * R);
  add_item(g, "router MLP and logits gradients", "2*[N,R] + [N,S]", 1,
           kF32Bytes * N * (2 * R + S));
  add_item(g, "expert input and output gradients", "2*[N*K,C]", 1, kF32Bytes * 2 * N * K * C);
  add_item(g, "expert hidden and SwiGLU gradients", "[N*K,2F] + [N*K,F]", 1,
           kF32Bytes * N * K * 3 * F);
  add_item(g, "gate gradient", "[N,K]", 1, kF32Bytes * N * K);
}

// Context parallelism over C ranks: the whole sequences' keys and values, gathered every
// layer and kept for backward, their gradients, the exchanges' staging, and for CCA each
// chunk's c and y with the R rows before it (model/context_parallel.h).
void context_parallel_items(const ModelConfig& c, int64_t B, int64_t T, int64_t C,
                            MemoryEstimate& m) {
  if (C == 1) return;
  const int64_t L = c.n_layers, Dkv = c.kv_dim(), tc = T / (2 * C);
  add_item(m.activations, "gathered k, v (context parallel)", "2*[B,T,Dkv]", L,
           kF32Bytes * 2 * B * T * Dkv);
  add_item(m.backward_buffers, "gathered k, v gradients (context parallel)", "2*[B,T,Dkv]", 1,
           kF32Bytes * 2 * B * T * Dkv);
  // Four exchanges (k and v of two slots), each staging this rank's rows of a slot and the
  // group's: in host memory on the CPU, in device buffers on a GPU.
  add_item(m.backward_buffers, "k, v exchange staging (context parallel)", "4*(1+C)*[B,Tc,Dkv]",
           1, kF32Bytes * 4 * (1 + C) * B * tc * Dkv);
  if (!c.is_zaya()) return;
  const int64_t Cc = cca_dims(c).channels();
  const int64_t R = c.context_halo_rows();
  const int64_t ext = 2 * B * (R + tc) * Cc;
  add_item(m.activations, "CCA: c, y with halo rows (context parallel)", "2*[2B,R+Tc,Cc]", L,
           kF32Bytes * 2 * ext);
  add_item(m.backward_buffers, "CCA: halo-row scratch (context parallel)",
           "2*[2B,R+Tc,Cc] + halos", 1,
           kF32Bytes * (2 * ext + 2 * 2 * B * std::max(R * Cc, Dkv / 2)));
}

}  // namespace

int64_t checkpoint_bytes(const ModelConfig& config, bool muon) {
  int64_t bytes = 0;
  const ParamTable table(config);
  for (const ParamInfo& p : table.params())
    bytes += p.numel * kF32Bytes * (muon && is_muon_matrix(p) ? 2 : 3);
  return bytes;
}

MemoryEstimate estimate_memory(const ModelConfig& c, int64_t batch, int64_t seq,
                               DType precision, bool muon, int64_t context) {
  FOUNDRY_CHECK(context >= 1);
  const int64_t P = count_parameters(c).total;
  // With context parallelism a rank holds T = seq / context rows of each sequence.
  const int64_t T = std::max<int64_t>(1, seq / context);
  const int64_t N = batch * T, C = c.d_model, Vp = c.padded_vocab();

  MemoryEstimate m;
  m.weights_fp32_bytes = kF32Bytes * P;
  m.weights_bf16_bytes = precision == DType::bf16 ? kBf16Bytes * P : 0;
  m.grads_bytes = kF32Bytes * P;
  // Each tensor's state is its optimizer's: AdamW's two moments, or with Muon its momentum of
  // the matrices (the other's slab ranges take no memory: optim/device_optimizer.cpp).
  const int64_t muon_elements = muon ? muon_matrix_elements(c) : 0;
  m.adamw_state_bytes = 2 * kF32Bytes * (P - muon_elements);
  m.muon_momentum_bytes = kF32Bytes * muon_elements;
  m.optimizer_bytes = m.adamw_state_bytes + m.muon_momentum_bytes;

  if (c.is_zaya())
    zaya_activations(c, batch, T, seq, precision, m);
  else
    standard_activations(c, batch, T, seq, precision, m);
  context_parallel_items(c, batch, seq, context, m);
  auto& a = m.activations;
  add_item(a, "final residual", "[N,C]", 1, kF32Bytes * N * C);
  add_item(a, "final norm output and 1/rms", "[N,C] + [N]", 1, kF32Bytes * (N * C + N));
  add_item(a, "logits (then their gradient)", "[N,Vp]", 1, kF32Bytes * N * Vp);
  add_item(a, "per-token losses", "[N]", 1, kF32Bytes * N);
  add_item(a, "input and target ids", "2*[N]", 1, kI32Bytes * 2 * N);

  for (const MemoryItem& item : m.activations) m.activations_bytes += item.bytes;
  for (const MemoryItem& item : m.backward_buffers) m.backward_buffers_bytes += item.bytes;
  m.total_bytes = m.weights_fp32_bytes + m.weights_bf16_bytes + m.grads_bytes +
                  m.optimizer_bytes + m.activations_bytes + m.backward_buffers_bytes;
  return m;
}

void add_checkpoint_copies(MemoryEstimate& m, int64_t snapshot_bytes,
                           int64_t memory_checkpoints_bytes) {
  m.total_bytes += snapshot_bytes - m.checkpoint_snapshot_bytes + memory_checkpoints_bytes -
                   m.memory_checkpoints_bytes;
  m.checkpoint_snapshot_bytes = snapshot_bytes;
  m.memory_checkpoints_bytes = memory_checkpoints_bytes;
}

int64_t decode_state_bytes(const ModelConfig& c, int64_t max_len, int64_t batch) {
  const int64_t L = c.n_layers, Dq = c.q_dim(), Dkv = c.kv_dim(), Cc = Dq + Dkv;
  const int64_t C = c.d_model, K = c.top_k, F = c.ffn_dim;
  // Per sequence: its key and value caches, its logits and its scores over the context.
  int64_t floats = 2 * L * max_len * Dkv + c.padded_vocab() + c.n_heads * max_len;
  if (c.is_zaya())  // convolution windows and the ZAYA1 router's state vectors
    floats += L * (Cc * (c.cca_kernel_depthwise - 1 + c.cca_kernel_grouped - 1) + Dkv / 2) +
              7 * c.router_latent_dim;
  // Per-token vectors: hidden states, q/k/v and attention output, the MoE rows (input, gate|up,
  // activation, output), router probabilities, top-k choice and gate.
  floats += 5 * C + 3 * Cc + K * (2 * C + 3 * F) + 2 * c.router_classes() + 2 * K;
  return kF32Bytes * floats * batch;
}

namespace {

// The role of a tensor, for the optimizer table.
std::string group_of(const ParamInfo& p) {
  const std::string& n = p.name;
  const bool matrix = p.shape.size() == 2;
  if (p.kind == ParamKind::embedding) return "embedding (tied LM head)";
  if (n.find("residual_scale.") != std::string::npos ||
      n.starts_with("model.input_hidden_states_"))
    return "residual scaling (alpha, beta)";
  if (n.ends_with("qk_norm.temp")) return "QK-norm temperatures";
  if (p.kind == ParamKind::router || n.find(".mlp.gate.") != std::string::npos)
    return matrix ? "router matrices" : "router vectors (biases, EDA gamma, norm)";
  if (p.kind == ParamKind::norm) return "RMSNorm weights";
  if (p.kind == ParamKind::attention) {
    if (matrix) return "attention projections (q, k, v, o)";
    return p.shape.size() == 1 ? "CCA convolution biases" : "CCA convolution weights";
  }
  if (p.kind == ParamKind::expert)
    return p.expert >= 0 && n.find("experts.") != std::string::npos ? "experts (gate, up, down)"
                                                                     : "FFN (gate, up, down)";
  return "other scales";
}

}  // namespace

std::vector<ParamGroup> param_groups(const ModelConfig& config, const OptimizerOf& optimizer_of) {
  const ParamTable table(config);
  std::vector<ParamGroup> groups;
  std::map<std::pair<std::string, std::string>, size_t> index;
  for (const ParamInfo& p : table.params()) {
    const std::string name = group_of(p);
    const std::string optimizer =
        optimizer_of ? optimizer_of(p) : optimizer_name(OptimizerKind::adamw);
    auto [it, inserted] = index.try_emplace({name, optimizer}, groups.size());
    if (inserted) groups.push_back({name, 0, 0, optimizer});
    ParamGroup& g = groups[it->second];
    ++g.tensors;
    g.params += p.numel;
  }
  return groups;
}

ContextParallelTraffic context_parallel_traffic(const ModelConfig& c, int64_t batch, int64_t seq,
                                                int64_t context) {
  ContextParallelTraffic t;
  if (context <= 1) return t;
  const int64_t L = c.n_layers, block = kF32Bytes * batch * (seq / context) * c.kv_dim();
  t.kv_gather_bytes = L * 2 * (context - 1) * block;
  t.kv_grad_bytes = L * 2 * (context - 1) * block;
  if (c.is_zaya()) {
    // A middle rank sends each of its two chunks' last rows to one neighbour, forward, and
    // the halos' gradients back, backward: R packed rows and one half-width value row.
    const int64_t R = c.context_halo_rows();
    const int64_t row = R * cca_dims(c).channels() + c.kv_dim() / 2;
    t.halo_bytes = L * 2 * 2 * kF32Bytes * batch * row;
  }
  return t;
}

ModelInfo model_info(const ModelConfig& config, int64_t batch, int64_t seq, DType precision,
                     const std::string& optimizer, const OptimizerOf& optimizer_of,
                     int64_t context) {
  if (batch < 1 || seq < 1)
    fail(fmt::format("batch size {} and sequence length {} must both be >= 1", batch, seq));
  if (context < 1 || (context > 1 && seq % (2 * context) != 0))
    fail(fmt::format("context parallel {} does not cut sequences of {} tokens into {} equal "
                     "chunks",
                     context, seq, 2 * context),
         fmt::format("use a sequence length that is a multiple of {}", 2 * context));
  const int64_t halo = config.context_halo_rows();
  if (context > 1 && seq / (2 * context) < std::max<int64_t>(halo, 1))
    fail(fmt::format("context parallel {} cuts sequences of {} tokens into chunks of {}, fewer "
                     "than the {} rows the CCA convolutions read before a chunk",
                     context, seq, seq / (2 * context), halo),
         "use fewer context-parallel ranks or longer sequences");
  const std::optional<OptimizerKind> kind = parse_optimizer(optimizer);
  if (!kind) fail(fmt::format("unknown optimizer '{}'", optimizer), "choose adamw or muon");
  ModelInfo info;
  info.config = config;
  info.batch = batch;
  info.seq = seq;
  info.precision = precision;
  info.optimizer = *kind;
  info.params = count_parameters(config);
  info.flops = flops_per_token(config, seq);
  info.train_flops_per_step =
      info.flops.train_flops * static_cast<double>(batch) * static_cast<double>(seq);
  info.memory =
      estimate_memory(config, batch, seq, precision, *kind == OptimizerKind::muon, context);
  info.context = context;
  info.traffic = context_parallel_traffic(config, batch, seq, context);
  info.groups = param_groups(config, optimizer_of);
  return info;
}

// ---- reporting ---------------------------------------------------------------------------

namespace {


json items_to_json(const std::vector<MemoryItem>& items) {
  json out = json::array();
  for (const MemoryItem& item : items)
    out.push_back({{"name", item.name},
                   {"shape", item.shape},
                   {"copies", item.copies},
                   {"bytes", item.bytes}});
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

}  // namespace

json to_json(const ModelInfo& info) {
  const ParamCounts& p = info.params;
  const FlopsPerToken& f = info.flops;
  const MemoryEstimate& m = info.memory;
  json params{{"total", p.total},
              {"embedding", p.embedding},
              {"non_embedding", p.non_embedding},
              {"active", p.active},
              {"active_non_embedding", p.active_non_embedding},
              {"attention_per_layer", p.attention_per_layer},
              {"norms_per_layer", p.norms_per_layer},
              {"router_per_layer", p.router_per_layer},
              {"router_first_layer", p.router_first_layer},
              {"per_expert", p.per_expert},
              {"experts_per_layer", p.experts_per_layer},
              {"residual_scales_per_layer", p.residual_scales_per_layer},
              {"input_scales", p.input_scales},
              {"per_layer", p.per_layer},
              {"final_norm", p.final_norm}};
  if (info.config.is_zaya())
    params["cca_per_layer"] = {{"q", p.cca.q},
                               {"k", p.cca.k},
                               {"v_half", p.cca.v_half},
                               {"convolutions", p.cca.convolutions},
                               {"o", p.cca.o},
                               {"temperature", p.cca.temperature},
                               {"total", p.cca.total}};
  json groups = json::array();
  for (const ParamGroup& g : info.groups)
    groups.push_back({{"name", g.name},
                      {"tensors", g.tensors},
                      {"params", g.params},
                      {"optimizer", g.optimizer}});
  return json{
      {"model", to_json(info.config)},
      {"batch_size", info.batch},
      {"activation_sequences", info.activation_batch > 0 ? info.activation_batch : info.batch},
      {"seq_len", info.seq},
      {"tokens_per_step", info.batch * info.seq},
      {"context_parallel",
       {{"ranks", info.context},
        {"kv_gather_bytes", info.traffic.kv_gather_bytes},
        {"kv_grad_bytes", info.traffic.kv_grad_bytes},
        {"halo_bytes", info.traffic.halo_bytes},
        {"sent_bytes_per_step", info.traffic.total()}}},
      {"precision", dtype_name(info.precision)},
      {"optimizer", optimizer_name(info.optimizer)},
      {"parameters", params},
      {"param_groups", groups},
      {"flops_per_token",
       {{"matmul_params", f.matmul_params},
        {"matmul", f.matmul_flops},
        {"convolutions", f.conv_flops},
        {"attention", f.attention_flops},
        {"attention_causal", f.attention_causal_flops},
        {"forward", f.forward_flops},
        {"train", f.train_flops},
        {"attention_convention",
         "attention: full T x T scores; attention_causal (what train counts): the causal "
         "half, (T+1)/2 keys a query"}}},
      {"train_flops_per_step", info.train_flops_per_step},
      {"memory_bytes",
       {{"weights_fp32", m.weights_fp32_bytes},
        {"weights_bf16", m.weights_bf16_bytes},
        {"grads", m.grads_bytes},
        {"optimizer", m.optimizer_bytes},
        {"adamw_state", m.adamw_state_bytes},
        {"muon_momentum", m.muon_momentum_bytes},
        {"activations", m.activations_bytes},
        {"backward_buffers", m.backward_buffers_bytes},
        {"checkpoint_snapshot", m.checkpoint_snapshot_bytes},
        {"memory_checkpoints", m.memory_checkpoints_bytes},
        {"total", m.total_bytes}}},
      {"activations", items_to_json(m.activations)},
      {"backward_buffers", items_to_json(m.backward_buffers)},
  };
}

namespace {

// The text of `model info`, a line at a time, in aligned rows.
struct InfoText {
  std::string out;
  void line(const std::string& text) { out += text + "\n"; }
  void count_row(const std::string& label, int64_t n) {
    line(fmt::format("  {:<44} {:>17}  {:>10}", label, with_separators(n),
                     format_count(double(n))));
  }
  void flops_row(const std::string& label, double flops) {
    line(fmt::format("  {:<44} {:>17}", label, format_flops(flops)));
  }
  void bytes_row(const std::string& label, int64_t bytes) {
    line(fmt::format("  {:<44} {:>17}", label, format_bytes(double(bytes))));
  }
};

void describe_shape(InfoText& t, const ModelInfo& info) {
  const ModelConfig& c = info.config;
  if (c.is_zaya()) {
    t.line(fmt::format("model: zaya1, {} layers of CCA + MoE ({} sublayers), d_model {}, CCA {} "
                       "query / {} kv heads x {} (latents {} / {}), {} experts top-{}{}, "
                       "ffn_dim {}, router latent {}, vocab {} (padded {})",
                       c.n_layers, 2 * c.n_layers, c.d_model, c.n_heads, c.n_kv_heads,
                       c.head_dim, c.q_dim(), c.kv_dim(), c.n_experts, c.top_k,
                       c.router_skip_class ? " + skip class" : "", c.ffn_dim,
                       c.router_latent_dim, c.vocab_size, c.padded_vocab()));
  } else {
    const std::string experts =
        c.n_experts == 1 ? std::string("dense SwiGLU")
                         : fmt::format("{} experts, top-{}", c.n_experts, c.top_k);
    t.line(fmt::format("model: {} layers, d_model {}, {} heads x {} ({} kv heads), {}, "
                       "ffn_dim {}, vocab {} (padded {})",
                       c.n_layers, c.d_model, c.n_heads, c.head_dim, c.n_kv_heads, experts,
                       c.ffn_dim, c.vocab_size, c.padded_vocab()));
  }
  t.line(fmt::format("step:  batch {} x seq {} = {} tokens, precision {}, optimizer {}",
                     info.batch, info.seq, with_separators(info.batch * info.seq),
                     dtype_name(info.precision), optimizer_name(info.optimizer)));
  t.line("");
}

void describe_zaya_parameters(InfoText& t, const ModelConfig& c, const ParamCounts& p) {
  // Active counts top_k real experts per MoE sublayer: the skip class runs none.
  t.count_row(fmt::format("per CCA sublayer (x{})", c.n_layers), p.cca.total);
  t.count_row("  q_proj", p.cca.q);
  t.count_row("  k_proj", p.cca.k);
  t.count_row(fmt::format("  v_proj current + delayed (2 x {})", with_separators(p.cca.v_half)),
              2 * p.cca.v_half);
  t.count_row("  convolutions (depthwise, grouped, biases)", p.cca.convolutions);
  t.count_row("  o_proj", p.cca.o);
  t.count_row("  QK-norm temperature", p.cca.temperature);
  t.count_row(fmt::format("per MoE sublayer: router (x{})", c.n_layers), p.router_per_layer);
  if (p.router_first_layer != p.router_per_layer)
    t.count_row("  first MoE sublayer's router (no EDA gamma)", p.router_first_layer);
  t.count_row("per expert (gate, up, down)", p.per_expert);
  t.count_row(fmt::format("per MoE sublayer: all {} experts", c.n_experts), p.experts_per_layer);
  t.count_row("per layer: residual scaling (2 x 4 x C)", p.residual_scales_per_layer);
  t.count_row("per layer: norms (2 pre-norms)", p.norms_per_layer);
  t.count_row("per layer: total (layers after the first)", p.per_layer);
  t.count_row("embedding residual scale and bias", p.input_scales);
  t.count_row("final norm", p.final_norm);
  if (p.router_first_layer != p.router_per_layer)
    t.line(fmt::format("  (the first MoE sublayer has no EDA weight router_states_scale: its "
                       "router has {} fewer)",
                       p.router_per_layer - p.router_first_layer));
  t.line(fmt::format("  (active: {} real expert(s) per MoE sublayer; a token routed to the skip "
                     "class runs none)",
                     active_experts(c)));
}

void describe_standard_parameters(InfoText& t, const ModelConfig& c, const ParamCounts& p) {
  t.count_row("per layer: attention (q, k, v, o)", p.attention_per_layer);
  if (c.n_experts > 1) t.count_row("per layer: router", p.router_per_layer);
  t.count_row(c.n_experts > 1 ? "per expert (w1, w3, w2)" : "per layer: FFN (gate, up, down)",
              p.per_expert);
  if (c.n_experts > 1) t.count_row("per layer: all experts", p.experts_per_layer);
  t.count_row(c.qk_norm == QkNorm::none ? "per layer: norms"
                                          : "per layer: norms (2 pre-norms, q and k norms)",
              p.norms_per_layer);
  t.count_row("per layer: total", p.per_layer);
  t.count_row("final norm", p.final_norm);
}

void describe_parameters(InfoText& t, const ModelInfo& info) {
  const ParamCounts& p = info.params;
  // Headline counts in the unit and decimals of the model's size: "0.754 B" next to "8.303 B".
  auto in_model_scale = [&p](int64_t n) {
    return format_count_like(double(n), double(p.non_embedding));
  };
  t.line(fmt::format("parameters: {} total / {} active per token without embeddings; "
                     "embedding {}",
                     in_model_scale(p.non_embedding), in_model_scale(p.active_non_embedding),
                     in_model_scale(p.embedding)));
  t.count_row("total", p.total);
  t.count_row("embedding (tied with the LM head)", p.embedding);
  t.count_row("non-embedding", p.non_embedding);
  t.count_row("active per token", p.active);
  t.count_row("active per token, non-embedding", p.active_non_embedding);
  if (info.config.is_zaya())
    describe_zaya_parameters(t, info.config, p);
  else
    describe_standard_parameters(t, info.config, p);
  t.line("");
  t.line(fmt::format("optimizer groups (train.optimizer = {})", optimizer_name(info.optimizer)));
  for (const ParamGroup& g : info.groups)
    t.line(fmt::format("  {:<44} {:>17}  {:>10}  {:>5} tensors  {}", g.name,
                       with_separators(g.params), format_count(double(g.params)), g.tensors,
                       g.optimizer));
  t.line("");
}

void describe_flops(InfoText& t, const ModelInfo& info) {
  const FlopsPerToken& f = info.flops;
  t.line("training FLOPs per token (forward + backward)");
  t.flops_row(fmt::format("matmuls (6 x {} weights)", format_count(double(f.matmul_params))),
              f.matmul_flops);
  if (info.config.is_zaya()) t.flops_row("CCA convolutions (6*L*(Cc*t0 + Cc*d*t1))", f.conv_flops);
  t.flops_row("attention (12*L*Dq*(T+1)/2, causal)", f.attention_causal_flops);
  t.flops_row("total (used for MFU)", f.train_flops);
  t.flops_row("  of which forward", f.forward_flops);
  t.flops_row("attention if full T x T (info)", f.attention_flops);
  t.flops_row("per step", info.train_flops_per_step);
  t.line("");
}

void describe_context_parallel(InfoText& t, const ModelInfo& info) {
  if (info.context <= 1) return;
  t.line(fmt::format("context parallel {}: each rank holds chunks r and {}-r of every sequence, "
                     "{} of its {} tokens; memory below is per rank",
                     info.context, 2 * info.context - 1, info.seq / info.context, info.seq));
  const ContextParallelTraffic& traffic = info.traffic;
  t.bytes_row("sent per step per rank: k, v all-gathers", traffic.kv_gather_bytes);
  t.bytes_row("  their gradients' reduce-scatters", traffic.kv_grad_bytes);
  if (info.config.is_zaya()) t.bytes_row("  CCA boundary rows (a middle rank)", traffic.halo_bytes);
  t.bytes_row("  total", traffic.total());
  t.line("");
}

void describe_memory(InfoText& t, const ModelInfo& info) {
  const MemoryEstimate& m = info.memory;
  t.line("memory");
  t.bytes_row("weights fp32", m.weights_fp32_bytes);
  if (m.weights_bf16_bytes) t.bytes_row("weights bf16 (GEMM copies)", m.weights_bf16_bytes);
  t.bytes_row("gradients fp32", m.grads_bytes);
  t.bytes_row("AdamW state (exp_avg, exp_avg_sq)", m.adamw_state_bytes);
  if (m.muon_momentum_bytes) t.bytes_row("Muon momentum", m.muon_momentum_bytes);
  t.bytes_row("activations saved for backward", m.activations_bytes);
  t.bytes_row("backward working buffers", m.backward_buffers_bytes);
  if (m.checkpoint_snapshot_bytes)
    t.bytes_row("checkpoint snapshot (host memory on a GPU)", m.checkpoint_snapshot_bytes);
  if (m.memory_checkpoints_bytes)
    t.bytes_row("in-memory checkpoints (two)", m.memory_checkpoints_bytes);
  t.bytes_row("total", m.total_bytes);
  t.line("");
  t.line(
      fmt::format("activations (B = {}, T = {}, N = B*T, K = {} experts per token; xL = one "
                  "copy per layer)",
                  info.activation_batch > 0 ? info.activation_batch : info.batch,
                  info.seq / info.context, active_experts(info.config)));
  for (const MemoryItem& item : m.activations) {
    const std::string label =
        item.copies > 1 ? fmt::format("{} x{}", item.name, item.copies) : item.name;
    t.line(fmt::format("  {:<44} {:<19} {:>12}", label, item.shape,
                       format_bytes(double(item.bytes))));
  }
}

}  // namespace

std::string format_model_info(const ModelInfo& info) {
  InfoText t;
  describe_shape(t, info);
  describe_parameters(t, info);
  describe_flops(t, info);
  describe_context_parallel(t, info);
  describe_memory(t, info);
  return t.out;
}

}  // namespace foundry
