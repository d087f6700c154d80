// The NCCL path's gradient buckets (optim/data_parallel_support.h), on their own: what they
// hand to the reduction, for the reports a backward makes. A GPU group of one cannot check
// this (its reduction is the identity), so it is checked here, on every machine.
#include "optim/data_parallel_support.h"

#include <gtest/gtest.h>

#include <vector>

namespace foundry {
namespace {

struct Recorded {
  std::vector<SlabRange> ranges;
  std::vector<float*> slabs;
};

NcclBuckets recording(Recorded& r, int64_t elements, int64_t bucket) {
  return NcclBuckets(elements, bucket, [&r](float* grads, SlabRange range) {
    r.slabs.push_back(grads);
    r.ranges.push_back(range);
  });
}

// The reductions cover [0, n) once, from the end down, with no gaps or overlaps.
void expect_tiles(const std::vector<SlabRange>& ranges, int64_t n) {
  ASSERT_FALSE(ranges.empty());
  EXPECT_EQ(ranges.front().end, n);
  EXPECT_EQ(ranges.back().begin, 0);
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_EQ(ranges[i].end, ranges[i - 1].begin) << i;
  for (const SlabRange& r : ranges) EXPECT_LT(r.begin, r.end);
}

TEST(NcclBuckets, ReportsFromTheEndDownReduceEveryElementOnceInBucketsOfAtLeastTheSize) {
  Recorded r;
  NcclBuckets buckets = recording(r, 1000, 100);
  float slab = 0;
  buckets.begin(&slab);
  // Tensors starting at these offsets, reported final from the last one down.
  for (int64_t offset : {950, 900, 870, 700, 690, 400, 30, 10, 0}) buckets.final_from(offset);
  const size_t during_backward = r.ranges.size();
  EXPECT_FALSE(buckets.finish());  // it queued the rest itself
  expect_tiles(r.ranges, 1000);
  // [900, 1000), [700, 900), [400, 700) and [30, 400) as the reports come; finish's [0, 30)
  // holds the last two reports, 20 and 10 elements.
  EXPECT_EQ(during_backward, 4u);
  for (size_t i = 0; i < during_backward; ++i) EXPECT_GE(r.ranges[i].size(), 100) << i;
  for (float* s : r.slabs) EXPECT_EQ(s, &slab);
}

TEST(NcclBuckets, BucketZeroReducesEachReportAndRepeatsOrStaleReportsAreIgnored) {
  Recorded r;
  NcclBuckets buckets = recording(r, 64, 0);
  float slab = 0;
  buckets.begin(&slab);
  for (int64_t offset : {48, 48, 60, 32, 16}) buckets.final_from(offset);  // 48 twice, 60 late
  EXPECT_FALSE(buckets.finish());
  expect_tiles(r.ranges, 64);
  EXPECT_EQ(r.ranges.size(), 4u);  // [48, 64), [32, 48), [16, 32), then finish's [0, 16)
}

TEST(NcclBuckets, UnarmedOrFinishedTheyReduceNothing) {
  Recorded r;
  NcclBuckets buckets = recording(r, 100, 10);
  buckets.final_from(50);  // no begin(): the step reduces the whole slab itself
  EXPECT_TRUE(buckets.finish());
  EXPECT_TRUE(r.ranges.empty());
  float slab = 0;
  buckets.begin(&slab);
  buckets.final_from(0);  // the whole slab in one report
  EXPECT_FALSE(buckets.finish());
  ASSERT_EQ(r.ranges.size(), 1u);
  EXPECT_EQ(r.ranges[0].begin, 0);
  EXPECT_EQ(r.ranges[0].end, 100);
  buckets.final_from(0);  // after finish: disarmed until the next begin()
  EXPECT_TRUE(buckets.finish());
  EXPECT_EQ(r.ranges.size(), 1u);
}

}  // namespace
}  // namespace foundry
