#include "base/interrupt.h"

#include <gtest/gtest.h>
#include <signal.h>

namespace foundry {
namespace {

void handler_before(int) {}

TEST(InterruptScope, TheFirstSignalStopsTheWorkAtItsNextCheckAndTheOldHandlersComeBack) {
  struct sigaction mine {}, old_int {}, old_term {};
  mine.sa_handler = handler_before;
  sigemptyset(&mine.sa_mask);
  sigaction(SIGINT, &mine, &old_int);
  sigaction(SIGTERM, &mine, &old_term);
  {
    InterruptScope scope("stopping the test's work");
    check_interrupted();  // no signal yet: nothing
    ::raise(SIGTERM);
    try {
      check_interrupted();
      ADD_FAILURE() << "no Interrupted after SIGTERM";
    } catch (const Interrupted& e) {
      EXPECT_EQ(e.signal(), SIGTERM);
      EXPECT_STREQ(e.what(), "stopped by SIGTERM");
    }
    EXPECT_THROW(check_interrupted(), Interrupted);  // it stays stopped
  }
  check_interrupted();  // outside a scope: never
  struct sigaction now {};
  sigaction(SIGINT, nullptr, &now);
  EXPECT_EQ(now.sa_handler, handler_before);
  sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, handler_before);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
}

// A second signal ends the process as the signal's default action would.
TEST(InterruptScopeDeathTest, TheSecondSignalEndsTheProcessAtOnce) {
  EXPECT_EXIT(
      {
        InterruptScope scope("stopping");
        ::raise(SIGINT);
        ::raise(SIGINT);
        std::_Exit(0);
      },
      testing::KilledBySignal(SIGINT), "stopping");
}

}  // namespace
}  // namespace foundry
