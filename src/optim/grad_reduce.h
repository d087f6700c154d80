// Data-parallel gradient reduction in buckets, started while the backward pass still runs.
//
// The backward pass finishes the gradient slab from its end towards its start: the final
// norm, then the layers from last to first (each MoE sublayer before its attention
// sublayer), then the embedding. The model reports that progress as "every gradient at slab
// offset >= o is final" (Model::set_gradients_final_hook). GradientReducer collects the
// newly final elements into a pending bucket and, once the bucket holds bucket_elements,
// starts a non-blocking collective on it: MPI_Iallreduce in place (plain data parallel) or
// MPI_Ireduce_scatter into this rank's ZeRO-1 shard. Each report also polls the collectives
// in flight, which is what makes Open MPI progress them while backward computes (it has no
// progress thread). finish() starts the rest and waits for everything: its time is the
// exposed communication, the rest was hidden behind backward (docs/distributed.md).
//
// Without begin() (overlap off) finish() reduces the whole slab after backward with blocking
// collectives in windows of max_message_elements, which is the baseline the overlap is
// measured against.
//
// A bucket's reduce-scatter is our own direct one, not MPI_Ireduce_scatter: Open MPI's
// non-blocking reduce-scatter (libnbc) reduces the whole message at one rank and scatters
// it, which moves 1.5× the ring minimum at 2 ranks (measured, docs/distributed.md). Here
// every rank sends each shard owner its part of the bucket (point to point) and the owner
// adds the contributions in rank order, so each rank sends exactly the (p−1)/p·bucket the
// ring does, and every element's sum is g_0 + g_1 + … + g_{p−1} in that order whatever the
// buckets. Receives are posted one peer at a time per bucket (one bucket-piece of scratch
// per bucket in flight, never a slab per peer).
//
// Results: without overlap the blocking MPI_Reduce_scatter / MPI_Allreduce sum; with it the
// rank-order sum (reduce-scatter) or MPI_Iallreduce's. At 2 ranks every choice gives the same
// bits (a + b = b + a); at 3 or more, other orders, so overlap on and off agree to float
// rounding. A fixed configuration and layout is bitwise reproducible: the buckets follow from
// the slab layout, and no order depends on timing.
#pragma once
#include <cstdint>
#include <vector>

#include "base/timer.h"
#include "comm/comm.h"

namespace foundry {

struct GradientReducerOptions {
  // Pending final elements that start a collective (16 MiB of fp32 by default; the
  // remainder goes in finish()). 0 starts one per report.
  int64_t bucket_elements = int64_t{1} << 22;
  // Longest run one collective carries (MPI counts are int); longer buckets are split.
  int64_t max_message_elements = int64_t{1} << 30;
};

// What one backward's reduction did.
struct GradientReduceStats {
  int64_t collectives = 0;          // collectives started, during backward and in finish()
  int64_t started_in_backward = 0;  // of which before finish()
  int64_t elements_in_backward = 0; // slab elements they carried
  double in_backward_seconds = 0;   // time inside final_from(): starting and polling
  double exposed_seconds = 0;       // finish(): starting the rest and waiting for all
};

class GradientReducer {
 public:
  // `comm` is duplicated (its own message space). `shard_counts` empty: all-reduce; else the
  // elements of every rank's ZeRO-1 shard in rank order (contiguous, summing to
  // slab_elements): reduce-scatter, rank r receiving the sum over its shard.
  GradientReducer(const Communicator& comm, int64_t slab_elements,
                  std::vector<int64_t> shard_counts, const GradientReducerOptions& options = {});

  // Arms the reducer for one backward pass. `grads`: the gradient slab (slab_elements;
  // all-reduce sums into it in place; reduce-scatter only reads it). `shard`: reduce-scatter's
  // receive buffer, the shard's elements from its first (null for all-reduce). The buffers
  // must stay valid, and the final parts of `grads` untouched, until finish().
  void begin(float* grads, float* shard);
  bool armed() const { return armed_; }
  // Every gradient at slab offset >= `offset` is final. Offsets must not increase over the
  // calls of one backward. No-op unless armed. Collective in effect: every rank must report
  // the same offsets in the same order (the same model does).
  void final_from(int64_t offset);
  // Reduces what is left (everything, when not armed: blocking, in windows) and waits for
  // every collective; on return the sums are in place (all-reduce: `grads`; reduce-scatter:
  // `shard`). Collective. Without begin(), `grads` and `shard` are given here.
  GradientReduceStats finish(float* grads, float* shard);

  // Times "comm: gradient buckets in backward" and the exposed "comm: gradient <kind>" into
  // `times` (null: not timed). The exposed name is exposed_op_name().
  void set_op_times(OpTimes* times) { op_times_ = times; }
  const char* exposed_op_name() const;
  bool reduce_scatter() const { return !shard_counts_.empty(); }
  int64_t slab_elements() const { return slab_elements_; }

 private:
  // One bucket's direct reduce-scatter in flight: the sends of this rank's contributions to
  // the other owners, and the rank-order accumulation of this rank's piece.
  struct Bucket {
    int tag = 0;
    int64_t piece_begin = 0, piece_size = 0;  // this rank's part of the bucket (slab offsets)
    std::vector<Request> sends;
    int next_rank = 0;      // the next contribution to add, in rank order
    Request receive;        // from next_rank, into scratch (when posted)
    bool receiving = false;
    std::vector<float> scratch;
  };

  // Starts the collective for [begin, end) (split at max_message_elements): non-blocking
  // when `nonblocking`, else completed before returning.
  void reduce_range(int64_t begin, int64_t end, bool nonblocking);
  void start_bucket(int64_t begin, int64_t end);
  // Advances a bucket as far as it goes without waiting; true once it is complete.
  bool advance(Bucket& b);
  void poll();

  Communicator comm_;
  int64_t slab_elements_;
  std::vector<int64_t> shard_counts_, shard_begin_;  // reduce-scatter only
  GradientReducerOptions options_;
  bool armed_ = false;
  float* grads_ = nullptr;
  float* shard_ = nullptr;
  int64_t reported_ = 0;  // the lowest offset reported final so far (slab_elements: none)
  int64_t started_ = 0;   // elements at or above this offset have a collective started
  std::vector<Request> in_flight_;   // all-reduce
  size_t first_pending_ = 0;  // in_flight_[i] for i < first_pending_ are complete
  std::vector<Bucket> buckets_;      // reduce-scatter
  size_t first_open_ = 0;     // buckets_[i] for i < first_open_ are complete
  std::vector<std::vector<float>> spare_scratch_;  // reused between steps
  GradientReduceStats stats_;
  OpTimes* op_times_ = nullptr;
};

}  // namespace foundry
