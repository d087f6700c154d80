// What a model configuration costs, computed from the config alone (nothing is allocated):
// parameter counts, training FLOPs per token, memory for a batch shape, and which optimizer
// updates each group of parameters.
//
// Notation: C = d_model, L = n_layers, H = n_heads, Dq = n_heads·head_dim,
// Dkv = n_kv_heads·head_dim, E = n_experts, K = top_k (experts each token runs; 1 for a dense
// model), F = ffn_dim, Vp = padded vocabulary, B = batch, T = sequence length, N = B·T.
//
// ==== arch "moe" ============================================================================
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
//   attention   6 · 2 · L · Dq · (T+1)/2   (q·kᵀ and probs·v, 2·Dq FLOPs each per key a token
//               sees, and a token at position t sees t+1 keys: the causal count).
//               Convention: only the products a causal model needs are counted; the tiled
//               kernel skips the masked tiles, and counting the full T×T (PaLM's accounting,
//               6·2·L·T·Dq, reported alongside as attention_flops) would let MFU pass 100%
//               on long sequences.
//   train_flops_per_token = matmul + attention. MFU = tokens/s · this / peak FLOP/s.
//
// Memory (bytes; fp32 = 4 bytes per element; alignment padding in the slabs, under 64 bytes
// per tensor, is ignored):
//   weights fp32 4·P, bf16 GEMM copies 2·P (precision bf16 only), gradients 4·P,
//   AdamW exp_avg + exp_avg_sq 8·P, with P = total parameters. With train.optimizer "muon"
//   the trainer still allocates AdamW's two slabs over the whole table (AdamW skips the
//   Muon tensors but its slabs keep the table's layout) plus Muon's momentum slab, 4·P:
//   optimizer state 12·P. (Muon's per-tensor scratch, a few copies of the largest matrix,
//   is not counted.)
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
//   Backward working buffers (one set, reused by every layer): the residual gradient and the
//   attention and MoE norms' gradients 3·[N,C]; dq [N,Dq], dk, dv [N,Dkv]; attention-output
//   gradient [N,Dq]; attention-score gradient [B,H,T,T]; expert-input and expert-output gradients
//   2·[N·K,C]; hidden and SwiGLU gradients [N·K,2F] + [N·K,F]; gate-weight gradient [N,K]; router
//   gradient [N,E]. Not counted: oneDNN and bf16-conversion scratch, the allocator's overhead.
//
// ==== arch "zaya1" ==========================================================================
// A layer is a pair of sublayers: CCA attention, then MoE with the ZAYA1 router (n_layers
// counts pairs: ZAYA1-base has L = 40, i.e. 80 sublayers). More notation: Hq = n_heads,
// Hk = n_kv_heads, d = head_dim, Cc = (Hq+Hk)·d packed q|k channels, t0, t1 the convolution
// kernel sizes, R = router_latent_dim, S = router classes (E, +1 with the skip class).
// Parameters (exactly the ParamTable's tensors):
//   embedding            Vp·C, plus its residual scale and bias 2·C (model-wide)
//   per CCA sublayer     q Hq·d·C, k Hk·d·C, v 2 × (Hk·d/2)·C, convolutions
//                        Cc·t0 + Cc + Cc·d·t1 + Cc (depthwise, grouped, with biases),
//                        o C·Hq·d, temperature Hk
//   per MoE sublayer     router R·C + R (down_proj) + R (EDA gamma; not in layer 0) + R (norm)
//                        + 2·(R·R + R) (fc1, fc2) + S·R (out_proj, no bias);
//                        experts E·3·F·C
//   per layer            residual scaling 2 sublayers × 4·C (α, β for residual and output);
//                        norms 2·C (the pre-norms of both sublayers)
//   final norm           C
//   active per token     everything except the experts a token does not run: top_k REAL
//                        experts per MoE sublayer (a token routed to the skip class runs
//                        none, so this is an upper bound; with top_k > E, at most E).
// ZAYA1-base: CCA 5,575,682, router 660,992 (660,736 in layer 0), expert 12,582,912,
// 16 experts 201,326,592; total 8,303,355,728 and active 753,608,528 without embeddings.
//
// Training FLOPs per token:
//   matmul        6 · (L·(q + k + 2·v_half + o [CCA GEMMs] + R·C + 2·R² + S·R [router GEMMs]
//                 + K·3·F·C) + Vp·C)          (biases, EDA, norms, GELU: elementwise, uncounted)
//   convolutions  6 · L · (Cc·t0 + Cc·d·t1): counted like matmuls, a forward of 2·Cc·t0
//                 (depthwise) + 2·Cc·d·t1 (grouped) multiply-adds per token
//   attention     6 · 2 · L · Hq·d · (T+1)/2  (causal, as for moe; full T×T alongside)
//   train_flops_per_token = matmul + convolutions + attention. The K experts' part is an upper
//   bound: choices that go to the skip class run no expert, and the trainer's MFU counts
//   what the step ran (expert_train_flops_per_token × the step's skip fraction left out).
//
// Memory: weights, gradients and optimizer state as for moe. Activations saved for backward
// (Nk = N·K, int = int32):
//   per CCA sublayer (× L)  residual in [N,C]; norm output [N,C] + 1/rms [N]; packed
//                      c = [q0|k0] [N,Cc]; depthwise output y [N,Cc]; pre-norm qk [N,Cc];
//                      QK-norm 1/norms [N,Hq+Hk]; q [N,Hq·d], k, v [N,Hk·d]; attention
//                      probabilities [B,Hq,T,T]; attention output [N,Hq·d]; output h [N,C]
//   per MoE sublayer (× L)  residual in [N,C]; norm output [N,C] + 1/rms [N]; router state
//                      r [N,R]; router-norm output u [N,R] + 1/rms [N]; a1, g1, a2, g2
//                      4·[N,R]; probabilities [N,S]; choice (int) [N,K], gate [N,K];
//                      dispatch plan (int) 2·[Nk]; expert inputs [Nk,C]; gate|up [Nk,2F];
//                      SwiGLU output [Nk,F]; expert outputs [Nk,C]; output h [N,C]
//   once               embedding output [N,C]; final residual [N,C]; final norm [N,C] + [N];
//                      logits [N,Vp]; losses [N]; input and target ids (int) 2·[N]
//   Backward working buffers (one set): two residual gradients, the sublayer output's and
//   the CCA and MoE norms' gradients 5·[N,C]; dc, dy, dqk 3·[N,Cc]; dq [N,Hq·d], dk, dv [N,Hk·d];
//   attention-output gradient [N,Hq·d]; attention-score gradient [B,Hq,T,T]; router-state gradients
//   d_r, d_r_prev 2·[N,R]; router MLP gradients 2·[N,R] + logits gradient [N,S]; expert input and
//   output gradients 2·[Nk,C]; hidden and SwiGLU gradients [Nk,2F] + [Nk,F]; gate gradient [N,K].
//   Not counted: the balancing biases and their AdamW state (L·S·3 floats).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/config_reader.h"
#include "kernels/gemm.h"
#include "model/config.h"
#include "model/params.h"

