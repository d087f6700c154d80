// Multi-rank tests of comm/ (ctest runs them under mpirun at 2, 3 and 4 ranks).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace foundry

int main(int argc, char** argv) { return foundry::mpi_test_main(argc, argv, &foundry::g_world); }
