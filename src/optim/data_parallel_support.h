// Pieces the data-parallel optimizers share (optim/optimizer.cpp, the CPU's; and
// optim/device_data_parallel.cpp, a device's): checkpoint shares and state runs, and the
// average of summed gradients.
#pragma once
#include <cstdint>
#include <vector>

#include "base/slab_range.h"
#include "optim/optimizer.h"

namespace foundry {

// Rank r's share of n elements in an even split over `ranks` (ZeRO-1's shard formula).
SlabRange even_share(int64_t n, int ranks, int r);

// The parts of `runs` inside `share`.
std::vector<StateRun> clip_runs(const std::vector<StateRun>& runs, SlabRange share);

// The summed gradient x [n] of `ranks` ranks, divided by them in place (in float, as every
// replicated layout does, so that they agree bit for bit).
void average_over_ranks(float* x, int64_t n, int ranks);

// Adjacent runs of one state whose values are adjacent too become one run (ZeRO-1 keeps its
// AdamW moments in fixed-size chunks: a checkpoint wants them as few, long pieces).
std::vector<StateRun> merge_runs(std::vector<StateRun> runs);

}  // namespace foundry
