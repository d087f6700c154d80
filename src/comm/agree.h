// Checks that every rank of a communicator holds the same values before they are relied on
// (a run config's hash, a parameter table's fingerprint): all ranks get the same answer, so
// they can fail together with one message naming the ranks that differ.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

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

// "1, 3": ranks for a message.
std::string format_rank_list(const std::vector<int>& ranks);

}  // namespace foundry
