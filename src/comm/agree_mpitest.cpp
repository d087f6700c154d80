// Multi-rank tests of comm/ (ctest runs them under mpirun at 2, 3 and 4 ranks).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "base/format.h"
#include "base/test_expect_error.h"
#include "comm/agree.h"
#include "comm/comm.h"
#include "comm/mpi_test_main.h"

namespace foundry {

Communicator* g_world = nullptr;

namespace {

Communicator& world() { return *g_world; }

TEST(RanksAgree, EqualValuesGiveNoRanks) {
  const int64_t values[3] = {7, -1, int64_t{1} << 40};
  std::vector<int64_t> gathered;
  EXPECT_TRUE(ranks_differing_from_root(world(), values, &gathered).empty());
  ASSERT_EQ(gathered.size(), 3u * static_cast<size_t>(world().size()));
  for (int r = 0; r < world().size(); ++r) EXPECT_EQ(gathered[3 * r + 2], int64_t{1} << 40);
}

TEST(RanksAgree, EveryRankLearnsWhichRanksDiffer) {
  // Odd ranks differ from rank 0 in their second value: every rank gets the same list.
  const int me = world().rank();
  const int64_t values[2] = {5, me % 2 == 1 ? 100 + me : 0};
  const std::vector<int> differ = ranks_differing_from_root(world(), values);
  std::vector<int> expected;
  for (int r = 1; r < world().size(); r += 2) expected.push_back(r);
  EXPECT_EQ(differ, expected);
  EXPECT_EQ(format_rank_list({1, 3}), "1, 3");
}

TEST(RanksAgree, StringsOfEveryLengthReachEveryRank) {
  // Rank r sends r·5 bytes (rank 0 an empty string), including a zero byte.
  const int me = world().rank();
  std::string mine(static_cast<size_t>(5 * me), 'a');
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<char>('a' + (i + me) % 26);
  if (!mine.empty()) mine[0] = '\0';
  const std::vector<std::string> all = allgather_strings(world(), mine);
  ASSERT_EQ(all.size(), static_cast<size_t>(world().size()));
  for (int r = 0; r < world().size(); ++r) {
    ASSERT_EQ(all[r].size(), static_cast<size_t>(5 * r));
    for (size_t i = 1; i < all[r].size(); ++i) EXPECT_EQ(all[r][i], 'a' + (i + r) % 26);
  }
}

TEST(RanksAgree, EveryRankCountsItsHostsRanks) {
  // ctest starts every rank on this machine.
  EXPECT_EQ(ranks_on_this_host(world()), world().size());
}

TEST(RanksAgree, EveryRankRefusesWhenOneRanksBudgetIsShort) {
  // 1 MiB per rank; the last rank alone has less than its host's ranks need. Every rank must
  // throw the same error, naming the last rank's figures.
  const int ranks = world().size();
  const MemoryNeed need{"training", {{"weights", 1 << 20}}};
  const int64_t enough = int64_t{ranks} << 20;
  const bool last = world().rank() == ranks - 1;
  const MemoryBudget mine{last ? BudgetSource::cgroup_v2 : BudgetSource::meminfo,
                          last ? enough - 1 : enough};
  const auto hint = [](const MemoryNeed& n, const MemoryBudget&) {
    return fmt::format("{} ranks", n.processes);
  };
  expect_error([&] { check_memory_on_every_host(world(), need, mine, hint); },
               fmt::format("training needs about 1.0 MiB per process (weights 1.0 MiB) × {} ranks "
                           "on this host, but this process may use {} (cgroup memory.max)",
                           ranks, format_bytes(double(enough - 1), 1)));
  try {
    check_memory_on_every_host(world(), need, mine, hint);
  } catch (const Error& e) {
    EXPECT_TRUE(e.hint().starts_with(fmt::format("{} ranks;", ranks))) << e.hint();
  }
  EXPECT_NO_THROW(check_memory_on_every_host(world(), need, {BudgetSource::meminfo, enough}, hint));
  EXPECT_NO_THROW(check_memory_on_every_host(world(), need, {BudgetSource::off, 0}, hint));
}

// A rank that fails on its own, with an operation pending that the others have not joined:
// destroying the request while the error unwinds must not wait for them (which could be
// forever, and would keep the error from being printed). Rank 1 says it got past the
// destructor before rank 0 joins the operation; a destructor that waited would never get there.
TEST(PendingRequest, DestroyedByAnErrorDoesNotWaitForTheOtherRanks) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int me = world().rank();
  int64_t got_past = 0;
  if (me == 1) {
    try {
      Request pending = world().ibarrier();
      throw std::runtime_error("this rank's own failure");
    } catch (const std::runtime_error&) {
      got_past = 1;
    }
    world().isend(&got_past, 1, 0, 7).wait();
  } else if (me == 0) {
    Request message = world().irecv(&got_past, 1, 1, 7);
    for (int i = 0; i < 600 && !message.test(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(message.done()) << "rank 1 is still inside the request's destructor after 30 s";
    if (!message.done()) std::abort();  // its ibarrier would never be joined: end the job
    EXPECT_EQ(got_past, 1);
  }
  // Every rank joins rank 1's barrier now (rank 1's request was left, not cancelled: it
  // completes here, under MPI's progress on rank 1's next calls).
  if (me != 1) world().ibarrier().wait();
  world().barrier();
}

}  // namespace
}  // namespace foundry

int main(int argc, char** argv) { return foundry::mpi_test_main(argc, argv, &foundry::g_world); }
