// Numerical anomalies of training steps: their detection, and what the run does about them.
//
// A step is anomalous when its loss (the mean over the global batch) is not finite
// (nan_loss), its global gradient norm before clipping is not finite (nan_grad), or its
// loss spikes: loss > train.spike_factor × the median loss of the last train.spike_window
// good steps, once the window holds train.spike_warmup of them (spike). The verdict is taken
// inside the optimizer step, after the norm's reduction and before anything is updated
// (DataParallelOptimizer::step's veto), from values every rank holds alike, and is agreed over
// the ranks: an anomalous step changes nothing on any rank (no parameter, optimizer state,
// router balancer or step counter), and train.anomaly_policy decides what follows:
//   skip      its batch is dropped and the same step runs on the next batch: the run is the
//             run whose data lacks that batch (train.skip_batches = [that batch]);
//   rollback  its batch is dropped and the run reloads its last committed checkpoint (after
//             the save in flight commits) and replays from there; with no checkpoint yet,
//             as skip (nothing was updated since the start, so they coincide);
//   stop      the run fails with a report.
// train.max_consecutive_anomalies in a row (no good step between) or train.max_anomalies in
// the run stop it too, with the list of anomalies and what to change.
//
// Dropped batches are kept by batch number (TrainBatches) in the checkpoints' trainer state
// and in RUN_DIR/skipped_batches.json, so a resumed run drops them too, even from a
// checkpoint older than the decision. Every anomaly and action goes to RUN_DIR/events.jsonl
// (rank 0) and to the console.
//
// The spike defaults: the mean loss over a batch of thousands of tokens moves by a few
// percent from batch to batch and even an unusual batch rarely reaches 1.5× the recent loss,
// while a diverging run doubles it within steps, so factor 2 flags divergence and not noise
// (a false alarm costs one batch). The median of 32 steps ignores a few noisy steps and still
// follows the falling loss (early in training the window lags above the current loss, which
// errs towards fewer alarms). Detection waits for 8 good steps so the first, fastest-falling
// losses of a run (or of a resume without a saved window) make a usable baseline.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "base/config_reader.h"
#include "model/model.h"
#include "train/batches.h"
#include "train/run_config.h"
#include "train/train_fault.h"

namespace foundry {

class Communicator;

enum class AnomalyKind { none = 0, nan_loss = 1, nan_grad = 2, spike = 3 };
const char* anomaly_kind_name(AnomalyKind kind);

// The verdict on one step from its losses and gradient norm, and the window of good losses.
class AnomalyDetector {
 public:
  // spike_factor 0: no spike detection.
  AnomalyDetector(double spike_factor, int64_t window, int64_t warmup);

  // nan_loss before nan_grad before spike: the first that applies.
  AnomalyKind check(double loss, double grad_norm) const;
  // A good step's loss joins the window (the oldest leaves a full one).
  void accept(double loss);
  // What a spike is measured against: the median of the window; NaN while it holds fewer
  // than `warmup` losses or with spike detection off.
  double baseline() const;
  double threshold() const;  // spike_factor × baseline()

  // For the checkpoint: {"losses": [...]} (doubles round trip exactly); restore replaces the
  // window (an absent state: an empty window).
  json state() const;
  void restore(const json& state);

 private:
  double factor_;
  size_t window_, warmup_;
  std::deque<double> losses_;
  mutable std::vector<double> scratch_;  // the median's, reused
};

// One anomalous step.
struct Anomaly {
  int64_t step = 0, batch = 0;
  AnomalyKind kind = AnomalyKind::none;
  double loss = 0, grad_norm = 0, threshold = 0;  // threshold: NaN when spikes are not checked
  json to_json() const;       // non-finite values are null
  std::string describe() const;  // "step 6 (batch 7): gradient norm nan (nan_grad)"
};

enum class AnomalyAction { skip, rollback, stop };

// The anomaly machinery of a training run: the faults to inject, the detector, the budget and
// the record of dropped batches. Every rank holds one and calls it at the same points.
class AnomalyMonitor {
 public:
  // `batches`: where dropped batches go. `root` writes events and the record, and reports.
  AnomalyMonitor(const TrainConfig& tc, const Communicator* world, bool root,
                 TrainBatches& batches);

  const TrainFaults& faults() const { return faults_; }

  // The optimizer's veto (optim/clip.h) for step `step` on batch `batch` with `losses` (means
  // over the ranks): true when the step is anomalous, on every rank alike (collective: one
  // small all-reduce). A good step's loss joins the detector's window and ends a streak.
  bool veto(int64_t step, int64_t batch, const ForwardResult& losses, double grad_norm);

  // After a vetoed step: drops its batch (for good: TrainBatches, the record, the trainer
  // state), reports it and returns what to do next: train.anomaly_policy, or stop when the
  // budget is spent.
  AnomalyAction handle();
  // Reports a rollback to `to_step` (-1: there was no checkpoint, the step was skipped).
  void rolled_back(int64_t to_step);
  // The stop: records it and fails with the report (every rank; exit status 1).
  [[noreturn]] void stop();

  // Checkpoints: the batch position, the dropped batches and the loss window go into the
  // trainer state; restore reads them back (older checkpoints have none: the batch position
  // is then the step) and keeps the batches dropped since.
  void save_state(json& trainer_state) const;
  void restore_state(const json& trainer_state);
  // Resume: drops the batches earlier processes of this run dropped (the record).
  void load_record();
  // A fresh run: forgets an earlier run's record in this run directory.
  void clear_record();

 private:
  void append_record(const Anomaly& a, const char* action);
  std::string budget_report() const;

  const TrainConfig& tc_;
  const Communicator* world_;
  bool root_;
  TrainBatches& batches_;
  TrainFaults faults_;
  AnomalyDetector detector_;
  Anomaly last_;                   // the anomaly handle() acts on
  std::vector<Anomaly> streak_;    // consecutive anomalies, no good step between
  json record_ = json::array();    // RUN_DIR/skipped_batches.json "batches"
  std::string stop_reason_;
};

}  // namespace foundry
