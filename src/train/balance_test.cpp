#include "train/balance.h"

#include <gtest/gtest.h>

namespace foundry {
namespace {

TEST(Balance, MaxLoadErrorAndSkipShareFromClassCounts) {
  // Two sublayers of 3 classes (the last the skip class), 10 assignments each.
  // Loads: 0.5 0.3 0.2 and 0.4 0.4 0.2 → errors vs 1/3: max |0.5 − 1/3| = 1/6.
  const std::vector<int64_t> counts = {5, 3, 2, 4, 4, 2};
  BalanceStats with_skip = balance_stats(counts, 3, 10, true);
  EXPECT_NEAR(with_skip.max_load_error, 0.5 - 1.0 / 3, 1e-12);
  EXPECT_NEAR(with_skip.skip_fraction, 0.2, 1e-12);
  BalanceStats without = balance_stats(counts, 3, 10, false);
  EXPECT_NEAR(without.max_load_error, 0.5 - 1.0 / 3, 1e-12);
  EXPECT_EQ(without.skip_fraction, -1);
  EXPECT_EQ(balance_stats({5, 5}, 2, 10, false).max_load_error, 0);  // perfectly balanced
}

}  // namespace
}  // namespace foundry
