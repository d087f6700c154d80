// A range of slab elements [begin, end), and a list of them: the one name for a piece of the
// parameter slab, or of a slab laid out like it (gradients, optimizer state, the bf16 copies),
// wherever one is passed around: holes a process does not store, a rank's ZeRO-1 share, the
// parameters a checkpoint saves, the experts another rank owns.
#pragma once
#include <algorithm>
#include <compare>
#include <cstdint>
#include <vector>

#include "base/slab_chunks.h"

namespace foundry {

struct SlabRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  // By begin, then end (as the pairs these replace sorted).
  auto operator<=>(const SlabRange&) const = default;
};

// Sorted, disjoint ranges unless a use says otherwise.
using SlabRanges = std::vector<SlabRange>;

// The common part of two ranges (empty, at the later begin, when they do not overlap).
inline SlabRange intersect(SlabRange a, SlabRange b) {
  const int64_t begin = std::max(a.begin, b.begin);
  const int64_t end = std::min(a.end, b.end);
  return begin < end ? SlabRange{begin, end} : SlabRange{begin, begin};
}

// The bytes of element ranges, `element_bytes` an element.
inline ByteRanges to_byte_ranges(const SlabRanges& elements, int64_t element_bytes) {
  ByteRanges bytes;
  bytes.reserve(elements.size());
  for (const SlabRange& r : elements)
    bytes.push_back({r.begin * element_bytes, r.end * element_bytes});
  return bytes;
}

// [0, n) without `holes` (sorted, disjoint, inside [0, n)).
inline SlabRanges complement(const SlabRanges& holes, int64_t n) {
  SlabRanges parts;
  int64_t at = 0;
  for (const SlabRange& h : holes) {
    if (h.begin > at) parts.push_back({at, h.begin});
    at = h.end;
  }
  if (at < n) parts.push_back({at, n});
  return parts;
}

// `ranges` (sorted, disjoint) without the elements of `cut`.
inline SlabRanges subtract(const SlabRanges& ranges, SlabRange cut) {
  SlabRanges out;
  for (const SlabRange& r : ranges) {
    if (r.end <= cut.begin || cut.end <= r.begin || cut.empty()) {
      out.push_back(r);
      continue;
    }
    if (r.begin < cut.begin) out.push_back({r.begin, cut.begin});
    if (cut.end < r.end) out.push_back({cut.end, r.end});
  }
  return out;
}

}  // namespace foundry
