#include "comm/agree.h"

#include <fmt/format.h>

#include <algorithm>

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

std::string format_rank_list(const std::vector<int>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

}  // namespace foundry
