// Pieces of a tensor as boxes of its global shape, and the contiguous runs a box covers.
//
// A box is a sub-block of a row-major tensor: per dimension an offset and a length. A
// contiguous range of the flattened tensor (what a rank holds of a slab) splits into at most
// 2·(ndim − 1) + 1 boxes: partial rows up to the next boundary of each dimension, then one
// box of whole blocks, then partial blocks down again. Each such box is itself contiguous
// in the flattened tensor. Any box, read back, is a sequence of runs: contiguous ranges of
// the flattened tensor, in the box's row-major order.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace foundry {

struct Box {
  std::vector<int64_t> offsets, lengths;
  int64_t numel() const;
  bool operator==(const Box&) const = default;
};

// The boxes covering flat elements [begin, end) of a tensor of `shape` (row-major), in order,
// each contiguous. A scalar or 1-D tensor gives one box. Empty for an empty range.
std::vector<Box> flat_range_to_boxes(const std::vector<int64_t>& shape, int64_t begin,
                                     int64_t end);

// A contiguous run of the flattened tensor that a box covers: flat elements [begin, end) of
// the tensor, which are elements [box_offset, box_offset + end − begin) of the box in its
// row-major order. Adjacent runs are merged, so a contiguous box is one run.
struct BoxRun {
  int64_t begin = 0, end = 0, box_offset = 0;
};
std::vector<BoxRun> box_runs(const std::vector<int64_t>& shape, const Box& box);

// Fails (naming `what`) unless `box` lies inside `shape` with positive lengths.
void check_box(const std::vector<int64_t>& shape, const Box& box, const char* what);
// Throws unless no dimension is negative and the element count is at most 2^52 (a corrupt
// shape is refused, not multiplied out).
void check_shape(const std::vector<int64_t>& shape, const std::string& what);

}  // namespace foundry
