// The optimizer of a run from its train.* keys.
#pragma once
#include "optim/optimizer.h"
#include "train/run_config.h"

namespace foundry {

// AdamW for every tensor (train.optimizer = "adamw"), or Muon for the 2-D hidden matrices
// and AdamW for the rest ("muon"), with the data-parallel layout keys (train.zero1,
// train.grad_bucket_mib). Fails naming the key on a Muon setting Muon cannot use.
OptimizerOptions optimizer_options(const TrainConfig& tc);

}  // namespace foundry
