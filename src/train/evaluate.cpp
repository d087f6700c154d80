#include "train/evaluate.h"

#include <vector>

#include "comm/comm.h"
#include "model/context_parallel.h"
#include "model/model.h"

namespace foundry {

double mean_over_ranks(const Communicator* world, double local) {
  if (!world) return local;
  world->allreduce(&local, &local, 1);
  return local / world->size();
}

double evaluate_loss(Model& model, data::BatchLoader& loader, int64_t batches,
                     const Communicator* world) {
  // Context-parallel groups (C consecutive ranks) share their sequences, as in training.
  const ContextParallel* cp = model.context_parallel();
  const int c = cp ? cp->size() : 1;
  const int groups = (world ? world->size() : 1) / c, group = (world ? world->rank() : 0) / c;
  const int64_t B = loader.batch_size(), T = loader.seq_len(), Bl = B / groups;
  std::vector<int32_t> inputs(static_cast<size_t>(B * T)), targets(inputs.size());
  std::vector<int32_t> local_inputs(static_cast<size_t>(Bl * T / c)),
      local_targets(local_inputs.size());
  const int64_t offset = group * Bl * T;
  loader.reset();
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    loader.next(inputs.data(), targets.data());
    if (cp) {
      cp->take_local(inputs.data() + offset, local_inputs.data(), Bl, T, 1);
      cp->take_local(targets.data() + offset, local_targets.data(), Bl, T, 1);
      sum += model.forward(local_inputs.data(), local_targets.data(), Bl, T / c).ce_loss;
    } else {
      sum += model.forward(inputs.data() + offset, targets.data() + offset, Bl, T).ce_loss;
    }
  }
  return mean_over_ranks(world, sum / static_cast<double>(batches));
}

}  // namespace foundry
