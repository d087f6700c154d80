#include "comm/watchdog.h"

#include <fmt/format.h>

#include <cstdio>

#include "base/exit_codes.h"
#include "comm/comm.h"

namespace foundry {

CommWatchdog::CommWatchdog(int rank, double timeout_s,
                           std::function<void(const std::string&)> on_timeout)
    : rank_(rank), timeout_s_(timeout_s), on_timeout_(std::move(on_timeout)) {
  if (!on_timeout_) {
    on_timeout_ = [](const std::string& message) {
      std::fprintf(stderr, "%s\n", message.c_str());
      abort_job(kExitRankLost);
    };
  }
  if (timeout_s_ > 0) thread_ = std::thread([this] { run(); });
}

CommWatchdog::~CommWatchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

CommWatchdog::Guard CommWatchdog::guard(std::string what) {
  if (timeout_s_ <= 0) return Guard(nullptr);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    what_ = std::move(what);
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(timeout_s_));
    active_ = true;
  }
  wake_.notify_all();  // the thread sleeps until the new deadline
  return Guard(this);
}

void CommWatchdog::end_guard() {
  std::lock_guard<std::mutex> lock(mutex_);
  active_ = false;  // no notify: the thread re-checks at the old deadline and finds nothing
}

CommWatchdog::Guard::~Guard() {
  if (dog_) dog_->end_guard();
}

void CommWatchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (!active_) {
      wake_.wait(lock, [this] { return stop_ || active_; });
      continue;
    }
    const auto deadline = deadline_;
    if (wake_.wait_until(lock, deadline,
                         [&] { return stop_ || !active_ || deadline_ != deadline; }))
      continue;  // stopped, finished, or a new guard with a new deadline
    if (fired_) {  // reported once: sleep until this guard ends or another begins
      wake_.wait(lock, [&] { return stop_ || !active_ || deadline_ != deadline; });
      continue;
    }
    fired_ = true;
    const std::string message = fmt::format(
        "error: rank {}: {} did not complete within {:.0f} s; another rank has probably died, "
        "hangs, or runs a different configuration\n"
        "hint: check the other ranks' output above; raise train.comm_timeout_s if the step is "
        "legitimately this slow",
        rank_, what_, timeout_s_);
    lock.unlock();
    on_timeout_(message);
    lock.lock();
  }
}

}  // namespace foundry
