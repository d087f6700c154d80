// The training loop: data → forward/backward → clip → optimizer step(s) → router balancers →
// metrics, with periodic validation and checkpoints, resume, and a clean stop on
// SIGINT/SIGTERM, in one process or over the ranks of an mpirun job. Its parts are units of
// their own: batches.h (the data), evaluate.h (validation), metrics.h (metrics.jsonl),
// checkpointer.h (save and resume), anomaly.h (NaN/Inf and loss spikes: skip, rollback or
// stop), report.h (the end-of-run report), signals.h.
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
#include <functional>
#include <optional>
#include <string>

#include "base/config_reader.h"
#include "model/model.h"
#include "optim/optimizer.h"
#include "train/anomaly.h"
#include "train/balance.h"
#include "train/batches.h"
#include "train/mfu.h"
#include "train/run_dir.h"
#include "train/run_config.h"

namespace foundry {

class Communicator;

struct TrainOptions {
  bool synthetic_data = false;  // random tokens, no dataset (for benchmarking)
  // A new run, or continue the run in train.run_dir (run_dir.h: what each mode accepts).
  StartMode start = StartMode::fresh;
  int64_t steps = -1;           // overrides train.steps when ≥ 0
  int64_t stop_at_step = -1;    // checkpoint and stop after this step (schedule unchanged)
  bool op_breakdown = false;    // time every operation and print a per-op table at the end
  bool quiet = false;           // no per-step log lines (metrics.jsonl is still written)
  // A resume may change train.* settings that shape the trajectory (lr, batch, seed, ...);
  // without this it is refused (trainer.cpp, check_same_trajectory).
  bool allow_config_change = false;
  // All ranks of an mpirun job (null: one process). Each rank trains on its share of every
  // global batch (train.batch_size sequences, split evenly), gradients are averaged and the
  // optimizer is sharded over all ranks (ZeRO-1); with train.expert_parallel = P the experts
  // are also sharded over groups of P consecutive ranks. Rank 0 writes metrics and checkpoints.
  const Communicator* world = nullptr;
  // train.hardware_profile's peak, read by the command line (null when the config names none).
  std::optional<DevicePeak> profile_peak;
};

struct TrainSummary {
  int64_t start_step = 0, final_step = 0;
  double initial_val_loss = -1, final_val_loss = -1;  // -1 when not evaluated
  int64_t final_val_step = 0;                          // the step final_val_loss is of
  double last_train_loss = 0;
  double tokens_per_s = 0;   // over the steps run in this process (first step excluded)
  double mfu = 0;            // model FLOP utilization against the peak below (train/mfu.h)
  double peak_gflops = 0;
  std::string peak_source;   // where the peak came from
  bool interrupted = false;  // stopped by SIGINT/SIGTERM with a checkpoint saved
  bool already_complete = false;  // resumed at train.steps: nothing trained, nothing written
  bool stopped_at_start = false;  // SIGINT/SIGTERM before the first step: nothing trained
  int64_t optimizer_state_bytes = 0;  // this rank's optimizer state and buffers
  int64_t peak_rss_bytes = 0;  // the largest peak RSS over the ranks (before the final checkpoint)
  double grad_comm_exposed_s = 0;     // data parallel: gradient reduction after backward, per step
};

TrainSummary train(const RunConfig& config, const TrainOptions& options);

// What one training step did.
struct StepResult {
  ForwardResult losses;       // means over the global batch
  double lr = 0, grad_norm = 0;
  double seconds = 0;         // wall time of the step
  BalanceStats balance;       // arch zaya1 (default for arch moe)
  bool applied = true;        // false: judged anomalous, nothing was updated
};

// One training step on the batch `batches` holds: forward, backward (with the data-parallel
// gradient reduction started during it when `overlap`), the clipped optimizer step, the bf16
// weight refresh and, for arch zaya1, the router balancers (from the class counts summed
// over the ranks of `world`). Collective over `world` (null: one process). `before_update`,
// when set, runs between the backward pass and the optimizer step (a checkpoint's snapshot
// must be done). With `anomalies`, the batch's injected faults are applied and a step it
// judges anomalous changes nothing and returns with `applied` false; without, a loss or
// gradient norm that is not finite fails naming the step. `micro_rows` (dividing the rank's
// rows; 0: all at once): forward and backward run on micro-batches of that many sequences,
// their gradients added up (each loss weighted 1/n), the losses their mean, the router counts
// their sum; the reduction overlaps the last backward only.
StepResult run_step(Model& model, DataParallelOptimizer& optimizer, const TrainBatches& batches,
                    double lr, int64_t step, double max_grad_norm, bool overlap,
                    const Communicator* world, const std::function<void()>& before_update = {},
                    AnomalyMonitor* anomalies = nullptr, int64_t micro_rows = 0);

}  // namespace foundry
