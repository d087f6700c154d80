#include "comm/agree.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

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

std::string format_rank_list(const std::vector<int>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

}  // namespace foundry
