// Fault injection for the numerical-anomaly tests: FOUNDRY_TRAIN_FAULT makes chosen training
// batches misbehave every time they are trained, on the last rank only, so the detection has
// to see the fault through the reduction over ranks.
//
//   FOUNDRY_TRAIN_FAULT=<kind>@<batch>[,<kind>@<batch>...]
//     nan_grad    a NaN in one gradient element (the embedding's first), written before the
//                 backward pass accumulates into it and before any gradient is reduced
//     nan_loss    the batch's loss on that rank is NaN
//     loss_spike  the batch's loss on that rank reads 1000× its value (a spike as the
//                 detector sees it, whatever the data and the model; its gradient is the
//                 batch's own)
//     sigterm     that rank sends itself SIGTERM before the batch's backward pass (a stop
//                 that arrives inside a given step, as a scheduler's preemption would);
//                 sigterm@0: once its model is built, before a resume's checkpoint loads
//                 (a stop while the run starts)
//     batch       the 1-based batch number in data order (TrainBatches), not the step
// A malformed value is an error naming it. Unset: every check is an empty-vector test.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace foundry {

enum class TrainFaultKind { nan_grad, nan_loss, loss_spike, sigterm };

class TrainFaults {
 public:
  TrainFaults() = default;
  // The faults of `spec` (the variable's syntax; "" = none). Fails naming the bad entry.
  static TrainFaults parse(const std::string& spec);
  // FOUNDRY_TRAIN_FAULT of this process, for rank `rank` of `ranks`.
  static TrainFaults from_environment(int rank, int ranks);

  bool empty() const { return faults_.empty(); }
  // After the forward pass of batch `batch`: this rank's losses, poisoned if it is faulty.
  void poison_losses(int64_t batch, ForwardResult& losses) const;
  // Once the model is built, before the first step (sigterm@0).
  void while_starting() const;
  // Before the backward pass of batch `batch` (which accumulates into the gradients).
  void poison_gradients(int64_t batch, Model& model) const;

 private:
  bool has(TrainFaultKind kind, int64_t batch) const;

  struct Fault {
    TrainFaultKind kind;
    int64_t batch;
  };
  std::vector<Fault> faults_;
  bool injecting_rank_ = true;  // the last rank
};

}  // namespace foundry