namespace foundry {

// train.optimizer: AdamW for every tensor, or Muon for the 2-D hidden matrices and AdamW for
// the rest. Here, in the lowest layer that needs it: the memory estimate counts Muon's slab.
enum class OptimizerKind { adamw, muon };
inline const char* optimizer_name(OptimizerKind k) {
  return k == OptimizerKind::muon ? "muon" : "adamw";
}
// The optimizer named "adamw" or "muon"; empty for any other name.
inline std::optional<OptimizerKind> parse_optimizer(std::string_view name) {
  if (name == "adamw") return OptimizerKind::adamw;
  if (name == "muon") return OptimizerKind::muon;
  return std::nullopt;
}

// The parameters of one CCA sublayer (arch zaya1; all zero for arch moe).
struct CcaParamCounts {
  int64_t q = 0;             // Hq·d·C
  int64_t k = 0;             // Hk·d·C
  int64_t v_half = 0;        // (Hk·d/2)·C, each of v_proj_current and v_proj_delayed
  int64_t convolutions = 0;  // depthwise and grouped weights and biases
  int64_t o = 0;             // C·Hq·d
  int64_t temperature = 0;   // Hk
  int64_t total = 0;         // q + k + 2·v_half + convolutions + o + temperature
};

struct ParamCounts {
  int64_t embedding = 0;            // Vp·C (also the LM head)
  int64_t attention_per_layer = 0;  // q, k, v, o projections (zaya1: the whole CCA sublayer)
  int64_t norms_per_layer = 0;      // the two pre-norms' weights (and model.qk_norm's two)
  int64_t router_per_layer = 0;     // E·C; 0 for a dense model; zaya1: the whole router
  int64_t router_first_layer = 0;   // the router of layer 0 (zaya1: no EDA weight there)
  int64_t per_expert = 0;           // 3·F·C (w1, w3, w2), or the dense FFN
  int64_t experts_per_layer = 0;    // E·per_expert
  int64_t residual_scales_per_layer = 0;  // zaya1: 2 sublayers × 4·C; 0 for moe
  int64_t input_scales = 0;         // zaya1: the embedding's residual scale and bias, 2·C
  int64_t per_layer = 0;            // everything in one layer (zaya1: a layer other than 0)
  int64_t final_norm = 0;           // C
  int64_t total = 0;                // equals ParamTable(config).parameter_count()
  int64_t non_embedding = 0;        // total − embedding
  int64_t active = 0;               // used by one token: the top-k experts of each layer
  int64_t active_non_embedding = 0;
  CcaParamCounts cca;               // zaya1 only
};

struct FlopsPerToken {              // one training step's FLOPs per token
  int64_t matmul_params = 0;        // active weights that take part in a GEMM, incl. LM head
  double matmul_flops = 0;          // 6·matmul_params
  double conv_flops = 0;            // zaya1: 6·L·(Cc·t0 + Cc·d·t1); 0 for moe
  double attention_flops = 0;       // 12·L·T·Dq (full T×T; for information)
  double attention_causal_flops = 0;  // 12·L·Dq·(T+1)/2 (the unmasked half; counted for MFU)
  double forward_flops = 0;         // a third of train_flops
  double train_flops = 0;           // matmul_flops + conv_flops + attention_causal_flops
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
  int64_t adamw_state_bytes = 0;    // exp_avg + exp_avg_sq of the tensors AdamW updates
  int64_t muon_momentum_bytes = 0;  // with Muon, 4 bytes an element of its matrices; else 0
  int64_t optimizer_bytes = 0;      // adamw_state_bytes + muon_momentum_bytes
  int64_t activations_bytes = 0;    // saved by forward for backward
  int64_t backward_buffers_bytes = 0;
  // What a training run keeps besides, set by the caller that knows the run's settings: the
  // asynchronous checkpoint's snapshot (weights and optimizer state) and the in-memory tier's
  // two checkpoints; 0 where the run has none.
  int64_t checkpoint_snapshot_bytes = 0;
  int64_t memory_checkpoints_bytes = 0;
  int64_t total_bytes = 0;
  std::vector<MemoryItem> activations;       // itemized activations_bytes
  std::vector<MemoryItem> backward_buffers;  // itemized backward_buffers_bytes
};

// A group of parameters that share a role, and the optimizer that updates them.
struct ParamGroup {
  std::string name;       // e.g. "attention projections (q, k, v, o)"
  int64_t tensors = 0;
  int64_t params = 0;
  std::string optimizer;  // "muon" | "adamw"
};

// Which optimizer updates a tensor ("muon" or "adamw"). The model layer cannot see the
// optimizers: callers pass optim's optimizer_for(info, muon_enabled).
using OptimizerOf = std::function<std::string(const ParamInfo&)>;

// Bytes one rank sends per training step for context parallelism over C ranks, with ring
// collectives (an all-gather or reduce-scatter whose result is C blocks sends C − 1 blocks).
// The block of a tensor is a rank's rows of it, B·(T/C)·Dkv fp32 values.
struct ContextParallelTraffic {
  int64_t kv_gather_bytes = 0;  // forward: all-gathers of k and v, every layer
  int64_t kv_grad_bytes = 0;    // backward: reduce-scatters of their gradients, every layer
  int64_t halo_bytes = 0;       // CCA: boundary rows and their gradients (a middle rank's)
  int64_t total() const { return kv_gather_bytes + kv_grad_bytes + halo_bytes; }
};
ContextParallelTraffic context_parallel_traffic(const ModelConfig& config, int64_t batch,
                                                int64_t seq, int64_t context);

struct ModelInfo {
  ModelConfig config;
  int64_t batch = 0, seq = 0;
  // The sequences whose activations `memory` counts: one micro-batch of a batch run in
  // micro-batches (train.micro_batch_size), else 0 (the batch).
  int64_t activation_batch = 0;
  int64_t context = 1;  // context-parallel ranks per sequence (memory is per rank)
  ContextParallelTraffic traffic;
  DType precision = DType::bf16;
  OptimizerKind optimizer = OptimizerKind::adamw;  // train.optimizer
  ParamCounts params;
  FlopsPerToken flops;
  double train_flops_per_step = 0;  // flops.train_flops · B · T
  MemoryEstimate memory;
  std::vector<ParamGroup> groups;   // every parameter in exactly one group
};

ParamCounts count_parameters(const ModelConfig& config);
FlopsPerToken flops_per_token(const ModelConfig& config, int64_t seq);
// The FLOPs of one training step per token (forward + backward); the MFU numerator.
double train_flops_per_token(const ModelConfig& config, int64_t seq);
// The part of train_flops_per_token that the top_k experts' products make up (6 · n_layers ·
// top_k · one expert's weights): what the choices that go to ZAYA1's skip class do not run
// (the trainer's MFU leaves out the measured skip fraction of it).
double expert_train_flops_per_token(const ModelConfig& config);
// `muon`: train.optimizer is Muon (adds Muon's momentum slab).
// `context`: context-parallel ranks per sequence (each holds seq / context of its rows, and
// gathers the whole sequences' keys and values).
MemoryEstimate estimate_memory(const ModelConfig& config, int64_t batch, int64_t seq,
                               DType precision, bool muon = false, int64_t context = 1);
// Adds a run's checkpoint copies to `m` (and to its total).
void add_checkpoint_copies(MemoryEstimate& m, int64_t snapshot_bytes,
                           int64_t memory_checkpoints_bytes);

// The bytes of a checkpoint of the whole model (format 2, all ranks together): the fp32
// weights, AdamW's two moments of the tensors AdamW updates and, with `muon`, Muon's momentum
// of the matrices it updates (a checkpoint stores no state a tensor's optimizer does not use).
int64_t checkpoint_bytes(const ModelConfig& config, bool muon);

// The decoding state of `batch` sequences of up to `max_len` tokens (Model::new_decode_state):
// per sequence the key and value caches 2·L·max_len·Dkv fp32, the scores Hq·max_len, for
// zaya1 the CCA convolution state L·(Cc·(t0 − 1 + t1 − 1) + Dkv/2), the logits [Vp] and the
// per-token buffers.
int64_t decode_state_bytes(const ModelConfig& config, int64_t max_len, int64_t batch = 1);

// The parameter groups of the config's ParamTable in table order of first appearance, with
// their optimizers from `optimizer_of` (unset: "adamw" for all). A group whose tensors get
// different optimizers is split into one row per optimizer.
std::vector<ParamGroup> param_groups(const ModelConfig& config, const OptimizerOf& optimizer_of);

// All of the above. `optimizer` is train.optimizer ("adamw" | "muon"); `optimizer_of`
// assigns each tensor its optimizer (see OptimizerOf). Fails on batch or seq < 1 and on an
// unknown optimizer.
ModelInfo model_info(const ModelConfig& config, int64_t batch, int64_t seq, DType precision,
                     const std::string& optimizer = "adamw",
                     const OptimizerOf& optimizer_of = {}, int64_t context = 1);

json to_json(const ModelInfo& info);
// A readable report: counts with thousands separators and in M/B, FLOPs, memory in MiB/GiB.
std::string format_model_info(const ModelInfo& info);

}  // namespace foundry
