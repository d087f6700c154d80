#include "base/device.h"

#include <gtest/gtest.h>

#include "base/test_expect_error.h"

namespace foundry {
namespace {

TEST(Device, ParsesCpuCudaAndAnIndex) {
  EXPECT_FALSE(parse_device("--device", "cpu").cuda);
  const DeviceSpec first = parse_device("--device", "cuda");
  EXPECT_TRUE(first.cuda);
  EXPECT_EQ(first.index, 0);
  const DeviceSpec third = parse_device("--device", "cuda:2");
  EXPECT_TRUE(third.cuda);
  EXPECT_EQ(third.index, 2);
  EXPECT_EQ(third.name(), "cuda:2");
  EXPECT_EQ(parse_device("--device", "cpu").name(), "cpu");
}

TEST(Device, RejectsAnythingElseNamingTheFlag) {
  for (const char* bad : {"gpu", "CUDA", "cuda:", "cuda:-1", "cuda:1x", "cuda:x", "", "rocm"})
    expect_error([&] { parse_device("train.device", bad); }, "train.device '");
}

}  // namespace
}  // namespace foundry
