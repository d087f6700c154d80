// The parts of runtime.h that do not call CUDA (both builds).
#include <fmt/format.h>

#include <algorithm>

#include "cuda/runtime.h"

namespace foundry::gpu {

double GpuInfo::spec_memory_bytes_per_s() const {
  return 2.0 * memory_clock_hz * memory_bus_bits / 8.0;
}

std::string GpuInfo::arch() const { return fmt::format("sm_{}{}", major, minor); }

int64_t slab_chunk_bytes(int64_t bytes, int64_t granularity) {
  constexpr int64_t kMaxChunks = 512;
  const int64_t least = (bytes + kMaxChunks - 1) / kMaxChunks;
  return std::max<int64_t>(1, (least + granularity - 1) / granularity) * granularity;
}

int64_t slab_bytes_handed_back(const ByteRanges& byte_ranges, int64_t slab_bytes,
                               int64_t granularity) {
  const int64_t chunk = slab_chunk_bytes(slab_bytes, granularity);
  int64_t freed = 0;
  for (const auto& [begin, end] : byte_ranges) {
    const int64_t first = (begin + chunk - 1) / chunk, last = end / chunk;
    freed += std::max<int64_t>(0, last - first) * chunk;
  }
  return freed;
}

}  // namespace foundry::gpu
