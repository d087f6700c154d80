// Saving and resuming a training run's checkpoints: sharded (format 2, ckpt/sharded.h),
// asynchronous, and loadable under any process layout the config allows.
//
// A save is three phases:
//   snapshot  (in the step loop) this rank's part of the parameters and of the optimizer
//             state is copied into host buffers that are reused from save to save;
//   write     (a background thread, or in the step loop with train.checkpoint_async =
//             false) the rank's shard file is written and fsynced in the staging directory;
//   commit    (collective, at a step boundary once every rank's write is done) the ranks'
//             outcomes are exchanged; if all succeeded rank 0 writes the metadata and the
//             commit marker and points `latest` at the checkpoint, else every rank fails
//             with the failing ranks and their errors (the previous checkpoint stays valid).
// At most one save is in flight; one that falls due meanwhile waits for it or is skipped
// (train.checkpoint_overlap).
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/checkpoint.h"
#include "data/loader.h"
#include "optim/optimizer.h"
#include "train/processes.h"
#include "train/run_config.h"

namespace foundry {

class Model;

class Checkpointer {
 public:
  // `schedule`: the run's learning-rate schedule (its lr at a step is saved with it).
  // `train_loader` null: synthetic data (nothing to resume in the data). Collective (the
  // ranks agree on a tag for their staging directories).
  Checkpointer(const RunConfig& rc, const LrSchedule& schedule, Model& model,
               DataParallelOptimizer& optimizer, data::BatchLoader* train_loader,
               Processes& processes, bool quiet);
  // A save still in flight is abandoned uncommitted (its staging directory is cleaned by a
  // later save): an error is unwinding. Call finish() on the normal paths.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Loads the latest valid checkpoint of the run directory (either format, any layout) into
  // the model, optimizer, data cursor and router balancers, reading only what this rank
  // holds, and returns its step; 0 (with a message) when there is none. Collective. Fails
  // before loading anything when the checkpoint was written by the other optimizer.
  int64_t resume();

  // Starts a checkpoint of `step`: the snapshot, then the write in the background (or to the
  // end, and the commit, when not asynchronous). Collective.
  void save(int64_t step);
  // At a step boundary: commits the save in flight once every rank has written it, and
  // fails (on every rank) if a rank's write failed. Collective: every rank calls it at the
  // same steps (one small all-reduce while a save is in flight).
  void poll();
  // Waits for the save in flight and commits it (end of run, signal). Collective.
  void finish();

  // Seconds the step loop spent in save() and in commits (snapshots, and writes when not
  // asynchronous), for the report.
  double stall_seconds() const { return stall_seconds_; }

 private:
  struct RankShard;  // the staging directory, runs and outcome of this rank's write
  json trainer_state(int64_t step) const;
  void snapshot(int64_t step);
  void write_shard();  // the write phase (background thread or inline)
  void commit();       // the commit phase, collective
  std::vector<SlabTarget> load_targets();

  const RunConfig& rc_;
  LrSchedule schedule_;
  Model& model_;
  DataParallelOptimizer& optimizer_;
  data::BatchLoader* train_loader_;
  Processes& processes_;
  bool quiet_;
  std::string tag_;  // the same on every rank: names this run's staging directories

  // The save in flight (in_flight_ from snapshot to commit).
  bool in_flight_ = false;
  int64_t step_ = 0;
  json state_;
  std::string staging_;
  std::vector<float> buffer_;  // the snapshot, reused
  std::vector<SlabRun> runs_;
  std::thread writer_;
  std::atomic<bool> written_{false};
  std::string shard_;  // this rank's description (JSON) or, on failure, ""
  std::string error_;  // this rank's write error
  double started_ = 0, stall_seconds_ = 0;
};

// Fails unless the checkpoint `dir` (its trainer state `saved_state`) was written by the
// `configured` optimizer: the state of one cannot continue the other. Checkpoints from
// before train.optimizer existed have no "optimizer" key and were written by AdamW.
void check_same_optimizer(const std::string& dir, const json& saved_state,
                          OptimizerKind configured);

}  // namespace foundry
