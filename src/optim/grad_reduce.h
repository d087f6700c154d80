// Data-parallel gradient reduction in buckets, started while the backward pass still runs.
//
// The backward pass finishes the gradient slab from its end towards its start: the final
// norm, then the layers from last to first (each MoE sublayer before its attention
// sublayer), then the embedding. The model reports that progress as "every gradient at slab
// offset >= o is final" (Model::set_gradients_final_hook). GradientReducer collects the
// newly final elements into a pending bucket and, once the bucket holds bucket_elements,
// starts reducing it with non-blocking point-to-point messages; each report also polls the
// buckets in flight, which is what makes Open MPI move them while backward computes (it has
// no progress thread). finish() starts the rest and waits for everything: its time is the
// exposed communication, the rest was hidden behind backward (docs/distributed.md).
//
// The algorithm is a direct reduce-scatter, followed for an all-reduce by a direct
// all-gather. A bucket is cut into one piece per rank: ZeRO-1's shards (reduce-scatter; the
// sum lands in this rank's shard buffer) or equal parts (all-reduce; the sum replaces the
// gradient slab). Every rank sends each piece's owner its contribution; the owner adds the
// contributions in rank order, g_0 + g_1 + … + g_{p−1}, into its piece; for an all-reduce
// it then sends the summed piece to every other rank. Each rank sends (p−1)/p of the bucket
// per phase, the ring minimum, and every element's sum has the same order whatever the
// buckets, the rank count's message sizes or the timing: overlap on and off, and any bucket
// size, give bitwise identical results at any rank count, and reduce-scatter and all-reduce
// give the same sums. Open MPI's own non-blocking collectives were measured first and fell
// short: its reduce-scatter (libnbc) gathers the whole message at one rank (1.5× the minimum
// volume at 2 ranks), and its all-reduce spent 194 ms/step inside the polls against 110 ms
// for the blocking call (docs/distributed.md).
//
// Receives into scratch are posted one peer at a time per bucket, into buffers that return
// to a free list when the bucket completes: the scratch is about one bucket piece per bucket
// in flight, never a slab per peer.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "base/slab_range.h"
#include "base/timer.h"
#include "comm/comm.h"

namespace foundry {

struct GradientReducerOptions {
  // Pending final elements that start a bucket (16 MiB of fp32 by default); the report of
  // offset 0 starts whatever is pending. 0 starts one bucket per report.
  int64_t bucket_elements = int64_t{1} << 22;
  // Longest run one collective carries (MPI counts are int); longer buckets are split.
  int64_t max_message_elements = int64_t{1} << 30;
};

// What one backward's reduction did.
struct GradientReduceStats {
  int64_t collectives = 0;          // buckets started, during backward and in finish()
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
  // Reduces what is left (everything, when not armed) and waits for every bucket; on return
  // the sums are in place (all-reduce: `grads`; reduce-scatter: `shard`). Collective.
  // Without begin(), `grads` and `shard` are given here.
  GradientReduceStats finish(float* grads, float* shard);

  // Reduce-scatter only: zero[r] lists slab ranges that rank r's gradient is zero on and
  // that it never writes (sorted, disjoint; the same lists on every rank): under expert
  // parallelism, the other EP ranks' experts. Those parts are not sent (so their pages are
  // never read, which would make the OS back them) and count as +0 in the sums: an owner
  // starts its piece at zero and adds each rank's contribution over that rank's other parts,
  // in rank order. Empty lists (the default): every rank contributes everything.
  using Ranges = SlabRanges;
  void set_zero_ranges(std::vector<Ranges> zero);

  // Times "comm: gradient buckets in backward" and the exposed "comm: gradient <kind>" into
  // `times` (null: not timed). The exposed name is exposed_op_name().
  void set_op_times(OpTimes* times) { op_times_ = times; }
  const char* exposed_op_name() const;
  bool reduce_scatter() const { return !shard_counts_.empty(); }
  int64_t slab_elements() const { return slab_elements_; }

 private:
  // A receive buffer (uninitialized; reused between buckets and steps).
  struct Scratch {
    std::unique_ptr<float[]> data;
    int64_t capacity = 0;
  };
  // One bucket in flight.
  struct Bucket {
    int tag = 0;
    std::vector<int64_t> piece_begin, piece_size;  // every rank's piece (slab offsets)
    std::vector<Request> sends;    // this rank's contributions to the other pieces' owners
    int next_rank = 0;             // the next contribution to this rank's piece, in rank order
    std::vector<Request> receive;  // from next_rank (when posted; one per contributed range)
    bool receiving = false;
    Scratch incoming, sum;         // a received contribution; the all-reduce's running sum
    bool reduced = false;          // this rank's piece holds the sum
    std::vector<Request> gather;   // all-reduce: summed pieces out and in
    bool gathering = false;
    bool complete = false;
  };

  // The parts of [begin, end) outside zero_[rank] (everything without zero ranges), as
  // offsets from `begin`.
  Ranges contributed(int rank, int64_t begin, int64_t end) const;
  // Posts the receive of `rank`'s `parts` into `target` (once per contribution) and tells
  // whether they have all arrived.
  bool received(Bucket& b, int rank, float* target, const Ranges& parts);
  // Cuts [begin, end) at max_message_elements and starts a bucket for each part.
  void start(int64_t begin, int64_t end);
  // Advances a bucket as far as it goes without waiting; true once it is complete.
  bool advance(Bucket& b);
  // advance's steps, each true once done: this rank's piece summed over the ranks (into its
  // shard, or in place in the slab), its contributions sent, the sums shared (all-reduce).
  bool sum_into_shard(Bucket& b);
  bool sum_in_place(Bucket& b);
  bool contributions_sent(Bucket& b);
  bool sums_shared(Bucket& b);
  void poll();
  Scratch take_scratch(int64_t elements);
  void give_back(Scratch& s);

  Communicator comm_;
  int64_t slab_elements_;
  std::vector<int64_t> shard_counts_, shard_begin_;  // reduce-scatter only
  GradientReducerOptions options_;
  bool armed_ = false;
  float* grads_ = nullptr;
  float* shard_ = nullptr;
  int64_t reported_ = 0;  // the lowest offset reported final so far (slab_elements: none)
  int64_t started_ = 0;   // elements at or above this offset have a collective started
  std::vector<Ranges> zero_;  // per rank; empty: none
  std::vector<Bucket> buckets_;
  size_t first_open_ = 0;               // buckets_[i] for i < first_open_ are complete
  std::vector<Scratch> free_scratch_;   // receive buffers of completed buckets
  GradientReduceStats stats_;
  OpTimes* op_times_ = nullptr;
};

}  // namespace foundry
