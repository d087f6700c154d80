// Expert parallelism (EP): the experts of every MoE layer sharded over a group of P ranks,
// each routed token row sent to the rank that owns its expert and the expert's output sent
// back. docs/expert-parallel.md has the design, the process layouts and the byte counts.
//
// Ownership. With E experts and P | E, EP rank p owns the El = E/P consecutive experts
// [p·El, (p+1)·El): expert e lives on EP rank e / El.
//
// One MoE layer. The rows a rank routed (every token it holds, once per chosen expert) sit
// sorted by expert with `offsets` over all E experts, exactly as moe_dispatch_plan leaves
// them (kernels/ops.h), so nothing changes before the exchange:
//
//   forward   plan(offsets)          alltoall, El int64 per peer: who sends how many rows
//             dispatch(xs → local)   alltoallv, rows · C floats
//             experts on local rows  (Experts, model/experts.h, over the El local experts)
//             combine(local → ys)    alltoallv, rows · C floats
//   backward  dispatch(dys → local)  the plan of the same step's forward is reused
//             expert backward on local rows
//             combine(dxs → origin)
//
// Buffer layouts (W floats per row: C for xs, ys, dys and dxs):
//
//   origin  [R, W]  this rank's routed rows, sorted by expert: expert e's rows are
//                   [offsets[e], offsets[e+1]), R = offsets[E]. Owners hold consecutive
//                   experts, so the rows for owner p are the single contiguous block
//                   [offsets[p·El], offsets[(p+1)·El]) and the origin buffer is the send
//                   buffer as it is. Rows from offsets[E] on (the ZAYA1 skip class) are
//                   neither sent nor written.
//   wire    [L, W]  what the dispatch's alltoallv delivers: the block from EP rank 0, then
//                   rank 1, ...; each block in its sender's order, i.e. by local expert.
//   local   [L, W]  expert-major: local expert j's rows are [local_offsets[j],
//                   local_offsets[j+1]) and, inside them, come from EP rank 0 first, then
//                   rank 1, ..., each source's rows in the source's own order (token order,
//                   since moe_dispatch_plan is stable). L = local_offsets[El].
//
// dispatch permutes wire → local after the transfer, combine permutes local → wire before
// it; both move whole (source, expert) blocks. The combine's alltoallv is the dispatch's
// with sends and receives swapped, so every row returns to the position it left from.
// Every order above is fixed by the routing alone, so results are bitwise repeatable for a
// given process layout.
//
// Errors in the layout or the routing are foundry::Error naming the EP rank and the cause.
// The exchanges are collective: every rank of the group must plan, dispatch and combine the
// same layers in the same order (a rank that skips one leaves the others waiting in MPI).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "base/slab_range.h"
#include "comm/comm.h"
#include "model/params.h"

namespace foundry {

// Which EP rank owns which expert: arithmetic only, no MPI.
class ExpertSharding {
 public:
  // Fails unless ep_size ≥ 1 and ep_size divides n_experts. `rank`, when ≥ 0, is the EP
  // rank named in the message.
  ExpertSharding(int64_t n_experts, int ep_size, int rank = -1);

  int64_t n_experts() const { return n_experts_; }
  int ep_size() const { return ep_size_; }
  int64_t experts_per_rank() const { return n_experts_ / ep_size_; }
  // The EP rank that owns `expert` (0 ≤ expert < n_experts).
  int owner(int64_t expert) const;
  // The first expert of EP rank `ep_rank`; it owns [first_expert, first_expert + El).
  int64_t first_expert(int ep_rank) const;
  // The EP rank whose experts include tensor `p`, or -1 when `p` is not sharded by expert
  // parallelism (every tensor other than ParamKind::expert ones).
  int owner(const ParamInfo& p) const;

