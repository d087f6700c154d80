// Multi-rank tests of the bucketed gradient reduction (optim/grad_reduce.h), run with the
// ZeRO-1 tests at 2, 3 and 4 ranks. Every rank draws every rank's gradient slab (from the
// seed and the rank), so each computes the exact references itself: the rank-order sum
// g_0 + g_1 + … that the overlapped reduce-scatter must reproduce bit for bit, whatever the
// buckets. Every rank makes the same communicator calls whatever it finds.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/rng.h"
#include "base/test_expect_error.h"
#include "comm/comm.h"
#include "optim/grad_reduce.h"

namespace foundry {
namespace {

Communicator& world() {
  static Communicator w(MPI_COMM_WORLD, /*owned=*/false);
  return w;
}

constexpr int64_t kSlab = 1237;  // not a multiple of 2, 3 or 4: uneven shards

std::vector<float> rank_gradient(int rank) {
  Rng rng(1000 + static_cast<uint64_t>(rank));
  std::vector<float> g(kSlab);
  for (float& x : g) x = static_cast<float>(rng.normal());
  return g;
}

// The rank-order sum of every rank's gradient, as float additions in rank order.
std::vector<float> rank_order_sum() {
  std::vector<float> sum = rank_gradient(0);
  for (int r = 1; r < world().size(); ++r) {
    const std::vector<float> g = rank_gradient(r);
    for (int64_t i = 0; i < kSlab; ++i) sum[i] += g[i];
  }
  return sum;
}

// ZeRO-1's shards: ceil(E/p) per rank, the last ones shorter (possibly empty).
std::vector<int64_t> shard_counts() {
  const int p = world().size();
  const int64_t b = (kSlab + p - 1) / p;
  std::vector<int64_t> counts;
  for (int r = 0; r < p; ++r)
    counts.push_back(std::max<int64_t>(0, std::min(kSlab, (r + 1) * b) - std::min(kSlab, r * b)));
  return counts;
}

int64_t shard_begin(const std::vector<int64_t>& counts, int rank) {
  int64_t at = 0;
  for (int r = 0; r < rank; ++r) at += counts[r];
  return at;
}

// The backward pass's reports: decreasing offsets, uneven gaps, ending at 0.
const std::vector<int64_t> kReports = {1200, 1100, 1099, 700, 650, 333, 20, 0};

struct Case {
  int64_t bucket, max_message;
};

TEST(GradientReducer, OverlappedReduceScatterIsTheRankOrderSumForAnyBuckets) {
  const std::vector<int64_t> counts = shard_counts();
  const int me = world().rank();
  const std::vector<float> expected = rank_order_sum();
  const int64_t begin = shard_begin(counts, me);
  // One collective per report; buckets spanning several reports; one bucket for all;
  // messages split at 64 elements.
  for (Case c : {Case{0, 1 << 20}, Case{300, 1 << 20}, Case{1 << 20, 1 << 20}, Case{0, 64},
                 Case{250, 97}}) {
    SCOPED_TRACE("bucket " + std::to_string(c.bucket) + ", max message " +
                 std::to_string(c.max_message));
    GradientReducer reducer(world(), kSlab, counts, {c.bucket, c.max_message});
    for (int step = 0; step < 2; ++step) {  // the second step reuses the scratch
      std::vector<float> grads = rank_gradient(me);
      const std::vector<float> before = grads;
      std::vector<float> shard(counts[me] + 1, -1.0f);  // one guard element past the shard
      reducer.begin(grads.data(), shard.data());
      for (int64_t o : kReports) reducer.final_from(o);
      const GradientReduceStats stats = reducer.finish(grads.data(), shard.data());
      for (int64_t i = 0; i < counts[me]; ++i)
        ASSERT_EQ(shard[i], expected[begin + i]) << "element " << begin + i;
      EXPECT_EQ(shard[counts[me]], -1.0f) << "wrote past the shard";
      EXPECT_EQ(grads, before) << "reduce-scatter must only read the gradient slab";
      EXPECT_EQ(stats.elements_in_backward, kSlab);  // the last report (0) starts the rest
      if (c.bucket == 0 && c.max_message >= kSlab) {
        EXPECT_EQ(stats.collectives, static_cast<int64_t>(kReports.size()));
      }
      if (c.bucket >= kSlab) {
        EXPECT_EQ(stats.collectives, (kSlab + c.max_message - 1) / c.max_message);
      }
    }
  }
}

TEST(GradientReducer, ReportsThatStopEarlyLeaveTheRestToFinish) {
  const std::vector<int64_t> counts = shard_counts();
  const int me = world().rank();
  const std::vector<float> expected = rank_order_sum();
  GradientReducer reducer(world(), kSlab, counts, {0, 1 << 20});
  std::vector<float> grads = rank_gradient(me), shard(counts[me]);
  reducer.begin(grads.data(), shard.data());
  reducer.final_from(900);
  const GradientReduceStats stats = reducer.finish(grads.data(), shard.data());
  EXPECT_EQ(stats.started_in_backward, 1);
  EXPECT_EQ(stats.elements_in_backward, kSlab - 900);
  EXPECT_EQ(stats.collectives, 2);
  const int64_t begin = shard_begin(counts, me);
  for (int64_t i = 0; i < counts[me]; ++i) ASSERT_EQ(shard[i], expected[begin + i]);
}

TEST(GradientReducer, AllReduceAndUnarmedReductionsAreTheRankOrderSumToo) {
  const std::vector<int64_t> counts = shard_counts();
  const int me = world().rank();
  const std::vector<float> expected = rank_order_sum();
  const int64_t begin = shard_begin(counts, me);
  for (Case c : {Case{0, 1 << 20}, Case{300, 1 << 20}, Case{250, 97}}) {
    SCOPED_TRACE("bucket " + std::to_string(c.bucket) + ", max message " +
                 std::to_string(c.max_message));
    for (bool armed : {true, false}) {
      SCOPED_TRACE(armed ? "overlapped" : "after backward");
      {  // reduce-scatter, not armed: everything in finish()
        GradientReducer reducer(world(), kSlab, counts, {c.bucket, c.max_message});
        std::vector<float> grads = rank_gradient(me), shard(counts[me]);
        if (armed) {
          reducer.begin(grads.data(), shard.data());
          for (int64_t o : kReports) reducer.final_from(o);
        }
        const GradientReduceStats stats = reducer.finish(grads.data(), shard.data());
        if (!armed) {
          EXPECT_EQ(stats.started_in_backward, 0);
          EXPECT_EQ(stats.collectives, (kSlab + c.max_message - 1) / c.max_message);
        }
        for (int64_t i = 0; i < counts[me]; ++i) ASSERT_EQ(shard[i], expected[begin + i]) << i;
      }
      GradientReducer all_reduce(world(), kSlab, {}, {c.bucket, c.max_message});
      for (int step = 0; step < 2; ++step) {  // all-reduce in place; the second reuses scratch
        GradientReducer& reducer = all_reduce;
        std::vector<float> grads = rank_gradient(me);
        if (armed) {
          reducer.begin(grads.data(), nullptr);
          for (int64_t o : kReports) reducer.final_from(o);
        }
        reducer.finish(grads.data(), nullptr);
        ASSERT_EQ(0, std::memcmp(grads.data(), expected.data(), kSlab * sizeof(float)))
            << "all-reduce differs from the rank-order sum";
      }
    }
  }
}

TEST(GradientReducer, ZeroRangesAreNeitherSentNorRead) {
  // Rank r's gradient is zero on its zero ranges, and those elements hold NaN in its slab:
  // the sums must not see them (a NaN read anywhere would poison the result).
  const std::vector<int64_t> counts = shard_counts();
  const int me = world().rank(), p = world().size();
  auto zero_of = [](int r) {
    GradientReducer::Ranges z;
    for (int64_t b = 37 * (r + 1); b + 50 < kSlab; b += 211) z.push_back({b, b + 50 + r});
    return z;
  };
  std::vector<GradientReducer::Ranges> zero;
  for (int r = 0; r < p; ++r) zero.push_back(zero_of(r));
  auto gradient = [&](int r, bool poison) {
    std::vector<float> g = rank_gradient(r);
    for (const auto& [b, e] : zero_of(r))
      for (int64_t i = b; i < e; ++i)
        g[i] = poison ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    return g;
  };
  // The reference: +0, then each rank's gradient added in rank order (zeros where zero).
  std::vector<float> expected(kSlab, 0.0f);
  for (int r = 0; r < p; ++r) {
    const std::vector<float> g = gradient(r, false);
    for (int64_t i = 0; i < kSlab; ++i) expected[i] += g[i];
  }
  const int64_t begin = shard_begin(counts, me);
  for (Case c : {Case{0, 1 << 20}, Case{300, 97}}) {
    for (bool armed : {true, false}) {
      GradientReducer reducer(world(), kSlab, counts, {c.bucket, c.max_message});
      reducer.set_zero_ranges(zero);
      std::vector<float> grads = gradient(me, /*poison=*/true), shard(counts[me]);
      if (armed) {
        reducer.begin(grads.data(), shard.data());
        for (int64_t o : kReports) reducer.final_from(o);
      }
      reducer.finish(grads.data(), shard.data());
      for (int64_t i = 0; i < counts[me]; ++i)
        ASSERT_EQ(shard[i], expected[begin + i]) << "element " << begin + i;
    }
  }
  GradientReducer all_reduce(world(), kSlab, {});
  expect_error([&] { all_reduce.set_zero_ranges(zero); }, "reduce-scatter");
}

TEST(GradientReducer, MisuseFailsClearly) {
  const std::vector<int64_t> counts = shard_counts();
  GradientReducer reducer(world(), kSlab, counts, {0, 1 << 20});
  std::vector<float> grads = rank_gradient(world().rank()), shard(counts[world().rank()] + 1);
  reducer.begin(grads.data(), shard.data());
  reducer.final_from(500);
  // Local checks, before any message: the same on every rank.
  expect_error([&] { reducer.final_from(600); }, "offsets must decrease");
  expect_error([&] { reducer.begin(grads.data(), shard.data()); }, "begin() twice");
  std::vector<float> other(kSlab);
  expect_error([&] { reducer.finish(other.data(), shard.data()); }, "other buffers");
  reducer.finish(grads.data(), shard.data());
  expect_error([&] { GradientReducer(world(), kSlab, {1, 2, 3, 4, 5}); }, "shard counts");
  expect_error([&] { GradientReducer(world(), kSlab, {}, {-1, 10}); }, "bucket of -1 elements");
}

}  // namespace
}  // namespace foundry
