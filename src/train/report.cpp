#include "train/report.h"

#include <sys/resource.h>

#include <fmt/format.h>

#include "base/format.h"
#include "comm/comm.h"

namespace foundry {

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

void GradientCommTotals::add(const GradientReduceStats& s) {
  ++steps;
  exposed += s.exposed_seconds;
  in_backward += s.in_backward_seconds;
  collectives += static_cast<double>(s.collectives);
  started_in_backward += static_cast<double>(s.started_in_backward);
  elements_in_backward += static_cast<double>(s.elements_in_backward);
}

std::string GradientCommTotals::describe(int64_t slab_elements) const {
  const double n = static_cast<double>(steps);
  return fmt::format(
      "gradient reduction per step ({} steps): {:.1f} buckets, {:.1f} started during "
      "backward carrying {:.0f}% of the slab; {:.1f} ms starting and polling inside backward, "
      "{:.1f} ms exposed after it",
      steps, collectives / n, started_in_backward / n,
      100 * elements_in_backward / n / static_cast<double>(slab_elements), 1e3 * in_backward / n,
      1e3 * exposed / n);
}

std::vector<RankMemory> gather_rank_memory(const Communicator* world, const RankMemory& mine) {
  if (!world) return {mine};
  const double values[2] = {mine.rss_bytes, mine.slab_bytes};
  std::vector<double> all(2 * static_cast<size_t>(world->size()));
  world->allgather(values, all.data(), 2);
  std::vector<RankMemory> ranks(static_cast<size_t>(world->size()));
  for (size_t r = 0; r < ranks.size(); ++r) ranks[r] = {all[2 * r], all[2 * r + 1]};
  return ranks;
}

std::string format_memory_line(double optimizer_state_bytes, const std::string& layout,
                               const std::vector<RankMemory>& ranks, bool data_parallel) {
  // " rank 0 560 MiB, rank 1 560 MiB" (or " 560 MiB" in one process)
  auto per_rank = [&](double RankMemory::*field) {
    std::string out;
    for (size_t r = 0; r < ranks.size(); ++r) {
      const std::string mib = format_bytes(ranks[r].*field, ByteUnit::MiB, 0);
      out += data_parallel ? fmt::format("{} rank {} {}", r ? "," : "", r, mib) : " " + mib;
    }
    return out;
  };
  return fmt::format(
      "memory per rank: optimizer state {}{} | weight and gradient slabs{} | peak RSS "
      "before the final checkpoint{}",
      format_bytes(optimizer_state_bytes, ByteUnit::MiB, 1),
      data_parallel ? " (" + layout + ")" : "",
      per_rank(&RankMemory::slab_bytes), per_rank(&RankMemory::rss_bytes));
}

std::string format_op_breakdown(const OpTimes& times, int64_t steps) {
  double total = 0;
  for (const auto& [op, s] : times.seconds()) total += s;
  std::string out = fmt::format("\nper-operation time (mean per step over {} steps):\n", steps);
  for (const auto& [op, s] : times.seconds())
    out += fmt::format("  {:<34} {:8.2f} ms  {:5.1f}%\n", op, 1e3 * s / steps, 100 * s / total);
  out += fmt::format("  {:<34} {:8.2f} ms\n", "total", 1e3 * total / steps);
  return out;
}

}  // namespace foundry
