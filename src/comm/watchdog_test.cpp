#include "comm/watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace foundry {
namespace {

TEST(CommWatchdog, FiresOnceWhenAnOperationOverrunsNamingRankAndOperation) {
  std::atomic<int> fired{0};
  std::string message;
  std::mutex m;
  CommWatchdog dog(3, 0.2, [&](const std::string& msg) {
    std::lock_guard<std::mutex> lock(m);
    message = msg;
    ++fired;
  });
  {
    auto g = dog.guard("gradient reduce-scatter (step 7)");
    std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  }
  EXPECT_EQ(fired.load(), 1);
  std::lock_guard<std::mutex> lock(m);
  EXPECT_NE(message.find("rank 3"), std::string::npos) << message;
  EXPECT_NE(message.find("gradient reduce-scatter (step 7)"), std::string::npos) << message;
}

TEST(CommWatchdog, StaysQuietWhenOperationsFinishInTime) {
  std::atomic<int> fired{0};
  CommWatchdog dog(0, 1.0, [&](const std::string&) { ++fired; });
  for (int i = 0; i < 20; ++i) {
    auto g = dog.guard("all-reduce");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Idle time between guards does not count.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(fired.load(), 0);
}

TEST(CommWatchdog, ZeroTimeoutDisablesIt) {
  std::atomic<int> fired{0};
  CommWatchdog dog(0, 0, [&](const std::string&) { ++fired; });
  {
    auto g = dog.guard("anything");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(fired.load(), 0);
}

}  // namespace
}  // namespace foundry
