#include "train/evaluate.h"

#include <vector>

#include "comm/comm.h"
#include "model/model.h"

namespace foundry {

double mean_over_ranks(const Communicator* world, double local) {
  if (!world) return local;
  world->allreduce(&local, &local, 1);
  return local / world->size();
}

double evaluate_loss(Model& model, data::BatchLoader& loader, int64_t batches,
                     const Communicator* world) {
  const int ranks = world ? world->size() : 1, rank = world ? world->rank() : 0;
  const int64_t B = loader.batch_size(), T = loader.seq_len(), Bl = B / ranks;
  std::vector<int32_t> inputs(static_cast<size_t>(B * T)), targets(inputs.size());
  const int64_t offset = rank * Bl * T;
  loader.reset();
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    loader.next(inputs.data(), targets.data());
    sum += model.forward(inputs.data() + offset, targets.data() + offset, Bl, T).ce_loss;
  }
  return mean_over_ranks(world, sum / static_cast<double>(batches));
}

}  // namespace foundry
