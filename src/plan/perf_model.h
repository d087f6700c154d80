// The performance model: the time of one training step of a model config on one device of a
// hardware profile, built up from the operations the step runs.
//
//   GEMMs        every weight matrix a token multiplies, forward (N × out × in) and backward
//                (dX: N × in × out, dW: out × in × N), each at the profile's rate for its
//                shape (GEMM table or saturation model, times the alignment factor). Experts:
//                E GEMMs of N·k/E rows each (balanced routing). The ZAYA1 router runs in fp32.
//                The CCA grouped convolution counts as a GEMM of N × d × d·t1 per group.
//   attention    the score and value products as batched GEMMs (T × T × d per head), over the
//                causal share the tiled kernel computes (the backward recomputes the scores:
//                five products against the forward's two), plus the softmax passes over the
//                scores (none on a GPU: a fused flash kernel keeps them on chip). With context
//                parallelism a device computes 1/cp of it (the chunks balance the causal work).
//   elementwise  norms, residual adds and scales, RoPE, SwiGLU, routing, dispatch/combine,
//                cross-entropy and bf16 conversions, as bytes moved over memory bandwidth
//                (per-operation byte counts in perf_model.cpp).
//   optimizer    AdamW and Muon's element passes as bytes over memory bandwidth, and Muon's
//                Newton–Schulz products as GEMMs; ZeRO-1 divides both by the data-parallel
//                ranks.
//   comm         ZeRO-1: gradients reduce-scattered (fp32) and weights all-gathered (bf16
//                under bf16 precision); without ZeRO-1 one all-reduce. Times from the
//                profile's fitted t = α + S/β. `comm_overlap` of it hides behind the
//                backward pass (2/3 of the compute). Context parallelism: per layer an
//                all-gather of k and v forward and a reduce-scatter of their gradients
//                backward among the cp ranks, in the critical path (never hidden).
// What is not modelled: load imbalance between experts, kernel launch and framework
// overheads, stragglers, pipeline or tensor parallelism.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/profile.h"
#include "model/config.h"

namespace foundry {

struct StepShape {
  int64_t seq = 256;           // T
  int64_t micro_batch = 8;     // sequences in one forward/backward pass on a device
  int64_t accumulation = 1;    // micro-batches per optimizer step
  int64_t dp = 1;              // ranks (the ZeRO-1 shards and the gradient reduction)
  int64_t cp = 1;              // context-parallel ranks per sequence: a device holds seq / cp
                               // tokens of each of micro_batch sequences (docs/long-context.md)
  DType precision = DType::bf16;
  bool muon = false;
  int64_t muon_ns_steps = 5;
  bool muon_bf16 = true;       // Newton–Schulz GEMM inputs in bf16
  bool zero1 = true;
  double comm_overlap = 1.0;   // share of the backward pass communication can hide behind
};

// What an item of the step's time is spent on.
enum class CostCategory { gemm, attention, elementwise, optimizer, comm };
// "gemm", "attention", "elementwise", "optimizer" or "comm", as the JSON output names them.
const char* category_name(CostCategory category);

struct PredictionItem {
  std::string name;
  CostCategory category = CostCategory::gemm;
  double seconds = 0;    // per optimizer step
  double flops = 0;      // per optimizer step (0 for memory-bound items)
  double bytes = 0;      // memory traffic or communicated bytes per step
};

struct StepPrediction {
  double gemm_s = 0, attention_s = 0, elementwise_s = 0, optimizer_s = 0;
  double compute_s = 0;        // all of the above
  double comm_s = 0;           // total collective time
  double comm_exposed_s = 0;   // what does not overlap
  double step_s = 0;           // compute_s + comm_exposed_s
  double tokens_per_step = 0;  // per device
  double tokens_per_s = 0;     // per device
  double model_flops_per_step = 0;  // train_flops_per_token · tokens (the MFU numerator)
  double mfu_measured = 0;     // against the profile's best GEMM rate
  double mfu_spec = 0;         // against the spec peak (0 if unknown)
  int64_t memory_bytes = 0;    // per device: weights, grads, sharded optimizer, activations
  std::vector<PredictionItem> items;
};

StepPrediction predict_step(const ModelConfig& config, const StepShape& shape,
                            const HardwareProfile& profile);

// Bytes per device: fp32 weights (+ bf16 copies), fp32 gradients, optimizer state divided by
// dp under ZeRO-1, and one micro-batch's activations (without T × T terms on a GPU, whose
// attention is a fused flash kernel).
int64_t predict_memory(const ModelConfig& config, const StepShape& shape,
                       const HardwareProfile& profile);

// Decoding: one step of `batch` sequences at `context` cached tokens, as Foundry's batched
// decode runs it (Model::decode_step): every weight matrix multiplies the batch's rows once,
// each GEMM at the profile's rate for its shape (gemm_rate, whose roofline makes a small
// batch's GEMMs stream their weights at memory bandwidth, and a large one's compute-bound),
// plus a fixed cost per call (one per GEMM; one per grouped expert launch on a GPU) and, on a
// CPU, oneDNN's small-m behaviour (a time per weight row at m = 1, a whole row block for
// fewer rows than the block; measured, perf_model.cpp); the experts the batch touches,
// E·(1 − (1 − k/E)^batch) per layer, each once on its B·k/touched rows (balanced routing);
// and the KV caches of the batch (fp32 as Foundry stores them; bf16 on a GPU profile) read
// once over memory bandwidth. Only the active
// experts run for batch 1; all of them as the batch grows. Not modelled: routing imbalance,
// ZAYA1's skip class (counted as experts), the elementwise work (inside the per-call cost).
struct DecodePrediction {
  double gemm_s = 0;       // attention projections, routers, LM head
  double expert_s = 0;     // the experts' GEMMs
  double attention_s = 0;  // reading the KV caches
  double step_s = 0;       // all of it: seconds per step (per generated token of each sequence)
  double experts_touched = 0;  // per layer
  double kv_cache_bytes = 0;   // read per step
};
DecodePrediction predict_decode(const ModelConfig& config, int64_t batch, int64_t context,
                                const HardwareProfile& profile,
                                DType precision = DType::bf16);
double predict_decode_latency(const ModelConfig& config, int64_t batch, int64_t context,
                              const HardwareProfile& profile, DType precision = DType::bf16);

// The paper's storage analysis: reads of G sequences of s tokens of b bytes per step of t
// seconds, in pages of P bytes, with scatter factor σ: IOPS = σ·G·s·b/(P·t). The break-even
// step time is where that meets the IOPS budget: t = σ·G·s·b/(P·budget).
double data_loading_iops(int64_t global_batch, int64_t seq, int64_t bytes_per_token,
                         int64_t page_bytes, double step_s, double scatter);
double data_loading_break_even_s(int64_t global_batch, int64_t seq, int64_t bytes_per_token,
                                 int64_t page_bytes, double iops_budget, double scatter);

}  // namespace foundry
