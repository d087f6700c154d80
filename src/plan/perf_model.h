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
//                scores (none on a GPU: a fused flash kernel keeps them on chip). On profiles
//                with an `efficiency.attention` curve, forward and backward run at the
//                published fused-kernel efficiency at that sequence length. With context
//                parallelism a device computes 1/cp of it (the chunks balance the causal work).
//   elementwise  norms, residual adds and scales, RoPE, SwiGLU, routing, dispatch/combine,
//                cross-entropy and bf16 conversions, as bytes moved over memory bandwidth
//                (per-operation byte counts in perf_model.cpp).
//   recompute    activation recomputation: `full` runs every forward again in the backward,
//                `selective` the elementwise forward passes (norms, activations).
//   imbalance    with expert parallelism the busiest rank's experts set the pace: the expert
//                GEMMs and the all-to-all times the expected max/mean load (binomial routing
//                over ep ranks unless given).
//   optimizer    AdamW and Muon's element passes as bytes over memory bandwidth, and Muon's
//                Newton–Schulz products as GEMMs; ZeRO-1 divides both by the data-parallel
//                ranks.
//   comm         ZeRO-1: gradients reduce-scattered (fp32) and weights all-gathered (bf16
//                under bf16 precision); without ZeRO-1 one all-reduce. Times from the
//                profile's fitted t = α + S/β, chosen by topology: within a node the
//                intra-node fit, across nodes the inter-node fit, its bandwidth shared by the
//                groups that leave a node through the same NICs (a data-parallel group
//                strided by tp). The gradient reduction hides behind the last micro-batch's
//                backward (`comm_overlap` of it); the weight all-gather follows the optimizer
//                step and is exposed unless `overlap_param_gather` lets it hide behind the
//                next forward. Blocking, in the critical path: context parallelism's k, v
//                all-gathers and reduce-scatters, tensor parallelism's activation all-gathers
//                and reduce-scatters (sequence parallel), expert parallelism's dispatch and
//                combine all-to-alls (hidden behind another micro-batch's compute with
//                `overlap_expert_comm`; across nodes only the bytes for other nodes' peers
//                cross the NIC, one copy per node hit with `dedup_expert_dispatch`).
//                Contention: a hidden gradient reduction and the backward's all-to-alls that
//                share inter-node links queue behind each other.
//                Pipeline sends: the stage-to-stage activations and gradients, exposed only
//                in the fill and drain (pp · vp − 1 chunk boundaries each way), hidden in the
//                steady state.
//   pipeline     the 1F1B bubble, (pp − 1)/vp micro-batch times of a stage.
//   overhead     framework: kernels launched × the profile's per-kernel overhead; data
//                loading: the step's pages over the storage IOPS budget, prefetched during the
//                step, exposed only beyond it.
// Tensor and pipeline parallelism divide a micro-step's work by tp · pp, its GEMMs at the
// rates of the split shapes.
// What is not modelled: stragglers, pipeline stages of unequal cost (embedding and LM head),
// FSDP's per-layer all-gathers, TP communication overlapped with compute, FP8.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/profile.h"
#include "model/config.h"

