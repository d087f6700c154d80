#include "train/evaluate.h"

#include <cstdio>
#include <string>
#include <vector>

#include "base/error.h"

#include "comm/comm.h"
#include "model/context_parallel.h"
#include "model/model.h"

namespace foundry {

double mean_over_ranks(const Communicator* world, double local) {
  if (!world) return local;
  world->allreduce(&local, &local, 1);
  return local / world->size();
}

int64_t whole_validation_batches(const data::BatchLoader& loader) {
  return loader.windows_per_epoch() / loader.batch_size();
}

int64_t validation_batches(const data::BatchLoader& loader, int64_t requested,
                           const char* flag) {
  const int64_t held = whole_validation_batches(loader);
  const std::string what =
      fmt::format("the validation split holds {} window(s) of {} tokens, {} whole batch(es) of {}",
                  loader.windows_per_epoch(), loader.seq_len() + 1, held, loader.batch_size());
  if (held == 0)
    fail(fmt::format("{}: not one batch to evaluate", what),
         fmt::format("lower train.batch_size to {} or less (--set train.batch_size=N), or prepare "
                     "the data with a larger --val-fraction",
                     loader.windows_per_epoch()));
  if (requested <= held) return requested;
  if (flag)
    fail(fmt::format("{} {} is more than there is: {}", flag, requested, what),
         fmt::format("pass {} {} or fewer, or prepare the data with a larger --val-fraction",
                     flag, held));
  std::fprintf(stderr, "warning: train.eval_batches = %lld, but %s: evaluating those %lld\n",
               static_cast<long long>(requested), what.c_str(), static_cast<long long>(held));
  return held;
}

double evaluate_loss(Model& model, data::BatchLoader& loader, int64_t batches,
                     const Communicator* world, int64_t micro_rows) {
  // Context-parallel groups (C consecutive ranks) share their sequences, as in training.
  const ContextParallel* cp = model.context_parallel();
  const int c = cp ? cp->size() : 1;
  const int groups = (world ? world->size() : 1) / c, group = (world ? world->rank() : 0) / c;
  const int64_t B = loader.batch_size(), T = loader.seq_len(), Bl = B / groups;
  // A rank's rows go through in micro-batches of equal size, as training runs them: the mean
  // of their means is the share's mean.
  const int64_t micro = micro_rows > 0 && micro_rows < Bl ? micro_rows : Bl;
  FOUNDRY_CHECK(Bl % micro == 0);
  const int64_t pieces = Bl / micro;
  std::vector<int32_t> inputs(static_cast<size_t>(B * T)), targets(inputs.size());
  std::vector<int32_t> local_inputs(static_cast<size_t>(micro * T / c)),
      local_targets(local_inputs.size());
  loader.reset();
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    loader.next(inputs.data(), targets.data());
    double batch_sum = 0;
    for (int64_t m = 0; m < pieces; ++m) {
      const int64_t offset = (group * Bl + m * micro) * T;
      if (cp) {
        cp->take_local(inputs.data() + offset, local_inputs.data(), micro, T, 1);
        cp->take_local(targets.data() + offset, local_targets.data(), micro, T, 1);
        batch_sum += model.forward(local_inputs.data(), local_targets.data(), micro, T / c).ce_loss;
      } else {
        batch_sum +=
            model.forward(inputs.data() + offset, targets.data() + offset, micro, T).ce_loss;
      }
    }
    sum += pieces == 1 ? batch_sum : batch_sum / static_cast<double>(pieces);
  }
  return mean_over_ranks(world, sum / static_cast<double>(batches));
}

}  // namespace foundry
