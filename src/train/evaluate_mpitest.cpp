// Validation under context parallelism (test_train_mpi, at 2, 3 and 4 ranks): each rank
// evaluates its chunks of its group's sequences, and the mean over ranks is the validation
// loss one process computes on the whole batches.
#include <gtest/gtest.h>

#include <cmath>

#include "comm/comm.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "model/model.h"
#include "train/evaluate.h"
#include "train/test_support.h"

namespace foundry {

extern Communicator* g_world;

namespace {

TEST(EvaluateMpi, ContextParallelGivesTheOneProcessLoss) {
  const Communicator& world = *g_world;
  const int W = world.size();
  // Context parallel over the whole world, and DP 2 × CP 2 when there are 4 ranks.
  std::vector<int> sizes = {W};
  if (W == 4) sizes.push_back(2);
  for (int cp_size : sizes) {
    SCOPED_TRACE(fmt::format("CP {} of {} ranks", cp_size, W));
    testing::TempDir dir;  // every rank writes the same dataset into its own directory
    testing::make_synthetic_dataset(dir.path(), 2000, 600, 100000, 50);
    data::Dataset dataset(dir.path());
    ModelConfig config = testing::small_zaya_config(testing::small_moe_config());
    const int64_t T = 4 * cp_size, B = 2 * (W / cp_size);  // chunks of 2 tokens
    config.max_seq_len = T;
    Model model(config, DType::f32);
    model.init_weights(5);
    data::BatchLoader loader = data::BatchLoader::for_eval(dataset, B, T);
    const double reference = evaluate_loss(model, loader, 3, nullptr);

    const Communicator group = world.split(world.rank() / cp_size, world.rank());
    model.set_context_parallel(&group);
    const double split = evaluate_loss(model, loader, 3, &world);
    EXPECT_NEAR(split, reference, 1e-6 * std::abs(reference));
    model.set_context_parallel(nullptr);
  }
}

}  // namespace
}  // namespace foundry