namespace foundry {

// Activations recomputed in the backward: none, the elementwise forward passes, or all of
// the forward.
enum class Recompute { none, selective, full };
const char* recompute_name(Recompute recompute);

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
  // Model parallelism (Megatron layout: tp innermost, then the data-parallel ranks, pp
  // outermost; experts spread over ep ranks). Devices = dp · tp · pp; `dp` counts the
  // context-parallel ranks too, as ZeRO-1 shards over them.
  int64_t tp = 1;              // tensor parallel, with sequence parallelism
  int64_t pp = 1;              // pipeline stages
  int64_t vp = 1;              // virtual stages per device (interleaved 1F1B)
  int64_t ep = 1;              // expert parallel
  double expert_imbalance = 0; // busiest ep rank's tokens / mean (>= 1); 0 = binomial routing
  Recompute recompute = Recompute::none;
  bool overlap_param_gather = false;  // the weight all-gather hides behind the next forward
  // The expert-parallel all-to-alls hide behind another micro-batch's compute (DeepSeek's
  // DualPipe, Megatron's 1F1B all-to-all overlap), up to comm_overlap of it.
  bool overlap_expert_comm = false;
  // Node-deduplicating dispatch (DeepEP, DeepSeek-V3's kernels): a token crosses to each
  // other node holding one of its experts once and is forwarded inside that node.
  bool dedup_expert_dispatch = false;
  // The training stack's kernels: `eager` = unfused elementwise kernels (eager PyTorch without
  // a compiler: every op of a norm or RoPE reads and writes HBM); `attention_kernel` names a
  // fused attention curve in the profile's efficiency.attention_kernels ("" = the profile's
  // efficiency.attention, its best kernel).
  bool eager = false;
  std::string attention_kernel;
  double data_scatter = 1.0;   // σ of the storage analysis (page touches per page read)
  int64_t data_bytes_per_token = 4;
};

// What an item of the step's time is spent on.
enum class CostCategory {
  gemm, attention, elementwise, recompute, optimizer, comm, pipeline, overhead
};
// "gemm", "attention", "elementwise", "recompute", "optimizer", "comm", "pipeline" or
// "overhead", as the JSON output names them.
const char* category_name(CostCategory category);

struct PredictionItem {
  std::string name;
  CostCategory category = CostCategory::gemm;
  double seconds = 0;    // per optimizer step
  double flops = 0;      // per optimizer step (0 for memory-bound items)
  double bytes = 0;      // memory traffic or communicated bytes per step
};

struct StepPrediction {
  double gemm_s = 0, attention_s = 0, elementwise_s = 0, recompute_s = 0, optimizer_s = 0;
  double compute_s = 0;        // all of the above
  double comm_s = 0;           // total collective time
  double comm_exposed_s = 0;   // what does not overlap
  double imbalance_s = 0;      // of gemm_s: the busiest expert-parallel rank's extra rows
  double bubble_s = 0;         // pipeline fill and drain
  double overhead_s = 0;       // framework (kernel launches)
  double data_s = 0;           // reading the step's tokens at the storage IOPS budget
  double data_exposed_s = 0;   // what the prefetch during the step does not hide
  double step_s = 0;           // compute, exposed comm, bubble, overhead, exposed data
  double tokens_per_step = 0;  // per device
  double tokens_per_s = 0;     // per device
  double model_flops_per_step = 0;  // train_flops_per_token · tokens (the MFU numerator)
  double mfu_measured = 0;     // against the profile's best GEMM rate
  double mfu_spec = 0;         // against the spec peak (0 if unknown)
  int64_t memory_bytes = 0;    // per device: weights, grads, sharded optimizer, activations
  std::vector<PredictionItem> items;
};

// One layer's attention core at the profile's GEMM rates and efficiency 1, as predict_step
// prices it: the forward's two products (S = Q·Kᵀ, O = P·V) and the backward's five (S again,
// dP, dV, dQ, dK), over the causal share of the tiles. A measured kernel's efficiency, the
// profile's efficiency.attention curve, is these over its measured times (bench attention).
struct AttentionCoreSeconds {
  double forward = 0, backward = 0;
  double forward_flops = 0, backward_flops = 0;  // the products' FLOPs as counted
};
AttentionCoreSeconds attention_core_seconds(const HardwareProfile& profile, int64_t batch,
                                            int64_t seq, int64_t heads, int64_t kv_heads,
                                            int64_t head_dim, DType dtype);

StepPrediction predict_step(const ModelConfig& config, const StepShape& shape,
                            const HardwareProfile& profile);

