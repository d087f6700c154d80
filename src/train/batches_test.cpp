#include "train/batches.h"

#include <gtest/gtest.h>

#include <vector>

namespace foundry {
namespace {

TEST(Batches, SyntheticBatchesArePureFunctionsOfSeedAndStep) {
  std::vector<int32_t> a(64), b(64), c(64), d(64);
  synthetic_batch(a.data(), b.data(), 64, 50, 7, 3);
  synthetic_batch(c.data(), d.data(), 64, 50, 7, 3);
  EXPECT_EQ(a, c);
  EXPECT_EQ(b, d);
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < 50);
  synthetic_batch(c.data(), d.data(), 64, 50, 7, 4);
  EXPECT_NE(a, c);
  synthetic_batch(c.data(), d.data(), 64, 50, 8, 3);
  EXPECT_NE(a, c);
}

TEST(Batches, EachRankTrainsOnItsSliceOfTheGlobalBatch) {
  const int64_t B = 4, T = 8;
  TrainBatches whole(nullptr, B, T, 0, 1, 50, 11);
  whole.next(5);
  EXPECT_EQ(whole.local_batch(), B);
  EXPECT_EQ(whole.global_tokens(), B * T);
  for (int rank = 0; rank < 2; ++rank) {
    TrainBatches part(nullptr, B, T, rank, 2, 50, 11);
    part.next(5);
    ASSERT_EQ(part.local_batch(), 2);
    for (int64_t i = 0; i < 2 * T; ++i) {
      EXPECT_EQ(part.local_inputs()[i], whole.local_inputs()[rank * 2 * T + i]);
      EXPECT_EQ(part.local_targets()[i], whole.local_targets()[rank * 2 * T + i]);
    }
  }
}

}  // namespace
}  // namespace foundry
