#include "optim/slab_chunks.h"

#include <algorithm>

namespace foundry {

std::vector<SlabChunk> slab_chunks(const ParamTable& table,
                                   const std::function<bool(const ParamInfo&)>& decays) {
  // Merge tensors that touch in the slab and share a decay setting into runs.
  std::vector<SlabChunk> runs;
  for (const ParamInfo& p : table.params()) {
    if (p.numel == 0) continue;
    const bool decay = decays ? decays(p) : false;
    if (!runs.empty() && runs.back().offset + runs.back().size == p.offset &&
        runs.back().decay == decay) {
      runs.back().size += p.numel;
    } else {
      runs.push_back({p.offset, p.numel, decay});
    }
  }
  std::vector<SlabChunk> chunks;
  for (const SlabChunk& run : runs) {
    for (int64_t begin = 0; begin < run.size; begin += kSlabChunkElements) {
      const int64_t size = std::min(kSlabChunkElements, run.size - begin);
      chunks.push_back({run.offset + begin, size, run.decay});
    }
  }
  return chunks;
}

}  // namespace foundry
