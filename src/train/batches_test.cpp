#include "train/batches.h"

#include "data/dataset.h"
#include "train/test_support.h"

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
  whole.restart_after(4);
  whole.next();
  EXPECT_EQ(whole.local_batch(), B);
  EXPECT_EQ(whole.global_tokens(), B * T);
  for (int rank = 0; rank < 2; ++rank) {
    TrainBatches part(nullptr, B, T, rank, 2, 50, 11);
    part.restart_after(4);
    part.next();
    ASSERT_EQ(part.local_batch(), 2);
    for (int64_t i = 0; i < 2 * T; ++i) {
      EXPECT_EQ(part.local_inputs()[i], whole.local_inputs()[rank * 2 * T + i]);
      EXPECT_EQ(part.local_targets()[i], whole.local_targets()[rank * 2 * T + i]);
    }
  }
}

// Skipped batches are read and dropped: the batches after one are those the run without it
// sees, numbered in data order.
TEST(Batches, SkippedSyntheticBatchesAreDroppedAndNumbersStayInDataOrder) {
  const int64_t B = 2, T = 4;
  TrainBatches batches(nullptr, B, T, 0, 1, 50, 11);
  batches.skip(2);
  batches.skip(3);
  EXPECT_EQ(batches.next(), 1);
  EXPECT_EQ(batches.next(), 4);
  EXPECT_EQ(batches.batch(), 4);
  std::vector<int32_t> in(B * T), tg(B * T);
  synthetic_batch(in.data(), tg.data(), B * T, 50, 11, 4);
  EXPECT_EQ(std::vector<int32_t>(batches.local_inputs(), batches.local_inputs() + B * T), in);
  batches.restart_after(9);
  batches.skip(10);
  EXPECT_EQ(batches.next(), 11);
}

TEST(Batches, SkippedLoaderBatchesMoveTheCursorPastThem) {
  testing::TempDir dir;
  testing::make_synthetic_dataset(dir.path(), 4000, 600, 100000, 50);
  data::Dataset dataset(dir.path());
  data::BatchLoader plain_loader(dataset, 2, 8, 5), skipping_loader(dataset, 2, 8, 5);
  TrainBatches plain(&plain_loader, 2, 8, 0, 1, 50, 5),
      skipping(&skipping_loader, 2, 8, 0, 1, 50, 5);
  skipping.skip(2);
  for (int i = 0; i < 3; ++i) plain.next();
  EXPECT_EQ(skipping.next(), 1);
  EXPECT_EQ(skipping.next(), 3);
  EXPECT_EQ(std::vector<int32_t>(skipping.local_inputs(), skipping.local_inputs() + 16),
            std::vector<int32_t>(plain.local_inputs(), plain.local_inputs() + 16));
  EXPECT_EQ(skipping_loader.cursor(), plain_loader.cursor());
}

}  // namespace
}  // namespace foundry
