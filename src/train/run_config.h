// The run configuration file: {"model": {...}, "train": {...}, "data": {...}}.
// Loaded strictly (unknown keys and bad values are errors naming the key); command-line
// "--set section.key=value" overrides are applied to the JSON before validation.
#pragma once
#include <string>
#include <vector>

#include "base/config_reader.h"
#include "base/device.h"
#include "kernels/gemm.h"
#include "model/config.h"
#include "model/info.h"
#include "optim/schedule.h"

namespace foundry {

// What a checkpoint that falls due while the previous one is being written does.
enum class CheckpointOverlap { wait, skip };

// What a step judged anomalous (train/anomaly.h) does after its update was dropped: `skip`
// its batch and go on, `rollback` to the last checkpoint and replay without the batch, or
// `stop` the run with an error.
enum class AnomalyPolicy { skip, rollback, stop };

struct TrainConfig {
  int64_t steps = 1000;
  int64_t batch_size = 8;       // sequences per step
  // Sequences a rank runs forward and backward at once; its share of the batch in
  // micro-batches of this many, their gradients accumulated (0: the whole share at once).
  int64_t micro_batch_size = 0;
  int64_t seq_len = 256;
  double lr = 3e-4;             // peak learning rate
  double min_lr_ratio = 0.1;    // final lr = lr * min_lr_ratio
  int64_t warmup_steps = 100;
  ScheduleKind schedule = ScheduleKind::cosine;  // "cosine" | "wsd" | "constant"
  double decay_fraction = 0.2;  // wsd: share of steps spent decaying at the end
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;       // global gradient-norm clip (0 = off)
  // "adamw": AdamW for every tensor. "muon": Muon for the 2-D hidden matrices (attention
  // projections, each expert matrix) and AdamW for the rest (see optim/muon.h).
  OptimizerKind optimizer = OptimizerKind::adamw;
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int64_t muon_ns_steps = 5;
  double muon_rms_scale = 0.2;  // update RMS matched to AdamW's: rms_scale·sqrt(max(m, n))
  // GEMM inputs of the Newton–Schulz iteration: "bf16" (fp32 accumulation; the usual choice,
  // its ~3 significant digits are ample for an approximate orthogonalization) or "fp32".
  DType muon_ns_precision = DType::bf16;
  DType precision = DType::bf16;  // GEMM input type: "fp32" | "bf16"
  // Where the arithmetic runs: "cpu", or one GPU ("cuda", "cuda:N"; one process, no expert or
  // context parallelism).
  DeviceSpec device;
  // Under mpirun: ranks per expert-parallel group (experts sharded over them; must divide the
  // ranks and n_experts). Every rank is also a data-parallel (ZeRO-1) rank.
  int64_t expert_parallel = 1;
  // Under mpirun: ranks per context-parallel group (each sequence cut into 2C chunks, two per
  // rank; must divide the ranks, and 2C must divide seq_len). docs/long-context.md.
  int64_t context_parallel = 1;
  // Under mpirun: a step (or checkpoint) that takes longer than this ends the job with an
  // error naming the rank, instead of hanging when a peer died (0 = no limit).
  double comm_timeout_s = 300;
  // Heartbeats (train/heartbeat.h): every rank writes RUN_DIR/heartbeat/rank_N.json every
  // heartbeat_interval_s (0 = off) and watches a neighbour; a rank silent for
  // heartbeat_timeout_s has died or stopped, and no progress for hang_timeout_s (or 3× the
  // slowest step so far, if longer) is a hang: the job ends with exit code 3, naming the rank.
  double heartbeat_interval_s = 1;
  double heartbeat_timeout_s = 5;
  double hang_timeout_s = 45;
  // Under mpirun: shard the optimizer state over the data-parallel ranks (ZeRO-1: gradients
  // reduce-scattered, weights all-gathered), or keep it whole on every rank (false:
  // gradients all-reduced, every rank runs the full optimizer step).
  bool zero1 = true;
  // Under mpirun: start reducing the gradients in buckets of grad_bucket_mib MiB (fp32)
  // while the backward pass still runs, or only after it (false).
  bool overlap_grad_reduce = true;
  double grad_bucket_mib = 16;
  uint64_t seed = 1234;
  int64_t log_every = 10;
  int64_t eval_every = 100;     // 0 = only at the end
  int64_t eval_batches = 8;
  int64_t checkpoint_every = 500;  // 0 = only at the end
  int64_t keep_checkpoints = 3;    // newest N kept (0 = keep all)
  // A checkpoint when the run reaches its last step (a stop on a signal always writes
  // one): false for benchmark runs, whose final state nobody resumes.
  bool checkpoint_at_end = true;
  // Write checkpoints in a background thread while training goes on (the step loop only
  // copies this rank's state into host memory), or within the step loop (false).
  bool checkpoint_async = true;
  // A checkpoint falls due while the previous one is still being written: wait for it to
  // commit, or skip the new one.
  CheckpointOverlap checkpoint_overlap = CheckpointOverlap::wait;
  // In-memory checkpoints (train/memory_tier.h): every memory_checkpoint_every steps (0 =
  // off) each rank also writes its state to a RAM-backed directory under
  // memory_checkpoint_dir, from which a restart after a crash resumes when it is newer than
  // the run directory's checkpoints. Needs every rank on one host.
  int64_t memory_checkpoint_every = 0;
  std::string memory_checkpoint_dir = "/dev/shm";
  // Numerical anomalies (train/anomaly.h): a non-finite loss or gradient norm, or a loss
  // above spike_factor × the median loss of the last spike_window good steps (once there
  // are spike_warmup of them; spike_factor 0 = no spike detection), drops the step's update
  // and then follows anomaly_policy. max_consecutive_anomalies in a row, or max_anomalies in
  // the run (0 = no limit), stop it with an error.
  AnomalyPolicy anomaly_policy = AnomalyPolicy::skip;
  double spike_factor = 2.0;
  int64_t spike_window = 32;
  int64_t spike_warmup = 8;
  int64_t max_consecutive_anomalies = 3;
  int64_t max_anomalies = 10;
  // Training batches (1-based, in data order) never trained on: read and dropped, as the
  // anomaly policy drops a batch.
  std::vector<int64_t> skip_batches;
  double peak_gflops = 0;       // MFU denominator per process (train/mfu.h); 0 = not given
  // A hardware profile (path or name, `foundry bench all`) whose measured GEMM peak is the
  // MFU denominator when peak_gflops is 0; empty: measured at the start of the run.
  std::string hardware_profile;
  std::string run_dir = "runs/default";
};

struct DataConfig {
  std::string dir;              // output of `foundry data prepare` ("" with --synthetic-data)
};

struct RunConfig {
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  json source;                  // the effective JSON (after overrides), saved with checkpoints
};

// The train.* settings that shape a run's trajectory (batch, sequence, seed, precision, the
// schedule and the optimizer's hyperparameters; train.optimizer itself is checked against the
// checkpoint) that differ between `before` and `now`, one "train.lr: 0.001 -> 0.0003" each.
// Operational settings (steps, logging, checkpoints, heartbeats, skip_batches) are free to
// change on a resume.
std::vector<std::string> trajectory_changes(const TrainConfig& before, const TrainConfig& now);
// The ZAYA1 balancer's settings that changed ("model.balance_rule: adamw -> newton"): they shape
// training as the train keys do (a checkpoint loads under others: the rule starts afresh).
std::vector<std::string> balancer_changes(const ModelConfig& before, const ModelConfig& now);

// The learning-rate schedule of train.schedule, lr, min_lr_ratio, warmup_steps, steps and
// decay_fraction.
LrSchedule lr_schedule(const TrainConfig& config);

// The layout rules a job of `ranks` processes must meet (`mpi`: under MPI; one process without
// it otherwise): train.context_parallel and train.expert_parallel divide the ranks, the batch
// splits evenly over the context-parallel groups, the experts over the expert-parallel ranks.
// `ranks_from` names where the count comes from in errors ("this job", "--restart-np 1").
void check_rank_layout(const RunConfig& rc, int64_t ranks, bool mpi, const std::string& ranks_from);
// The sequences a rank runs at once of its `share` of the batch: train.micro_batch_size, or
// the whole share when it is 0 (or larger).
inline int64_t micro_batch_rows(const TrainConfig& tc, int64_t share) {
  return tc.micro_batch_size > 0 && tc.micro_batch_size < share ? tc.micro_batch_size : share;
}
// The same, refused when train.micro_batch_size does not divide the share: `share_is` says
// what the share is in the error ("a rank's 4 sequences of the batch (train.batch_size = 8
// over 2 ranks)").
int64_t checked_micro_batch_rows(const TrainConfig& tc, int64_t share, const std::string& share_is);

// Reads `path`, applies overrides ("train.lr=1e-3"), validates.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Whether `doc` has a run config's shape: an object of model, train and data sections only
// (what a run's config.json and plan --out hold; the sections themselves are not checked).
bool has_run_config_shape(const json& doc);
RunConfig parse_run_config(const json& root, const std::string& where);

}  // namespace foundry
