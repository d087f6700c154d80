// What a model configuration costs, computed from the config alone (nothing is allocated):
// parameter counts, training FLOPs per token, and memory for a batch shape.
//
// Notation: C = d_model, L = n_layers, H = n_heads, Dq = n_heads·head_dim,
// Dkv = n_kv_heads·head_dim, E = n_experts, K = top_k (experts each token runs; 1 for a dense
// model), F = ffn_dim, Vp = padded vocabulary, B = batch, T = sequence length, N = B·T.
//
// Parameters (tied embeddings: the LM head is the embedding matrix, counted once):
//   embedding   Vp·C
//   per layer   attention 2·Dq·C + 2·Dkv·C (q, o; k, v)   norms 2·C
//               router E·C (0 for a dense model)        experts E·3·F·C (w1, w3, w2)
//   final norm  C
//   active per token = embedding + L·(attention + norms + router + K·3·F·C) + C
//
// Training FLOPs per token (forward + backward; the backward pass costs twice the forward):
//   matmul      6 · (L·(2·Dq·C + 2·Dkv·C + E·C [router, MoE only] + K·3·F·C) + Vp·C)
//               i.e. 6 × every weight a token multiplies, including the LM head over the
//               padded vocabulary. The embedding lookup, norms, RoPE, softmax, SwiGLU and
//               routing are not matmuls and are not counted (O(C) per token, not O(C²)).
//   attention   6 · 2 · L · T · Dq   (q·kᵀ and probs·v, 2·T·Dq FLOPs each per token forward)
//               Convention: the full T×T score matrix is counted, without halving for the
//               causal mask (as in PaLM's MFU accounting and as our attention kernel
//               computes it). The causal count, 6·2·L·Dq·(T+1)/2 (a token at position t sees
//               t+1 keys), is reported alongside as attention_causal_flops.
//   train_flops_per_token = matmul + attention. MFU = tokens/s · this / peak FLOP/s.
//
// Memory (bytes; fp32 = 4 bytes per element; alignment padding in the slabs, under 64 bytes
// per tensor, is ignored):
//   weights fp32 4·P, bf16 GEMM copies 2·P (precision bf16 only), gradients 4·P,
//   AdamW exp_avg + exp_avg_sq 8·P, with P = total parameters.
//   Activations saved by the forward pass for backward, fp32 unless noted (ints are int32):
//     per layer (× L)  layer input x [N,C]; norm-1 output [N,C] and 1/rms [N];
//                      q [N,Dq], k [N,Dkv], v [N,Dkv] after RoPE; attention probabilities
//                      [B,H,T,T]; attention output (o_proj input) [N,Dq]; residual after
//                      attention [N,C]; norm-2 output [N,C] and 1/rms [N]; router
//                      probabilities [N,E]; top-k ids (int) and weights [N,K]; dispatch
//                      plan (int) 2·[N·K] (its E+1 expert offsets are ignored, so every
//                      activation is proportional to B); expert inputs sorted by expert
//                      [N·K,C]; expert hidden gate|up [N·K,2F]; SwiGLU output [N·K,F];
//                      expert outputs [N·K,C]
//     once             final residual [N,C]; final-norm output [N,C] and 1/rms [N];
//                      logits [N,Vp] (the loss gradient is written in place); per-token
//                      losses [N]; input and target ids (int) 2·[N]
//   Backward working buffers (one set, reused by every layer): residual and norm gradients
//   2·[N,C]; dq [N,Dq], dk, dv [N,Dkv]; attention-output gradient [N,Dq]; attention-score
//   gradient [B,H,T,T]; expert-input and expert-output gradients 2·[N·K,C]; hidden and
//   SwiGLU gradients [N·K,2F] + [N·K,F]; gate-weight gradient [N,K]; router gradient [N,E].
//   Not counted: oneDNN and bf16-conversion scratch, the allocator's overhead.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/config_reader.h"
#include "kernels/gemm.h"
#include "model/config.h"

namespace foundry {

struct ParamCounts {
  int64_t embedding = 0;            // Vp·C (also the LM head)
  int64_t attention_per_layer = 0;  // q, k, v, o projections
  int64_t norms_per_layer = 0;      // the two RMSNorm weights
  int64_t router_per_layer = 0;     // E·C; 0 for a dense model
  int64_t per_expert = 0;           // 3·F·C (w1, w3, w2), or the dense FFN
  int64_t experts_per_layer = 0;    // E·per_expert
  int64_t per_layer = 0;            // everything in one layer
  int64_t final_norm = 0;           // C
  int64_t total = 0;                // equals ParamTable(config).parameter_count()
  int64_t non_embedding = 0;        // total − embedding
  int64_t active = 0;               // used by one token: the top-k experts of each layer
  int64_t active_non_embedding = 0;
};

struct FlopsPerToken {              // one training step's FLOPs per token
  int64_t matmul_params = 0;        // active weights that take part in a GEMM, incl. LM head
  double matmul_flops = 0;          // 6·matmul_params
  double attention_flops = 0;       // 12·L·T·Dq (full T×T, the convention used for MFU)
  double attention_causal_flops = 0;  // 12·L·Dq·(T+1)/2 (only the unmasked half)
  double forward_flops = 0;         // a third of train_flops
  double train_flops = 0;           // matmul_flops + attention_flops
};

struct MemoryItem {
  std::string name;
  std::string shape;    // symbolic, e.g. "[B,H,T,T]"
  int64_t copies = 1;   // L for per-layer tensors
  int64_t bytes = 0;    // all copies together
};

struct MemoryEstimate {
  int64_t weights_fp32_bytes = 0;
  int64_t weights_bf16_bytes = 0;   // GEMM copies; 0 unless precision is bf16
  int64_t grads_bytes = 0;
  int64_t optimizer_bytes = 0;      // AdamW exp_avg + exp_avg_sq
  int64_t activations_bytes = 0;    // saved by forward for backward
  int64_t backward_buffers_bytes = 0;
  int64_t total_bytes = 0;
  std::vector<MemoryItem> activations;       // itemized activations_bytes
  std::vector<MemoryItem> backward_buffers;  // itemized backward_buffers_bytes
};

struct ModelInfo {
  ModelConfig config;
  int64_t batch = 0, seq = 0;
  DType precision = DType::bf16;
  ParamCounts params;
  FlopsPerToken flops;
  double train_flops_per_step = 0;  // flops.train_flops · B · T
  MemoryEstimate memory;
};

ParamCounts count_parameters(const ModelConfig& config);
FlopsPerToken flops_per_token(const ModelConfig& config, int64_t seq);
// The FLOPs of one training step per token (forward + backward); the MFU numerator.
double train_flops_per_token(const ModelConfig& config, int64_t seq);
MemoryEstimate estimate_memory(const ModelConfig& config, int64_t batch, int64_t seq,
                               DType precision);

// All of the above. Fails on batch or seq < 1.
ModelInfo model_info(const ModelConfig& config, int64_t batch, int64_t seq, DType precision);

json to_json(const ModelInfo& info);
// A readable report: counts with thousands separators and in M/B, FLOPs, memory in MiB/GiB.
std::string format_model_info(const ModelInfo& info);

}  // namespace foundry
