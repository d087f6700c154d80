// foundry plan's search: model shapes that meet a parameter budget on a given cluster,
// ranked by predicted training throughput with predicted decode latency beside it.
//
// For each hidden size C, head dim d, KV-head ratio, expert count E and top-k, the expert
// width F and the depth L follow from the budget:
//   per layer: non-expert parameters A(C, d, ...), expert parameters 3·F·C each
//   total  = L·(A + E·3FC),  active = L·(A + k·3FC)   (without embeddings)
// With both budgets, total/active fixes F and then L; with one, L runs over the depths the
// aspect-ratio range allows. F is rounded to the profile's preferred multiple and L to an
// integer; a shape is kept if its counts land within the tolerance of the budget.
//
// Shape rules (each rejected shape is reported with what it would cost):
//   - hidden sizes and head dims off the GEMM-friendly multiples (C = 2000, d = 80) are
//     probed and rejected, with their throughput loss against the aligned twin;
//   - d_model / n_layers outside the aspect-ratio range (the loss of a transformer depends
//     only weakly on shape within roughly 20–200: Kaplan et al. 2020, §3.1);
//   - shapes whose memory per device exceeds the budget at every micro-batch size;
//   - budgets not met after rounding.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/profile.h"
#include "model/config.h"
#include "plan/perf_model.h"

namespace foundry {

struct PlanRequest {
  std::string arch = "zaya1";     // "zaya1" | "moe"
  double total_params = 0;        // without embeddings; 0 = free
  double active_params = 0;       // without embeddings; 0 = free
  double tolerance = 0.05;        // relative, for each given budget
  double tokens = 0;              // training tokens (for the total time; 0 = not reported)
  int64_t seq = 4096;
  int64_t global_batch = 0;       // sequences per optimizer step (all devices)
  int64_t devices = 1;
  int64_t memory_per_device = 0;  // bytes; 0 = the profile's device memory
  int64_t vocab = 32000;
  DType precision = DType::bf16;
  bool muon = true;
  double comm_overlap = 1.0;
  double aspect_min = 20, aspect_max = 200;  // d_model / n_layers
  int64_t decode_batch = 32;      // sequences decoded together for the latency column
  int64_t decode_context = 0;     // 0 = seq
  double scatter = 1.0;           // σ of the storage analysis
  bool eager = false;             // the training stack's kernels (StepShape::eager,
  std::string attention_kernel;   // StepShape::attention_kernel)
  int64_t bytes_per_token = 4;    // token width in the data shards
  std::vector<int64_t> hidden;    // empty: multiples of 256 (and off-size probes)
  std::vector<int64_t> head_dims = {64, 80, 96, 128};
  std::vector<int64_t> kv_ratios = {1, 2, 4, 8};  // n_heads / n_kv_heads
  std::vector<int64_t> experts = {8, 16, 32, 64, 128};
  std::vector<int64_t> top_ks = {1, 2, 4, 8};
  int64_t cca_compression = 2;    // zaya1: C / (n_heads · head_dim)
  int64_t router_latent = 256;    // zaya1
  int64_t ffn_multiple = 0;       // 0 = 128 on a GPU, 64 on a CPU
  ModelConfig base;               // everything the search does not choose
  // Shapes to evaluate beside the search under the same run (e.g. ZAYA1-base's own), each
  // with a label; they are reported against the best shape whether or not they meet the
  // budget.
  std::vector<std::pair<std::string, ModelConfig>> compare;
  bool evaluate_all = false;      // predict even shapes that miss the budget (for compare)
};

struct Candidate {
  ModelConfig config;
  StepShape shape;
  StepPrediction prediction;
  double total_params = 0, active_params = 0;  // without embeddings
  double decode_latency_s = 0;
  double cluster_tokens_per_s = 0;
  std::string reject;   // "" = accepted; else the rule it broke
  std::string detail;   // why, in numbers
  bool off_size = false;  // a probe of an unaligned hidden size or head dim
};

struct RejectedExample {
  std::string rule;
  int64_t count = 0;
  Candidate example;      // the best-throughput shape this rule rejected
  double loss = 0;        // relative throughput loss against its aligned twin or the winner
  std::string explanation;
};

struct ParetoPoint {
  int64_t experts = 0, top_k = 0;
  Candidate best;         // the best-throughput shape with this MoE width
  bool on_front = false;
};

struct PlanResult {
  PlanRequest request;
  std::vector<Candidate> ranked;              // accepted, by cluster throughput, best first
  std::vector<RejectedExample> rejected;      // one row per rule
  std::vector<ParetoPoint> widths;            // MoE widths, by expert count
  int64_t evaluated = 0;
  double iops = 0, break_even_s = 0;          // data loading at the best shape's step time
  double iops_budget = 0;
  std::string vocab_note;                     // what padding the vocabulary buys
  std::vector<std::pair<std::string, Candidate>> compared;  // request.compare, predicted
};

// Validates the request (clear errors naming the flag) and searches.
PlanResult plan_search(const PlanRequest& request, const HardwareProfile& profile);

// The largest micro-batch (a divisor of `per_device`) whose memory fits `limit` bytes, or 0.
int64_t fit_micro_batch(const ModelConfig& config, StepShape shape, int64_t per_device,
                        int64_t limit, const HardwareProfile& profile);

std::string format_plan(const PlanResult& result, const HardwareProfile& profile, int top);
json plan_to_json(const PlanResult& result, int top);
// A run config for `foundry train` with the chosen shape.
json plan_run_config(const Candidate& chosen, const PlanRequest& request);

}  // namespace foundry
