// The single-process training loop: data → forward/backward → clip → optimizer step(s) →
// router balancers → log, with periodic validation and checkpoints, resume, and a clean stop
// on SIGINT/SIGTERM.
//
// Optimizers (train.optimizer): "adamw" updates every tensor with AdamW; "muon" updates the
// 2-D hidden matrices (muon_applies in optim/muon.h) with Muon and every other tensor with
// AdamW, both with the same learning rate and schedule, after gradient clipping.
//
// Router balancers (arch zaya1): the class counts of each training forward drive one
// balancing-bias update per MoE sublayer after the optimizer step (Model::update_balancers).
// Their state is saved in trainer_state.json ("router_balancers") and restored on resume;
// the biases are also exported to model.safetensors for Hugging Face loaders.
#pragma once
#include <cstdint>
#include <string>

#include "base/config_reader.h"
#include "train/run_config.h"

namespace foundry {

class Model;
class Communicator;

struct TrainOptions {
  bool synthetic_data = false;  // random tokens, no dataset (for benchmarking)
  bool resume = false;          // continue from the latest valid checkpoint in run_dir
  int64_t steps = -1;           // overrides train.steps when ≥ 0
  int64_t stop_at_step = -1;    // checkpoint and stop after this step (schedule unchanged)
  bool op_breakdown = false;    // time every operation and print a per-op table at the end
  bool quiet = false;           // no per-step log lines (metrics.jsonl is still written)
  // All ranks of an mpirun job (null: one process). Each rank trains on its share of every
  // global batch (train.batch_size sequences, split evenly), gradients are averaged and the
  // optimizer is sharded over all ranks (ZeRO-1); with train.expert_parallel = P the experts
  // are also sharded over groups of P consecutive ranks. Rank 0 writes metrics and checkpoints.
  const Communicator* world = nullptr;
};

struct TrainSummary {
  int64_t start_step = 0, final_step = 0;
  double initial_val_loss = -1, final_val_loss = -1;  // -1 when not evaluated
  double last_train_loss = 0;
  double tokens_per_s = 0;   // over the steps run in this process (first step excluded)
  double mfu = 0;            // model FLOP utilization against the GEMM peak
  double peak_gflops = 0;
  bool interrupted = false;
  int64_t optimizer_state_bytes = 0;  // this rank's optimizer state and buffers
  int64_t peak_rss_bytes = 0;         // the largest peak RSS over the ranks (before the final checkpoint)
  double grad_comm_exposed_s = 0;     // data parallel: gradient reduction after backward, per step
};

TrainSummary train(const RunConfig& config, const TrainOptions& options);

// Restores the router balancers of an arch zaya1 model from a checkpoint's trainer state
// (its "router_balancers"), so routing matches the trained model; a no-op for models without
// balancers (arch moe). `checkpoint_dir` names the checkpoint in messages. When the state has
// no balancers: an error if `required` (resuming training must restore everything), else a
// warning on stderr and the model keeps its initial biases (eval, generate).
void restore_router_balancers(Model& model, const json& trainer_state,
                              const std::string& checkpoint_dir, bool required);

// Measures the best GEMM rate of this machine (GFLOP/s) for bf16 or fp32 inputs, in well
// under a second: the denominator of MFU when the config gives no peak.
double measure_gemm_peak_gflops(bool use_bf16);

}  // namespace foundry
