// The parameter slab cut into fixed work chunks for the optimizer and gradient clipping.
//
// A chunk is a run of at most kSlabChunkElements elements inside the tensors of the slab
// (the alignment padding between tensors is never touched). Adjacent tensors that share a
// weight-decay setting merge into one run before cutting, so chunks are long. The cut
// depends only on the parameter table, never on the thread count: elementwise updates and
// per-chunk partial sums are therefore bitwise identical with any number of threads.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/params.h"

namespace foundry {

inline constexpr int64_t kSlabChunkElements = 16384;

struct SlabChunk {
  int64_t offset = 0;  // elements into the slab
  int64_t size = 0;    // elements, 1..kSlabChunkElements
  bool decay = false;  // the chunk's tensors are in the weight-decay group
};

// Chunks covering every tensor of `table` in slab order; `decays(info)` puts a tensor in
// the weight-decay group (pass nullptr when the grouping does not matter).
std::vector<SlabChunk> slab_chunks(const ParamTable& table,
                                   const std::function<bool(const ParamInfo&)>& decays);

}  // namespace foundry
