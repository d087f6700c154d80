#include "ckpt/boxes.h"

#include <fmt/format.h>

#include "base/error.h"

namespace foundry {

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t l : lengths) n *= l;
  return n;
}

namespace {

// strides[d]: elements per step of dimension d.
std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

// The box of the flat range [begin, begin + count·stride[d]) that starts at a multiple of
// stride[d]: whole blocks of dimension d, the dimensions before fixed by `begin`.
Box block_box(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
              int64_t begin, size_t d, int64_t count) {
  Box b;
  int64_t rest = begin;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t index = rest / strides[i];
    rest %= strides[i];
    b.offsets.push_back(i <= d ? index : 0);
    b.lengths.push_back(i < d ? 1 : i == d ? count : shape[i]);
  }
  return b;
}

}  // namespace

std::vector<Box> flat_range_to_boxes(const std::vector<int64_t>& shape, int64_t begin,
                                     int64_t end) {
  std::vector<Box> boxes;
  if (end <= begin) return boxes;
  if (shape.size() <= 1) {
    boxes.push_back({{begin}, {end - begin}});
    if (shape.empty()) boxes.back() = {{}, {}};
    return boxes;
  }
  const std::vector<int64_t> strides = strides_of(shape);
  const size_t last = shape.size() - 1;
  int64_t at = begin;
  // Up: from the innermost dimension out, finish the partial block of each dimension.
  for (size_t d = last; d > 0 && at < end; --d) {
    const int64_t block = strides[d - 1];  // elements of one index of dimension d − 1
    const int64_t to_boundary = (block - at % block) % block;
    const int64_t count = std::min(to_boundary, end - at) / strides[d];
    if (count > 0) {
      boxes.push_back(block_box(shape, strides, at, d, count));
      at += count * strides[d];
    }
    if (at % block != 0) break;  // end reached inside this block
  }
  // Down: whole blocks of the outermost dimension possible, then of the inner ones.
  for (size_t d = 0; d <= last && at < end; ++d) {
    const int64_t count = (end - at) / strides[d];
    if (count > 0) {
      boxes.push_back(block_box(shape, strides, at, d, count));
      at += count * strides[d];
    }
  }
  return boxes;
}

std::vector<BoxRun> box_runs(const std::vector<int64_t>& shape, const Box& box) {
  std::vector<BoxRun> runs;
  if (shape.empty()) return {{0, 1, 0}};
  const std::vector<int64_t> strides = strides_of(shape);
  const size_t nd = shape.size();
  const int64_t row = box.lengths[nd - 1];
  std::vector<int64_t> index(nd, 0);  // position inside the box, innermost dimension fixed at 0
  for (int64_t box_offset = 0; box_offset < box.numel(); box_offset += row) {
    int64_t flat = 0;
    for (size_t d = 0; d < nd; ++d) flat += (box.offsets[d] + index[d]) * strides[d];
    if (!runs.empty() && runs.back().end == flat)
      runs.back().end += row;
    else
      runs.push_back({flat, flat + row, box_offset});
    for (size_t d = nd - 1; d-- > 0;) {  // next row: odometer over the outer dimensions
      if (++index[d] < box.lengths[d]) break;
      index[d] = 0;
    }
  }
  return runs;
}

void check_box(const std::vector<int64_t>& shape, const Box& box, const char* what) {
  bool ok = box.offsets.size() == shape.size() && box.lengths.size() == shape.size();
  for (size_t d = 0; ok && d < shape.size(); ++d)
    ok = box.offsets[d] >= 0 && box.lengths[d] > 0 && box.offsets[d] <= shape[d] &&
         box.lengths[d] <= shape[d] - box.offsets[d];  // (no sum of corrupt values to overflow)
  if (!ok)
    fail(fmt::format(
             "{}: the box (offsets [{}], lengths [{}]) does not fit the tensor's shape [{}]", what,
             fmt::join(box.offsets, ", "), fmt::join(box.lengths, ", "), fmt::join(shape, ", ")),
         "the checkpoint metadata is corrupt");
}

void check_shape(const std::vector<int64_t>& shape, const std::string& what) {
  constexpr int64_t kMaxElements = int64_t{1} << 52;
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && numel > kMaxElements / d))
      fail(fmt::format("{}: shape [{}] is no tensor's (dimensions 0 or more, at most 2^52 "
                       "elements)",
                       what, fmt::join(shape, ", ")),
           "the checkpoint metadata is corrupt");
    numel *= d;
  }
}

}  // namespace foundry
