#include "comm/agree.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "comm/comm.h"

namespace foundry {

std::vector<int> ranks_differing_from_root(const Communicator& comm, std::span<const int64_t> mine,
                                           std::vector<int64_t>* gathered) {
  const size_t n = mine.size();
  std::vector<int64_t> all(n * static_cast<size_t>(comm.size()));
  comm.allgather(mine.data(), all.data(), n);
  std::vector<int> differ;
  for (int r = 1; r < comm.size(); ++r)
    if (!std::equal(all.begin(), all.begin() + n, all.begin() + r * n)) differ.push_back(r);
  if (gathered) *gathered = std::move(all);
  return differ;
}

std::vector<std::string> allgather_strings(const Communicator& comm, const std::string& mine) {
  // Bytes travel as int64 words (the element types the communicator carries).
  const int ranks = comm.size();
  const int64_t length = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lengths(static_cast<size_t>(ranks));
  comm.allgather(&length, lengths.data(), 1);
  std::vector<int64_t> words(static_cast<size_t>(ranks)), offsets(static_cast<size_t>(ranks) + 1);
  for (int r = 0; r < ranks; ++r) {
    words[r] = (lengths[r] + 7) / 8;
    offsets[r + 1] = offsets[r] + words[r];
  }
  std::vector<int64_t> buffer(static_cast<size_t>(offsets[ranks]));
  std::memcpy(buffer.data() + offsets[comm.rank()], mine.data(), mine.size());
  comm.allgatherv_in_place(buffer.data(), words);
  std::vector<std::string> all;
  for (int r = 0; r < ranks; ++r)
    all.emplace_back(reinterpret_cast<const char*>(buffer.data() + offsets[r]),
                     static_cast<size_t>(lengths[r]));
  return all;
}

namespace {

// The ranks of `comm` on this rank's host (that share its memory), in `comm`'s order.
Communicator host_ranks(const Communicator& comm) {
  MPI_Comm shared = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm.native(), MPI_COMM_TYPE_SHARED, comm.rank(), MPI_INFO_NULL,
                                &shared),
            "MPI_Comm_split_type", comm.native());
  return Communicator(shared, /*owned=*/true);
}

}  // namespace

int ranks_on_this_host(const Communicator& comm) { return host_ranks(comm).size(); }

int rank_on_this_host(const Communicator& comm) { return host_ranks(comm).rank(); }

void check_memory_on_every_host(const Communicator& comm, MemoryNeed need,
                                const MemoryBudget& budget, const MemoryHint& hint) {
  // Ranks read their budgets at slightly different moments: deciding from everyone's figures
  // gives every rank the same answer, so none enters a collective that the others left.
  const int64_t mine[3] = {ranks_on_this_host(comm), static_cast<int64_t>(budget.source),
                           budget.bytes};
  std::vector<int64_t> all(3 * static_cast<size_t>(comm.size()));
  comm.allgather(mine, all.data(), 3);
  bool one_host = true;
  for (int r = 0; r < comm.size(); ++r) one_host = one_host && all[3 * r] == comm.size();
  for (int r = 0; r < comm.size(); ++r) {
    need.processes = static_cast<int>(all[3 * r]);
    const MemoryBudget theirs{static_cast<BudgetSource>(all[3 * r + 1]), all[3 * r + 2]};
    if (!fits(need, theirs))
      fail(
          memory_shortfall(need, theirs, one_host ? "this host" : fmt::format("rank {}'s host", r)),
          memory_hint(hint(need, theirs)));
  }
}

std::string format_rank_list(const std::vector<int>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

}  // namespace foundry
