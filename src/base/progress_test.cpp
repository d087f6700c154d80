#include "base/progress.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace foundry {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ElapsedTicker, SaysTheTimeTakenUntilItEnds) {
  testing::internal::CaptureStderr();
  {
    ElapsedTicker ticker("waiting on a library", 0.05);
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
  }
  const std::string mid = testing::internal::GetCapturedStderr();
  // A log (captured, stderr is a file): a line per interval while it lives.
  EXPECT_GE(count(mid, "waiting on a library: "), 2u) << mid;
  EXPECT_NE(mid.find(" s so far\n"), std::string::npos) << mid;
  testing::internal::CaptureStderr();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");  // nothing once it ended
  testing::internal::CaptureStderr();
  { ElapsedTicker quick("quick", 30); }  // ends at once, before its first tick
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace foundry
