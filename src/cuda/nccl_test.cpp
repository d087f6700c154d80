// NCCL groups on the GPU (suite Gpu*, skipped where no GPU is visible or the build has no
// NCCL). One GPU holds one rank of a group (NCCL refuses two), so a machine with one GPU
// checks a group of one: its mean is its own data, bit for bit, and a large buffer goes
// through whole.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "cuda/nccl.h"
#include "cuda/runtime.h"
#include "cuda/test_support.h"

namespace foundry {
namespace {

using gpu::testing::randn;
using gpu::testing::to_device;
using gpu::testing::to_host;

TEST(GpuNccl, AGroupOfOneAveragesToItsOwnData) {
  SKIP_WITHOUT_GPU();
  if (!gpu::built_with_nccl()) GTEST_SKIP() << "this build has no NCCL";
  int shared = 0;
  gpu::NcclGroup group(0, 1, [&](void*, size_t) { ++shared; });
  EXPECT_EQ(shared, 1);  // the id goes through the caller's broadcast, even for one rank
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{3} << 20}) {
    const std::vector<float> x = randn(n, 5);
    gpu::DeviceBuffer d = to_device(x);
    group.allreduce_mean(d.as<float>(), n);
    EXPECT_EQ(to_host<float>(d, n), x) << n;
  }
}

TEST(NcclBuild, AGroupWithoutNcclIsAClearError) {
  if (gpu::built_with_nccl()) GTEST_SKIP() << "this build has NCCL";
  try {
    gpu::NcclGroup group(0, 1, [](void*, size_t) {});
    FAIL() << "opening a group without NCCL did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without NCCL"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace foundry