// Bytes per device: fp32 weights (+ bf16 copies), fp32 gradients, optimizer state divided by
// dp under ZeRO-1, and one micro-batch's activations (without T × T terms on a GPU, whose
// attention is a fused flash kernel).
int64_t predict_memory(const ModelConfig& config, const StepShape& shape,
                       const HardwareProfile& profile);

// The busiest expert-parallel rank's load over the mean in this step: the shape's
// `expert_imbalance` if given, else binomial_imbalance of the rows one rank receives.
double expert_imbalance(const ModelConfig& config, const StepShape& shape);

// Expected busiest/mean load over `ranks` expert-parallel ranks when each of `routed` rows
// (token × k choices landing on one rank on average) picks a rank uniformly: the max of
// `ranks` binomial loads, ≈ 1 + sqrt(2·ln(ranks)·(1 − 1/ranks)/routed). 1 for one rank.
double binomial_imbalance(double routed, int64_t ranks);

// With node-deduplicating dispatch: the copies of a token that cross the NIC over those
// without, ≤ 1. Experts spread evenly over the nodes the ep ranks span; a token's k distinct
// experts hit each other node with probability 1 − C(E − E/nodes, k)/C(E, k), against
// k·(ep − local)/ep copies sent one per expert. 1 when the ranks fit in one node.
double dispatch_dedup_factor(int64_t experts, int64_t top_k, int64_t ep, int64_t per_node);

// Seconds of one collective among `ranks` devices placed `stride` apart (devices numbered
// node by node, profile.devices_per_node to a node): the intra-node fit when the group fits
// in a node (or the profile is one measured machine), else the inter-node fit with its bus
// bandwidth shared by the min(stride, devices_per_node) groups that leave each node through
// the same NICs, and its latency growing with the ring (ranks − 1).
double group_collective_s(const HardwareProfile& profile, const std::string& op, int64_t ranks,
                          double bytes, int64_t stride);

// Decoding: one step of `batch` sequences at `context` cached tokens, as Foundry's batched
// decode runs it (Model::decode_step): every weight matrix multiplies the batch's rows once.
// On a CPU profile with decode points (bench gemm's decode sweep: few rows, weights read from
// memory) each GEMM takes its FLOPs at the rate those points give for its shape
// (HardwareProfile::decode_gemm_rate; the points time whole calls). Without them, at
// gemm_rate (whose roofline makes a small batch's GEMMs stream their weights at memory
// bandwidth) with oneDNN's small-m behaviour (a time per weight row at m = 1, a whole row
// block for fewer rows than the block; measured, perf_model.cpp), plus a fixed cost per call
// (one per GEMM; one per grouped expert launch on a GPU, at the profile's
// kernel_overhead_s). The experts the batch touches,
// E·(1 − (1 − k/E)^batch) per layer, each run once on its B·k/touched rows (balanced
// routing). The KV caches of the batch (fp32, as Foundry stores them on either device)
// are read once over memory bandwidth; on a CPU the attention kernel's arithmetic bounds it
// when slower (its measured rate per core, perf_model.cpp). Only the active experts run for
// batch 1; all of them as the batch grows. ZAYA1's CCA grouped convolution of the new row is
// one fp32 batched matmul (priced as a [B, d·t1] × [d·t1, Dq + Dkv] GEMM). Not modelled:
// routing imbalance, ZAYA1's skip class (counted as experts), the depthwise convolution and
// the other elementwise work (inside the per-call cost).
struct DecodePrediction {
  double gemm_s = 0;       // attention projections, routers, LM head
  double expert_s = 0;     // the experts' GEMMs
  double attention_s = 0;  // attending over the KV caches: their bytes, or on a CPU the
                           // kernel's arithmetic when that takes longer
  double step_s = 0;       // all of it: seconds per step (per generated token of each sequence)
  double experts_touched = 0;  // per layer
  double kv_cache_bytes = 0;   // read per step
  double attention_flops = 0;  // per step: scores and weighted values, 4·B·H·context·D·L
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
