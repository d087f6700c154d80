#include "train/evaluate.h"

#include <gtest/gtest.h>

#include "model/model.h"
#include "train/test_support.h"

namespace foundry {
namespace {

using testing::TempDir;

// `dir`, once a synthetic dataset is made there.
std::string with_synthetic_dataset(const std::string& dir) {
  testing::make_synthetic_dataset(dir, 2000, 600, 100000, 50);
  return dir;
}

// A small model and a synthetic dataset's validation batches of 4 sequences.
struct EvalSetup {
  EvalSetup() { model.init_weights(5); }
  data::BatchLoader batches() const { return data::BatchLoader::for_eval(dataset, B, T); }
  TempDir dir;
  data::Dataset dataset{with_synthetic_dataset(dir.path())};
  const ModelConfig config = testing::small_moe_config();
  Model model{config, DType::f32};
  const int64_t B = 4, T = config.max_seq_len;
};

TEST(Evaluate, MeanCrossEntropyOverTheFirstValidationBatches) {
  EvalSetup e;
  Model& model = e.model;
  const int64_t B = e.B, T = e.T;
  data::BatchLoader loader = e.batches();

  data::BatchLoader reference = e.batches();
  std::vector<int32_t> inputs(B * T), targets(B * T);
  double sum = 0;
  for (int i = 0; i < 3; ++i) {
    reference.next(inputs.data(), targets.data());
    sum += model.forward(inputs.data(), targets.data(), B, T).ce_loss;
  }
  loader.next(inputs.data(), targets.data());  // a pass starts from the first batch anyway
  EXPECT_EQ(evaluate_loss(model, loader, 3), sum / 3);
  EXPECT_EQ(evaluate_loss(model, loader, 3), sum / 3);  // and again
  EXPECT_NE(evaluate_loss(model, loader, 1), sum / 3);
  EXPECT_EQ(mean_over_ranks(nullptr, 2.5), 2.5);
}

TEST(Evaluate, MicroBatchesForwardARanksRowsAFewAtATime) {
  EvalSetup e;
  Model& model = e.model;
  const int64_t B = e.B, T = e.T, micro = 2;
  data::BatchLoader loader = e.batches();

  // Each batch's loss is the mean of its micro-batches' means.
  data::BatchLoader reference = e.batches();
  std::vector<int32_t> inputs(B * T), targets(B * T);
  double sum = 0, whole = 0;
  for (int i = 0; i < 2; ++i) {
    reference.next(inputs.data(), targets.data());
    whole += model.forward(inputs.data(), targets.data(), B, T).ce_loss;
    double batch = 0;
    for (int64_t m = 0; m < B / micro; ++m)
      batch +=
          model.forward(inputs.data() + m * micro * T, targets.data() + m * micro * T, micro, T)
              .ce_loss;
    sum += batch / static_cast<double>(B / micro);
  }
  const double loss = evaluate_loss(model, loader, 2, nullptr, micro);
  EXPECT_EQ(loss, sum / 2);
  EXPECT_NEAR(loss, whole / 2, 1e-4 * whole);  // the same mean, summed in another order
  // A micro-batch at or above the rows runs them whole.
  EXPECT_EQ(evaluate_loss(model, loader, 2, nullptr, B), evaluate_loss(model, loader, 2));
}

}  // namespace
}  // namespace foundry
