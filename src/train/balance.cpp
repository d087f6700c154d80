#include "train/balance.h"

#include <algorithm>
#include <cmath>

#include "kernels/zaya_router.h"

namespace foundry {

BalanceStats balance_stats(const std::vector<int64_t>& counts, int64_t classes,
                           int64_t assignments, bool skip_class) {
  BalanceStats stats;
  const int64_t layers = static_cast<int64_t>(counts.size()) / classes;
  std::vector<double> err(classes);
  double skip_sum = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t* row = counts.data() + l * classes;
    for (int64_t c = 0; c < classes; ++c)
      stats.loads.push_back(static_cast<double>(row[c]) / static_cast<double>(assignments));
    ops::zaya_load_error(err.data(), row, assignments, classes);
    for (double e : err) stats.max_load_error = std::max(stats.max_load_error, std::abs(e));
    if (skip_class) skip_sum += static_cast<double>(row[classes - 1]) / assignments;
  }
  if (skip_class && layers > 0) stats.skip_fraction = skip_sum / static_cast<double>(layers);
  return stats;
}

}  // namespace foundry
