// NCCL between the GPUs of data-parallel ranks, each rank on a GPU of its own (NCCL refuses two
// ranks on one GPU: those average their gradients through host memory instead). Collectives on
// device buffers, queued on the default stream behind the kernels before them. In a build
// without NCCL (or without CUDA) built_with_nccl() is false and a group fails to open with an
// Error that says so.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "base/slab_range.h"

namespace foundry::gpu {

bool built_with_nccl();

// The device memory one NCCL communicator's buffers may take: NCCL_BUFFSIZE (`buffsize_env`,
// the variable's value or null; NCCL's default of 4 MiB when unset or unreadable) for sending
// and for receiving on each of up to 32 channels. NCCL's documented knobs, not a measured
// figure.
int64_t nccl_buffer_bytes(const char* buffsize_env);

class NcclGroup {
 public:
  // Rank `rank` of `size`, on the current GPU. Collective: every rank constructs its group at
  // once. `share_id(bytes, n)` must give every rank rank 0's n bytes (an MPI broadcast).
  NcclGroup(int rank, int size, const std::function<void(void* bytes, size_t n)>& share_id);
  // Closes the group (collective, as NCCL's destroy is), except while an exception unwinds
  // through it: the other ranks may never close theirs, so this rank leaves the communicator
  // open and goes on to report its error and exit.
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // data [n] (device, in place) = the mean over the ranks of their data.
  void allreduce_mean(float* data, int64_t n);
  // A reduce-scatter with a range per rank (ranges[q] for rank q, the same list on every
  // rank): on rank q, data[ranges[q]] (device, in place) = the mean over the ranks of their
  // data there; the rest of data is not written. One grouped reduce per range.
  void reduce_mean_to_ranges(float* data, const std::vector<SlabRange>& ranges);
  // An all-gather with a range per rank: data[ranges[q]] of rank q goes to every rank's data
  // (device, in place). One grouped broadcast per range. `data` may be a slab with scratch
  // holes (cuda/slab.cu): NCCL's rings forward from their own buffers, never from a receive
  // buffer, as long as the buffers are not registered with NCCL.
  void broadcast_ranges(float* data, const std::vector<SlabRange>& ranges);

  // The two reductions above beside the work on the default stream (gradients reduced while
  // backward computes): queued on the group's own stream, each behind the default stream's
  // work queued so far. join() makes the default stream's later work wait for all of them.
  void allreduce_mean_beside(float* data, int64_t n);
  void reduce_mean_to_ranges_beside(float* data, const std::vector<SlabRange>& ranges);
  void join();
  // An all-gather (block per rank) and a reduce-scatter (sum, block per rank) beside the
  // default stream, as above, each returning a ticket: join(ticket) makes the default stream's
  // later work wait for that collective and those queued beside before it (context
  // parallelism's exchanges, which the other slot's work overlaps).
  int64_t all_gather_beside(const float* send, float* recv, int64_t block);
  int64_t reduce_scatter_beside(const float* send, float* recv, int64_t block);
  void join(int64_t ticket);

  // The collectives `foundry bench comm --device cuda` times (bench/comm_bench.h), fp32 on
  // device buffers, in the shapes of the Communicator's: all-reduce (sum) of `count`
  // elements; reduce-scatter (sum) and all-gather of `block` elements per rank; broadcast of
  // `count` from `root`, in place; all-to-all of `block` elements per pair of ranks (grouped
  // sends and receives). Each is queued on the default stream; synchronize() waits for it.
  void all_reduce(const float* send, float* recv, int64_t count);
  void reduce_scatter(const float* send, float* recv, int64_t block);
  void all_gather(const float* send, float* recv, int64_t block);
  void broadcast(float* data, int64_t count, int root);
  void all_to_all(const float* send, float* recv, int64_t block);
  // An all-to-all of blocks contiguous per peer in rank order, counts in elements per peer
  // (send_counts[p] to rank p, recv_counts[p] from it): grouped sends and receives.
  void all_to_all_v(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                    const std::vector<int64_t>& recv_counts);
  void synchronize();
  // Gives the communicator up at once (ncclCommAbort: local, it waits for no peer), for an error
  // path: a collective in flight may wait for a peer that will never join it, and the device
  // memory freed after it (cudaFree waits for the whole GPU) would wait too. Nothing may use
  // the group after it.
  void abort();

 private:
  int rank_ = 0, size_ = 1;
  void* comm_ = nullptr;  // ncclComm_t
  // The group's own stream (cudaStream_t) and the events (cudaEvent_t) that order it against
  // the default stream, made at the first *_beside call.
  void* side_ = nullptr;
  void* queued_ = nullptr;
  void* side_done_ = nullptr;
  // The group's stream, behind the default stream's work queued so far.
  void* side_stream();
  // Events (cudaEvent_t) recorded on the group's stream after the ticketed collectives, a ring
  // of them: a ticket whose event was recorded again since is joined later than it needs, never
  // too early (the stream runs its work in order).
  static constexpr int kMarks = 8;
  void* marks_[kMarks] = {};
  int64_t tickets_ = 0;
  int64_t mark_side();
  int exceptions_ = 0;    // uncaught at construction
};

}  // namespace foundry::gpu
