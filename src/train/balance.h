// How evenly the ZAYA1 router spreads a step's tokens (arch zaya1).
#pragma once
#include <cstdint>
#include <vector>

namespace foundry {

// One step's balance, from its class counts [layers × classes] (each row summing to
// `assignments`; with a skip class, it is the last class).
struct BalanceStats {
  double max_load_error = 0;  // max over sublayers and classes of |load − 1/S|
  double skip_fraction = -1;  // mean over sublayers of the skip class's load (-1: no skip class)
  std::vector<double> loads;  // [sublayers × classes]: each class's share of the assignments
};

BalanceStats balance_stats(const std::vector<int64_t>& counts, int64_t classes,
                           int64_t assignments, bool skip_class);

}  // namespace foundry
