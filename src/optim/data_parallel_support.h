// Pieces the data-parallel optimizers share (optim/optimizer.cpp, the CPU's; and
// optim/device_data_parallel.cpp, a device's): checkpoint shares and state runs, the average
// of summed gradients, and the buckets of gradients reduced during backward over NCCL.
#pragma once
#include <cstdint>
#include <functional>
#include <utility>
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

// The NCCL form of the overlap: the gradients reported final are reduced in buckets of
// `bucket_elements` or more (0: one per report) on the group's own stream, beside the rest of
// backward (NcclGroup::*_beside); the step reduces what is left and makes the optimizer's work
// wait for all of it. Without the reports the step reduces the whole slab at once.
class NcclBuckets {
 public:
  // reduce(grads, range): queues the reduction of that range of the gradient slab beside the
  // default stream.
  using Reduce = std::function<void(float* grads, SlabRange range)>;
  NcclBuckets(int64_t elements, int64_t bucket_elements, Reduce reduce)
      : elements_(elements), bucket_(bucket_elements), reduce_(std::move(reduce)) {}
  void begin(float* grads) {
    grads_ = grads;
    pending_end_ = elements_;
  }
  void final_from(int64_t offset) {
    if (!grads_ || offset >= pending_end_ || pending_end_ - offset < bucket_) return;
    reduce_(grads_, SlabRange{offset, pending_end_});
    pending_end_ = offset;
  }
  // True when the step must reduce the whole slab itself (not armed); else queues the rest.
  bool finish() {
    if (!grads_) return true;
    if (pending_end_ > 0) reduce_(grads_, SlabRange{0, pending_end_});
    grads_ = nullptr;
    return false;
  }

 private:
  int64_t elements_, bucket_;
  Reduce reduce_;
  float* grads_ = nullptr;  // armed: this backward's gradient slab
  int64_t pending_end_ = 0;
};

}  // namespace foundry
