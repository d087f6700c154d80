// The end-of-run report of `foundry train`: memory per rank, the data-parallel gradient
// reduction, and the per-operation time table (--op-breakdown).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/timer.h"
#include "optim/grad_reduce.h"

namespace foundry {

class Communicator;

// Peak resident memory of this process (bytes).
int64_t peak_rss_bytes();

// The data-parallel gradient reduction summed over the timed steps.
struct GradientCommTotals {
  int64_t steps = 0;
  double exposed = 0, in_backward = 0, collectives = 0, started_in_backward = 0;
  double elements_in_backward = 0;
  void add(const GradientReduceStats& s);
  double exposed_per_step() const { return steps > 0 ? exposed / static_cast<double>(steps) : 0; }
  // "gradient reduction per step (N steps): 3.0 buckets, 2.0 started during backward …"
  std::string describe(int64_t slab_elements) const;
};

// Memory of one rank at the end of training (before the final checkpoint).
struct RankMemory {
  double rss_bytes = 0;    // peak resident memory
  double slab_bytes = 0;   // weight, gradient and bf16 slabs backed by memory
};

// Collective: every rank's figures (one entry in a single process).
std::vector<RankMemory> gather_rank_memory(const Communicator* world, const RankMemory& mine);

// "memory per rank: optimizer state 336.0 MiB (ZeRO-1) | weight and gradient slabs rank 0 …"
// `layout`: the optimizer's layout under data parallelism, empty in one process.
std::string format_memory_line(double optimizer_state_bytes, const std::string& layout,
                               const std::vector<RankMemory>& ranks, bool data_parallel);

// The per-operation table: mean time per step over `steps` steps and the share of each.
std::string format_op_breakdown(const OpTimes& times, int64_t steps);

}  // namespace foundry
