#include "comm/watchdog.h"

#include <gtest/gtest.h>

#include <time.h>

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

// Once it has reported an overrun, the watch sleeps while the late operation goes on: the
// process's CPU time over a second of that wait stays near zero (a spinning watch takes
// most of a core).
TEST(CommWatchdog, SleepsAfterFiringWhileTheOperationGoesOn) {
  std::atomic<int> fired{0};
  CommWatchdog dog(0, 0.2, [&](const std::string&) { ++fired; });
  auto g = dog.guard("all-to-all");
  const auto cpu_seconds = [] {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (fired.load() == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(fired.load(), 1);
  const double before = cpu_seconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_LT(cpu_seconds() - before, 0.1);
  EXPECT_EQ(fired.load(), 1);
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
