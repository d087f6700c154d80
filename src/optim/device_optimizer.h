// The optimizer of a one-GPU run: the single-process layout of optim/optimizer.h (AdamW for
// every tensor, or Muon for the 2-D hidden matrices plus AdamW for the rest) on parameter and
// gradient slabs in a GPU's memory, with its state there too.
//
// A step: the global gradient norm (sums of squares in double over fixed blocks, one copy to
// the host: the veto and the anomaly checks need its value), the clip factor, AdamW over all
// its tensors in one launch with the clip factor and the bf16 copy fused in, then Muon tensor
// by tensor (momentum, Newton–Schulz through cuBLASLt, the update). The elementwise
// arithmetic is the CPU optimizers' (cuda/adamw.h, cuda/muon.h); the norm and Newton–Schulz
// sum in another order, so a GPU run is deterministic but not the CPU's bits.
//
// Checkpoints: the state runs point into host copies, filled from the GPU when a save asks
// for them; runs filled by a load go back to the GPU before the next step.
#pragma once
#include <memory>

#include "optim/optimizer.h"

namespace foundry {

std::unique_ptr<DataParallelOptimizer> make_device_optimizer(const ParamTable& table,
                                                             const OptimizerOptions& options);

}  // namespace foundry
