#include "base/slab_range.h"

#include <gtest/gtest.h>

namespace foundry {
namespace {

TEST(SlabRanges, ComplementIsWhatTheHolesLeave) {
  EXPECT_EQ(complement({}, 10), (SlabRanges{{0, 10}}));
  EXPECT_EQ(complement({{0, 3}, {5, 7}}, 10), (SlabRanges{{3, 5}, {7, 10}}));
  EXPECT_EQ(complement({{2, 4}, {8, 10}}, 10), (SlabRanges{{0, 2}, {4, 8}}));
  EXPECT_EQ(complement({{0, 10}}, 10), SlabRanges{});
}

TEST(SlabRanges, SubtractCutsARangeOutOfEach) {
  const SlabRanges r = {{0, 4}, {6, 10}, {12, 14}};
  EXPECT_EQ(subtract(r, {2, 8}), (SlabRanges{{0, 2}, {8, 10}, {12, 14}}));
  EXPECT_EQ(subtract(r, {7, 9}), (SlabRanges{{0, 4}, {6, 7}, {9, 10}, {12, 14}}));
  EXPECT_EQ(subtract(r, {0, 14}), SlabRanges{});
  EXPECT_EQ(subtract(r, {4, 6}), r);   // between two: nothing to cut
  EXPECT_EQ(subtract(r, {3, 3}), r);   // an empty cut
}

}  // namespace
}  // namespace foundry
