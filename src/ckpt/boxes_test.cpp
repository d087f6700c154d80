#include "ckpt/boxes.h"

#include <gtest/gtest.h>

#include <limits>

#include "base/error.h"

namespace foundry {
namespace {

// Every range [b, e) of the tensor: the boxes, read back as runs, are exactly b, b+1, ...,
// e−1 in order, and each box is contiguous (one run).
void expect_exact_cover(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  for (int64_t b = 0; b < numel; ++b)
    for (int64_t e = b + 1; e <= numel; ++e) {
      int64_t at = b;
      const std::vector<Box> boxes = flat_range_to_boxes(shape, b, e);
      ASSERT_LE(boxes.size(), 2 * shape.size());
      for (const Box& box : boxes) {
        const std::vector<BoxRun> runs = box_runs(shape, box);
        ASSERT_EQ(runs.size(), 1u) << "a box from a flat range is contiguous";
        EXPECT_EQ(runs[0].begin, at);
        EXPECT_EQ(runs[0].end - runs[0].begin, box.numel());
        EXPECT_EQ(runs[0].box_offset, 0);
        at = runs[0].end;
      }
      ASSERT_EQ(at, e) << "range [" << b << ", " << e << ")";
    }
}

TEST(Boxes, FlatRangesOfOneTwoAndThreeDimensionsAreCoveredExactly) {
  expect_exact_cover({7});
  expect_exact_cover({3, 5});
  expect_exact_cover({2, 3, 4});
  expect_exact_cover({1, 4, 1});
}

TEST(Boxes, AMiddleRangeOfAMatrixIsARowTailWholeRowsAndARowHead) {
  const auto boxes = flat_range_to_boxes({4, 10}, 7, 33);
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_EQ(boxes[0], (Box{{0, 7}, {1, 3}}));
  EXPECT_EQ(boxes[1], (Box{{1, 0}, {2, 10}}));
  EXPECT_EQ(boxes[2], (Box{{3, 0}, {1, 3}}));
}

TEST(Boxes, AColumnBlockIsOneRunPerRow) {
  // Columns 2..4 of rows 1..2 of a 4×10 matrix: two runs of 3, at 12 and 22.
  const auto runs = box_runs({4, 10}, Box{{1, 2}, {2, 3}});
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].begin, 12);
  EXPECT_EQ(runs[0].end, 15);
  EXPECT_EQ(runs[0].box_offset, 0);
  EXPECT_EQ(runs[1].begin, 22);
  EXPECT_EQ(runs[1].box_offset, 3);
}

TEST(Boxes, ABoxOutsideTheShapeIsAnError) {
  EXPECT_THROW(check_box({4, 10}, Box{{3, 0}, {2, 10}}, "test"), Error);
  EXPECT_THROW(check_box({4, 10}, Box{{0}, {4}}, "test"), Error);
  EXPECT_THROW(check_box({4, 10}, Box{{0, 0}, {0, 10}}, "test"), Error);
  EXPECT_NO_THROW(check_box({4, 10}, Box{{3, 9}, {1, 1}}, "test"));
  // Corrupt values that would overflow a sum are refused, not added.
  const int64_t huge = std::numeric_limits<int64_t>::max();
  EXPECT_THROW(check_box({4, 10}, Box{{huge, 0}, {huge, 10}}, "test"), Error);
  EXPECT_THROW(check_box({4, 10}, Box{{2, 0}, {huge, 10}}, "test"), Error);
}

TEST(Boxes, AShapeMustBeATensorsThatAnInt64Counts) {
  EXPECT_NO_THROW(check_shape({4, 10}, "t"));
  EXPECT_NO_THROW(check_shape({}, "t"));                                    // a scalar
  EXPECT_NO_THROW(check_shape({int64_t{1} << 26, int64_t{1} << 26}, "t"));  // 2^52
  EXPECT_THROW(check_shape({4, -10}, "t"), Error);
  EXPECT_THROW(check_shape({int64_t{1} << 26, (int64_t{1} << 26) + 1}, "t"), Error);
  EXPECT_THROW(check_shape({int64_t{1} << 40, int64_t{1} << 40}, "t"), Error);  // overflows int64
  try {
    check_shape({3, -1}, "metadata.json: tensor 'w'");
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "metadata.json: tensor 'w': shape [3, -1] is no tensor's (dimensions 0 or more, "
                 "at most 2^52 elements)");
  }
}

}  // namespace
}  // namespace foundry
