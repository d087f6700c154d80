// The single-process training loop: data → forward/backward → clip → AdamW → log, with
// periodic validation and checkpoints, resume, and a clean stop on SIGINT/SIGTERM.
#pragma once
#include <cstdint>
#include <string>

#include "train/run_config.h"

namespace foundry {

struct TrainOptions {
  bool synthetic_data = false;  // random tokens, no dataset (for benchmarking)
  bool resume = false;          // continue from the latest valid checkpoint in run_dir
  int64_t steps = -1;           // overrides train.steps when ≥ 0
  int64_t stop_at_step = -1;    // checkpoint and stop after this step (schedule unchanged)
  bool op_breakdown = false;    // time every operation and print a per-op table at the end
  bool quiet = false;           // no per-step log lines (metrics.jsonl is still written)
};

struct TrainSummary {
  int64_t start_step = 0, final_step = 0;
  double initial_val_loss = -1, final_val_loss = -1;  // -1 when not evaluated
  double last_train_loss = 0;
  double tokens_per_s = 0;   // over the steps run in this process (first step excluded)
  double mfu = 0;            // model FLOP utilization against the GEMM peak
  double peak_gflops = 0;
  bool interrupted = false;
};

TrainSummary train(const RunConfig& config, const TrainOptions& options);

// Measures the best GEMM rate of this machine (GFLOP/s) for bf16 or fp32 inputs, in well
// under a second: the denominator of MFU when the config gives no peak.
double measure_gemm_peak_gflops(bool use_bf16);

}  // namespace foundry
