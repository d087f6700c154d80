#include "model/expert_parallel.h"

#include <algorithm>

#include <cstring>
#include <span>

#include "base/error.h"

namespace foundry {
namespace {

std::string rank_label(int rank, int size) {
  return rank >= 0 ? fmt::format("expert parallel (rank {} of {})", rank, size)
                   : fmt::format("expert parallel ({} ranks)", size);
}

}  // namespace

// ---- ExpertSharding -----------------------------------------------------------------------

ExpertSharding::ExpertSharding(int64_t n_experts, int ep_size, int rank)
    : n_experts_(n_experts), ep_size_(ep_size) {
  if (ep_size < 1)
    fail(fmt::format("{}: the expert-parallel size must be at least 1, got {}",
                     rank_label(rank, ep_size), ep_size));
  if (n_experts < 1)
    fail(fmt::format("{}: the model has {} experts", rank_label(rank, ep_size), n_experts));
  if (n_experts % ep_size != 0)
    fail(fmt::format("{}: {} experts cannot be sharded over {} ranks ({} is not a multiple of "
                     "{})",
                     rank_label(rank, ep_size), n_experts, ep_size, n_experts, ep_size),
         "choose an expert-parallel size that divides model.n_experts");
}

int ExpertSharding::owner(int64_t expert) const {
  FOUNDRY_CHECK(expert >= 0 && expert < n_experts_);
  return static_cast<int>(expert / experts_per_rank());
}

int64_t ExpertSharding::first_expert(int ep_rank) const {
  FOUNDRY_CHECK(ep_rank >= 0 && ep_rank < ep_size_);
  return ep_rank * experts_per_rank();
}

int ExpertSharding::owner(const ParamInfo& p) const {
  if (p.kind != ParamKind::expert) return -1;
  return owner(p.expert);
}

// ---- process groups -----------------------------------------------------------------------

SlabRanges unowned_expert_ranges(const ParamTable& table, const ExpertSharding& sharding,
                                 int ep_rank) {
  SlabRanges ranges;
  for (const ParamInfo& p : table.params()) {
    const int owner = sharding.owner(p);
    if (owner < 0 || owner == ep_rank) continue;
    const int64_t end = (p.offset + p.numel + 15) / 16 * 16;  // with its alignment padding
    if (!ranges.empty() && ranges.back().end >= p.offset)
      ranges.back().end = std::max(ranges.back().end, end);
    else
      ranges.push_back({p.offset, end});
  }
  if (!ranges.empty())
    ranges.back().end = std::min(ranges.back().end, table.total_elements());
  return ranges;
}

std::vector<SlabRanges> unowned_expert_ranges_by_rank(
    const ParamTable& table, const ExpertSharding& sharding, int ranks) {
  std::vector<SlabRanges> by_ep_rank, by_rank;
  for (int p = 0; p < sharding.ep_size(); ++p)
    by_ep_rank.push_back(unowned_expert_ranges(table, sharding, p));
  for (int r = 0; r < ranks; ++r) by_rank.push_back(by_ep_rank[r % sharding.ep_size()]);
  return by_rank;
}

ExpertParallelGroups split_expert_parallel(const Communicator& world, int ep_size) {
  const int W = world.size();
  // Every rank sees the same W and ep_size, so every rank fails here alike and none is left
  // waiting in the splits below.
  if (ep_size < 1 || ep_size > W || W % ep_size != 0)
    fail(fmt::format("{}: an expert-parallel size of {} does not divide the {} ranks of the job",
                     rank_label(world.rank(), W), ep_size, W),
         "choose an expert-parallel size that divides the number of ranks (the data-parallel "
         "size is ranks / expert-parallel size)");
  // Consecutive ranks form an EP group: with ranks placed by node, the all-to-all traffic,
  // the heaviest of the step, stays inside a node whenever P ≤ ranks per node.
  Communicator expert = world.split(world.rank() / ep_size, world.rank());
  Communicator replicas = world.split(world.rank() % ep_size, world.rank());
  return {std::move(expert), std::move(replicas)};
}

// ---- ExpertExchange -----------------------------------------------------------------------

void ExpertExchange::plan(const Communicator& ep, const ExpertSharding& sharding,
                          const int64_t* offsets) {
  comm_ = nullptr;  // a plan that fails half way is no plan
  const int P = ep.size(), me = ep.rank();
  const int64_t E = sharding.n_experts(), El = sharding.experts_per_rank();
  if (sharding.ep_size() != P)
    fail(fmt::format("{}: the experts are sharded over {} ranks, the group has {}",
                     rank_label(me, P), sharding.ep_size(), P));
  // The origin layout must be a valid sort by expert; a bad one would send garbage counts
  // to every peer, so it is caught here, before any communication.
  if (offsets[0] != 0)
    fail(fmt::format("{}: routed rows start at offset {}, expected 0", rank_label(me, P),
                     offsets[0]));
  std::vector<int64_t> counts(E);
  for (int64_t e = 0; e < E; ++e) {
    counts[e] = offsets[e + 1] - offsets[e];
    if (counts[e] < 0)
      fail(fmt::format("{}: expert offsets decrease at expert {} ({} → {})", rank_label(me, P), e,
                       offsets[e], offsets[e + 1]));
  }
  origin_rows_ = offsets[E];

  // counts is already P blocks of El (owner p's experts are block p), so it is the
  // alltoall's send buffer as it is. recv_rows_[i·El + j]: rows source i sends to local
  // expert j.
  recv_rows_.assign(P * El, 0);
  ep.alltoall(counts.data(), recv_rows_.data(), static_cast<size_t>(El));

  send_rows_.assign(P, 0);
  for (int p = 0; p < P; ++p)
    send_rows_[p] = offsets[(p + 1) * El] - offsets[p * El];

  // Expert-major local layout: expert j's block holds its sources in rank order.
  local_offsets_.assign(El + 1, 0);
  for (int64_t j = 0; j < El; ++j) {
    int64_t rows = 0;
    for (int i = 0; i < P; ++i) {
      const int64_t r = recv_rows_[i * El + j];
      if (r < 0)
        fail(fmt::format("{}: rank {} announced {} rows for local expert {}", rank_label(me, P),
                         i, r, j));
      rows += r;
    }
    local_offsets_[j + 1] = local_offsets_[j] + rows;
  }
  // Block (i, j) sits in the wire layout after everything rank i' < i sent and after
  // rank i's rows for experts j' < j; in the local layout after experts j' < j and after
  // expert j's rows from ranks i' < i.
  wire_start_.assign(P * El, 0);
  local_start_.assign(P * El, 0);
  std::vector<int64_t> next_local(local_offsets_.begin(), local_offsets_.end() - 1);
  int64_t wire = 0;
  for (int i = 0; i < P; ++i) {
    for (int64_t j = 0; j < El; ++j) {
      wire_start_[i * El + j] = wire;
      local_start_[i * El + j] = next_local[j];
      wire += recv_rows_[i * El + j];
      next_local[j] += recv_rows_[i * El + j];
    }
  }
  comm_ = &ep;
}

void ExpertExchange::require_planned(const char* what) const {
  if (!comm_)
    fail(fmt::format("expert parallel: {} without a plan", what),
         "call ExpertExchange::plan with this layer's routing first");
}

// alltoallv takes element counts: rows × width, per peer, for the dispatch direction
// (send_elems_ to owners, recv_elems_ from sources); combine uses them swapped.
void ExpertExchange::element_counts(int64_t width) {
  const int P = comm_->size();
  const int64_t El = local_experts();
  send_elems_.assign(P, 0);
  recv_elems_.assign(P, 0);
  for (int i = 0; i < P; ++i) {
    send_elems_[i] = send_rows_[i] * width;
    int64_t rows = 0;
    for (int64_t j = 0; j < El; ++j) rows += recv_rows_[i * El + j];
    recv_elems_[i] = rows * width;
  }
}

void ExpertExchange::copy_blocks(const float* from, float* to, int64_t width, bool wire_to_local,
                                 const Copy& copy) const {
  const std::vector<int64_t>& from_start = wire_to_local ? wire_start_ : local_start_;
  const std::vector<int64_t>& to_start = wire_to_local ? local_start_ : wire_start_;
  for (size_t b = 0; b < recv_rows_.size(); ++b)
    if (recv_rows_[b] > 0)
      copy(to + to_start[b] * width, from + from_start[b] * width, recv_rows_[b] * width);
}

ExpertExchange::Move ExpertExchange::mpi_move() const {
  return [this](const float* send, const std::vector<int64_t>& send_counts, float* recv,
                const std::vector<int64_t>& recv_counts) {
    comm_->alltoallv(send, std::span<const int64_t>(send_counts), recv,
                     std::span<const int64_t>(recv_counts));
  };
}

namespace {
void host_copy(float* to, const float* from, int64_t elements) {
  std::memcpy(to, from, static_cast<size_t>(elements) * sizeof(float));
}
}  // namespace

void ExpertExchange::dispatch(const float* origin, float* local, int64_t width,
                              std::vector<float>& wire) {
  require_planned("dispatch");
  wire.resize(static_cast<size_t>(local_rows() * width));
  dispatch(origin, local, width, wire.data(), mpi_move(), host_copy);
}

void ExpertExchange::combine(const float* local, float* origin, int64_t width,
                             std::vector<float>& wire) {
  require_planned("combine");
  wire.resize(static_cast<size_t>(local_rows() * width));
  combine(local, origin, width, wire.data(), mpi_move(), host_copy);
}

void ExpertExchange::dispatch(const float* origin, float* local, int64_t width, float* wire,
                              const Move& move, const Copy& copy) {
  require_planned("dispatch");
  element_counts(width);
  move(origin, send_elems_, wire, recv_elems_);
  copy_blocks(wire, local, width, /*wire_to_local=*/true, copy);
}

void ExpertExchange::combine(const float* local, float* origin, int64_t width, float* wire,
                             const Move& move, const Copy& copy) {
  require_planned("combine");
  element_counts(width);
  copy_blocks(local, wire, width, /*wire_to_local=*/false, copy);
  // The reverse of the dispatch: what came from source i goes back to it, and rank p's
  // reply lands where this rank's rows for p's experts were.
  move(wire, recv_elems_, origin, send_elems_);
}

// ---- router statistics --------------------------------------------------------------------

void sum_router_counts(const Communicator& comm, std::vector<int64_t>& counts) {
  // Agree on the length first: ranks that disagree (different model configs) would
  // otherwise sum unrelated entries or fail inside MPI with a less helpful message.
  const int64_t n = static_cast<int64_t>(counts.size());
  int64_t extremes[2] = {n, -n};
  comm.allreduce(extremes, extremes, 2, ReduceOp::max);
  if (extremes[0] != n || -extremes[1] != n)
    fail(fmt::format("router statistics on rank {} of {} hold {} counts, other ranks between {} "
                     "and {}",
                     comm.rank(), comm.size(), n, -extremes[1], extremes[0]),
         "every rank must run the same model config");
  comm.allreduce(counts.data(), counts.data(), counts.size(), ReduceOp::sum);
}

}  // namespace foundry
