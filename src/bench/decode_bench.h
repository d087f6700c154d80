// Decode latency and throughput: B sequences advance one token per step (Model::decode_step)
// for several MoE widths and batch sizes, on a model with random weights (a step's time does
// not depend on the values of the weights, nor on the tokens).
//
// For each width (n_experts, ffn_dim, top_k replace the config's) one model is built; for each
// batch size one decode state of `context` + warm-up + timed positions. The state starts at
// position `context` with its KV caches already that long (holding zeros: attention reads
// and weighs every cached position whatever it holds), so every timed step attends over
// context + its offset positions without a prefill. `warmup` untimed steps (oneDNN creates
// its primitives, pages are touched) for at least warmup_s seconds, then `steps` timed ones;
// the median is reported.
//
// The library does not print: results come back as structs, and the formatter returns text.
// The planner's prediction (plan/perf_model.h) is filled in by the caller, as bench does not
// depend on plan.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/provenance.h"
#include "kernels/gemm.h"
#include "model/config.h"

namespace foundry {

class Backend;

// One MoE width: the experts of every MoE sublayer.
struct MoeWidth {
  int64_t experts = 0, ffn_dim = 0, top_k = 0;
  std::string label() const;  // "16x512 top-4"
};

// "EXPERTSxFFNxTOPK,..." (e.g. "8x1024x2,16x512x4") → widths; fails naming `flag` and the item.
std::vector<MoeWidth> parse_widths(const std::string& flag, const std::string& text);
// The config's width and `count` − 1 finer ones at the same total and active parameters:
// experts ×2^i, ffn_dim /2^i, top_k ×2^i, while ffn_dim stays a multiple of 64 (or its own
// divisor) and top_k ≤ experts.
std::vector<MoeWidth> finer_widths(const ModelConfig& config, int64_t count);
// The config with a width's experts.
ModelConfig with_width(const ModelConfig& config, const MoeWidth& width);

struct DecodeBenchOptions {
  ModelConfig model;               // the architecture; widths replace its experts
  std::vector<MoeWidth> widths;    // empty: the config's own
  std::vector<int64_t> batches = {1, 4, 16, 64};
  int64_t context = 256;           // cached positions before the first timed step
  int64_t warmup = 3, steps = 10;
  // Warm-up steps go on until this much time has passed, too: a process's first seconds of
  // decoding run slower (threads, page mappings) than what follows.
  double warmup_s = 1.0;
  DType precision = DType::bf16;   // the GEMM weights (as train.precision)
  Backend* backend = nullptr;      // where the models decode (null: the CPU)
  uint64_t seed = 1;
  // Called after each (width, batch) with points done, total, and what finished.
  std::function<void(int64_t, int64_t, const std::string&)> on_progress;
};

struct DecodePoint {
  MoeWidth width;
  int64_t batch = 0;
  int64_t total_params = 0, active_params = 0;  // without embeddings
  double median_s = 0, min_s = 0, max_s = 0;    // seconds per decode step
  // CPU seconds per step, all threads: on a shared machine, with one thread, what a step
  // costs without the time other processes take (spinning OpenMP threads count too).
  double median_cpu_s = 0;
  double tokens_per_s = 0;                       // batch / median_s
  double predicted_s = 0;                        // the planner's, 0 = not predicted
};

struct DecodeBenchResult {
  std::string arch;
  std::string device = "cpu";  // the backend's name
  int64_t context = 0, warmup = 0, steps = 0;
  DType precision = DType::bf16;
  double load_average[3] = {0, 0, 0};  // before the run
  std::vector<DecodePoint> points;
};

// Fails (Error naming the flag and the value) on options that cannot run: an empty batch
// list, a batch, context or step count < 1, a width with top_k > experts, or context + warm-up
// + steps beyond what the KV caches allow (model.max_seq_len is raised to fit).
void validate(const DecodeBenchOptions& options);
// Bytes the largest point needs: fp32 and bf16 weights, and the decode state of the largest
// batch.
int64_t decode_bench_bytes(const DecodeBenchOptions& options);
DecodeBenchResult run_decode_bench(const DecodeBenchOptions& options);

// A Markdown table, one row per point: width, batch, parameters, measured ms per step
// (wall and CPU), tokens/s, and (when predicted) predicted ms and the error (measured − predicted)
// / predicted. `title`: a line above it.
std::string format_decode_table(const DecodeBenchResult& result);
nlohmann::json decode_bench_json(const DecodeBenchResult& result, const Provenance& provenance);

// ---- KV cache per token ----------------------------------------------------------------------
// Values cached per token per attention layer by this config's attention (K and V of Hk heads
// of d: 2·Hk·d, the same for CCA and GQA), against standard attention with the same d_model:
// multi-head attention with Hq heads of d, with d_model / d heads (full width, as the ZAYA1
// paper compares), and grouped-query attention with Hk KV heads. CCA adds a fixed state per
// sequence and layer (the convolution windows and the delayed value half), not per token.
struct KvCacheSizes {
  int64_t per_token = 0;          // this config: 2·Hk·d
  int64_t mha_same_heads = 0;     // 2·Hq·d
  int64_t mha_full_width = 0;     // 2·d_model
  int64_t gqa_same_kv_heads = 0;  // 2·Hk·d
  int64_t cca_state_per_sequence = 0;  // zaya1: Cc·(t0 − 1 + t1 − 1) + Hk·d/2; 0 otherwise
};
KvCacheSizes kv_cache_sizes(const ModelConfig& config);
std::string format_kv_cache_sizes(const ModelConfig& config);

}  // namespace foundry
