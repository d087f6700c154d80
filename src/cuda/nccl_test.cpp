// NCCL groups on the GPU (suite Gpu*, skipped where no GPU is visible or the build has no
// NCCL). One GPU holds one rank of a group (NCCL refuses two), so a machine with one GPU
// checks a group of one: its mean is its own data, bit for bit, a large buffer goes through
// whole, and the collectives beside the default stream are ordered against it.
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

// Context parallelism's collectives beside the default stream: each sees what the default
// stream's work queued before it left (here a copy over its input), and after join(ticket) the
// default stream's later work (the copy to the host) sees its result. Of one rank, an
// all-gather and a reduce-scatter (sum) are copies, and so is an all-to-all with one block.
TEST(GpuNccl, AGroupOfOneGathersAndScattersBesideTheDefaultStream) {
  SKIP_WITHOUT_GPU();
  if (!gpu::built_with_nccl()) GTEST_SKIP() << "this build has no NCCL";
  gpu::NcclGroup group(0, 1, [](void*, size_t) {});
  const int64_t n = int64_t{3} << 20, bytes = n * static_cast<int64_t>(sizeof(float));
  for (int round = 0; round < 3; ++round) {  // the tickets' events are reused
    const std::vector<float> stale = randn(n, 9 + round), fresh = randn(n, 19 + round);
    gpu::DeviceBuffer in = to_device(stale), queued = to_device(fresh);
    gpu::DeviceBuffer gathered(bytes), scattered(bytes), exchanged(bytes);
    gpu::copy_on_device(in.as<float>(), queued.as<float>(), bytes);
    const int64_t g = group.all_gather_beside(in.as<float>(), gathered.as<float>(), n);
    const int64_t r = group.reduce_scatter_beside(in.as<float>(), scattered.as<float>(), n);
    EXPECT_LT(g, r);
    group.join(r);  // and so the gather before it
    EXPECT_EQ(to_host<float>(gathered, n), fresh) << "round " << round;
    EXPECT_EQ(to_host<float>(scattered, n), fresh) << "round " << round;
    group.all_to_all_v(in.as<float>(), {n}, exchanged.as<float>(), {n});
    EXPECT_EQ(to_host<float>(exchanged, n), fresh) << "round " << round;
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
