// How a device's slabs are backed (Backend::allocate_slab): in chunks, whole multiples of a
// granularity (a GPU's allocation granularity, 2 MiB on current GPUs; a page on the CPU posing
// as a device), at most kMaxSlabChunks of them, so that the chunks wholly inside a slab's
// holes take no memory of their own. Plain C++17 (CUDA sources include it).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace foundry {

// Byte ranges [begin, end) of a slab (sorted, disjoint).
using ByteRanges = std::vector<std::array<int64_t, 2>>;

inline constexpr int64_t kMaxSlabChunks = 512;

// The chunk of a slab of `bytes`: the least multiple of `granularity` that backs it in at most
// kMaxSlabChunks chunks.
inline int64_t slab_chunk_bytes(int64_t bytes, int64_t granularity) {
  const int64_t least = (bytes + kMaxSlabChunks - 1) / kMaxSlabChunks;
  return std::max<int64_t>(1, (least + granularity - 1) / granularity) * granularity;
}

// The chunks [first, last) wholly inside byte range [begin, end).
inline std::array<int64_t, 2> chunks_inside(int64_t begin, int64_t end, int64_t chunk) {
  const int64_t first = (begin + chunk - 1) / chunk, last = end / chunk;
  return {first, std::max(first, last)};
}

// The bytes of a slab of `slab_bytes` in chunks wholly inside `holes`: what they do not take.
inline int64_t slab_bytes_in_holes(const ByteRanges& holes, int64_t slab_bytes,
                                   int64_t granularity) {
  const int64_t chunk = slab_chunk_bytes(slab_bytes, granularity);
  int64_t inside = 0;
  for (const auto& [begin, end] : holes) {
    const auto [first, last] = chunks_inside(begin, end, chunk);
    inside += (last - first) * chunk;
  }
  return inside;
}

}  // namespace foundry
