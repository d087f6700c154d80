#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "base/test_expect_error.h"
#include "ckpt/checkpoint.h"
#include "ckpt/test_support.h"

namespace foundry {
namespace {

TEST(FiniteWeights, NameTheCheckpointTheFirstBadTensorAndTheCounts) {
  const ParamTable table(testing::tiny_moe_config());
  std::vector<float> params(static_cast<size_t>(table.total_elements()), 0.5f);
  EXPECT_NO_THROW(check_finite_weights("run/checkpoints/step_00000004", table, params.data()));

  // Two NaNs in the second tensor, an infinity in the last one.
  const ParamInfo& second = table.params()[1];
  const ParamInfo& last = table.params().back();
  params[second.offset + 1] = std::nanf("");
  params[second.offset + second.numel - 1] = std::nanf("");
  params[last.offset] = -std::numeric_limits<float>::infinity();
  expect_error([&] { check_finite_weights("run/checkpoints/step_00000004", table, params.data()); },
               fmt::format("checkpoint 'run/checkpoints/step_00000004' has 3 non-finite weights in "
                           "2 tensors; the first is {} (2 of its {} values)",
                           second.name, second.numel));
}

}  // namespace
}  // namespace foundry
