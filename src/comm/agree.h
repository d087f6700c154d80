// Checks that every rank of a communicator holds the same values before they are relied on
// (a run config's hash, a parameter table's fingerprint): all ranks get the same answer, so
// they can fail together with one message naming the ranks that differ.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "base/memory_budget.h"

namespace foundry {

class Communicator;

// Collective: every rank passes `mine` (the same count on every rank). Returns the ranks
// whose values differ from rank 0's, in increasing order, the same list on every rank;
// `gathered` (optional) receives every rank's values, rank after rank.
std::vector<int> ranks_differing_from_root(const Communicator& comm, std::span<const int64_t> mine,
                                           std::vector<int64_t>* gathered = nullptr);

// Collective: every rank's string, in rank order, on every rank (small messages: a status,
// a description of what a rank wrote).
std::vector<std::string> allgather_strings(const Communicator& comm, const std::string& mine);

// Collective: how many ranks of `comm` run on this rank's host (and share its memory).
int ranks_on_this_host(const Communicator& comm);
// Collective: this rank's place among the ranks of `comm` on its host (0 .. that count − 1).
int rank_on_this_host(const Communicator& comm);

// Collective: check_memory on every rank at once, with `need` (per process) times the ranks
// on that rank's host against that rank's `budget`. Every rank gets the same verdict and, when
// some host lacks the memory, fails with the same error: the figures of the lowest such rank,
// and `hint` called with them.
using MemoryHint = std::function<std::string(const MemoryNeed& need, const MemoryBudget& budget)>;
void check_memory_on_every_host(const Communicator& comm, MemoryNeed need,
                                const MemoryBudget& budget, const MemoryHint& hint);

// "1, 3": ranks for a message.
std::string format_rank_list(const std::vector<int>& ranks);

}  // namespace foundry
