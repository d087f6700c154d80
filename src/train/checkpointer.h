// Saving and resuming a training run's checkpoints (ckpt/checkpoint.h has the format).
#pragma once
#include <cstdint>
#include <string>

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
  // `train_loader` null: synthetic data (nothing to resume in the data).
  Checkpointer(const RunConfig& rc, const LrSchedule& schedule, Model& model,
               DataParallelOptimizer& optimizer, data::BatchLoader* train_loader,
               Processes& processes, bool quiet);

  // Loads the latest valid checkpoint of the run directory into the model, optimizer, data
  // cursor and router balancers, and returns its step; 0 (with a message) when there is
  // none. Collective. Fails before loading anything when the checkpoint was written by the
  // other optimizer.
  int64_t resume();

  // Writes a checkpoint of `step` (rank 0 writes, after gathering what the ranks hold) and
  // keeps the newest train.keep_checkpoints. Collective: no rank goes on before it is
  // committed.
  void save(int64_t step);

 private:
  json trainer_state(int64_t step) const;

  const RunConfig& rc_;
  LrSchedule schedule_;
  Model& model_;
  DataParallelOptimizer& optimizer_;
  data::BatchLoader* train_loader_;
  Processes& processes_;
  bool quiet_;
};

// Fails unless the checkpoint `dir` (its trainer state `saved_state`) was written by the
// `configured` optimizer: the state of one cannot continue the other. Checkpoints from
// before train.optimizer existed have no "optimizer" key and were written by AdamW.
void check_same_optimizer(const std::string& dir, const json& saved_state,
                          OptimizerKind configured);

}  // namespace foundry