 private:
  int64_t n_experts_;
  int ep_size_;
};

// The slab ranges [begin, end) of the expert tensors EP rank `ep_rank` does not own, merged
// (an expert's tensors and the padding after each follow one another), sorted.
SlabRanges unowned_expert_ranges(const ParamTable& table,
                                                               const ExpertSharding& sharding,
                                                               int ep_rank);
// The same for every rank of a job of `ranks` ranks in EP groups of sharding.ep_size()
// consecutive ranks (EP rank = rank % ep_size; each EP rank's list computed once).
std::vector<SlabRanges> unowned_expert_ranges_by_rank(
    const ParamTable& table, const ExpertSharding& sharding, int ranks);

// The process groups of a DP × EP layout of `world` (W ranks, P = ep_size, D = W/P):
//   expert    EP group: the P consecutive world ranks [g·P, (g+1)·P), g = rank / P, with
//             EP rank = rank % P. The token exchanges run here.
//   replicas  the D ranks with the same EP rank (rank % P), one per EP group: the ranks
//             that own the same experts. Their expert gradients are what a data-parallel
//             reduction of the expert tensors has to sum (docs/expert-parallel.md).
// Collective over `world` (two Communicator::split). Fails on every rank, before any
// communication, unless 1 ≤ ep_size ≤ W and ep_size divides W.
struct ExpertParallelGroups {
  Communicator expert;
  Communicator replicas;
};
ExpertParallelGroups split_expert_parallel(const Communicator& world, int ep_size);

// One MoE layer's exchange: planned once per forward pass from the routing, then used for
// the forward's dispatch and combine and for the same step's backward.
class ExpertExchange {
 public:
  // Collective over `ep`: exchanges the per-expert row counts (alltoall, El int64 per peer)
  // and derives every count and offset the exchanges need. `offsets` [E + 1] are the origin
  // layout's (non-decreasing, offsets[0] = 0). `sharding.ep_size()` must equal ep.size().
  // `ep` must outlive the plan's use.
  void plan(const Communicator& ep, const ExpertSharding& sharding, const int64_t* offsets);
  bool planned() const { return comm_ != nullptr; }
  // Forgets the plan (the next dispatch or combine fails until plan() runs again).
  void reset() { comm_ = nullptr; }

  // Rows this rank sends: R = offsets[E].
  int64_t origin_rows() const { return origin_rows_; }
  // Rows this rank's experts receive, from all EP ranks: L.
  int64_t local_rows() const { return local_offsets_.back(); }
  // [El + 1]: local expert j's rows in the local layout.
  const int64_t* local_offsets() const { return local_offsets_.data(); }
  int64_t local_experts() const { return static_cast<int64_t>(local_offsets_.size()) - 1; }
  // Rows EP rank `source` sent for local expert j.
  int64_t rows_from(int source, int64_t j) const {
    return recv_rows_[source * local_experts() + j];
  }
  // Rows this rank sends to EP rank `peer`.
  int64_t rows_to(int peer) const { return send_rows_[peer]; }

  // Collective. origin [R, width] → local [L, width]. `wire` is scratch (resized to L·width).
  void dispatch(const float* origin, float* local, int64_t width, std::vector<float>& wire);
  // Collective. local [L, width] → origin [R, width] (rows [0, R) written, in the origin's
  // order). `wire` is scratch (resized to L·width).
  void combine(const float* local, float* origin, int64_t width, std::vector<float>& wire);

  // The same in any memory (a device's): `move` carries, collectively over the EP group,
  // blocks of rows contiguous per peer in rank order (counts in elements per peer), and `copy`
  // copies elements within the memory that origin, local and `wire` ([L, width], the
  // caller's) are in. The two above are these with MPI's alltoallv and memcpy.
  using Move = std::function<void(const float* send, const std::vector<int64_t>& send_counts,
                                  float* recv, const std::vector<int64_t>& recv_counts)>;
  using Copy = std::function<void(float* to, const float* from, int64_t elements)>;
  void dispatch(const float* origin, float* local, int64_t width, float* wire, const Move& move,
                const Copy& copy);
  void combine(const float* local, float* origin, int64_t width, float* wire, const Move& move,
               const Copy& copy);

 private:
  void require_planned(const char* what) const;
  void element_counts(int64_t width);
  // Copies every (source i, local expert j) block of rows from the wire layout (blocks by
  // source) to the local layout (blocks by expert), or back.
  void copy_blocks(const float* from, float* to, int64_t width, bool wire_to_local,
                   const Copy& copy) const;
  Move mpi_move() const;

  const Communicator* comm_ = nullptr;
  int64_t origin_rows_ = 0;
  std::vector<int64_t> send_rows_;      // [P] rows to each EP rank
  std::vector<int64_t> recv_rows_;      // [P × El] rows from source i for local expert j
  std::vector<int64_t> local_offsets_;  // [El + 1]
  // Per (source i, local expert j), row-major like recv_rows_: where the block starts in
  // the wire layout and in the local layout.
  std::vector<int64_t> wire_start_, local_start_;
  std::vector<int64_t> send_elems_, recv_elems_;  // [P] alltoallv counts for one width
};

// Sums integer router statistics (per-expert loads, ZAYA1 class counts) element-wise over
// `comm`, in place. Exact (int64), so the result is independent of the reduction order.
// Collective; every rank must pass the same number of counts.
void sum_router_counts(const Communicator& comm, std::vector<int64_t>& counts);

}  // namespace foundry
