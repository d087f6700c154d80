// A deadline on blocking communication. MPI collectives have no timeout: if a peer rank dies
// without the launcher noticing, or hangs, every other rank waits in its next collective
// forever. The watchdog turns that into an error: while a guarded operation runs, a thread
// checks its deadline, and when it passes it prints which operation on which rank timed out
// and ends the whole job (MPI_Abort), so a failure is never a silent hang.
//
//   CommWatchdog dog(rank, /*timeout_s=*/300);
//   { auto guard = dog.guard("gradient reduce-scatter (step 12)"); comm.reduce_scatter(...); }
//
// Guards do not nest (one blocking operation at a time per process); the cost of a guard is
// two mutex operations and no thread wake-up.
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace foundry {

class CommWatchdog {
 public:
  // `on_timeout(message)` is what happens when a deadline passes (default: print the message
  // to stderr and MPI_Abort the world with exit code 3). Tests pass their own.
  CommWatchdog(int rank, double timeout_s, std::function<void(const std::string&)> on_timeout = {});
  ~CommWatchdog();
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;

  class Guard {
   public:
    ~Guard();
    Guard(Guard&& other) noexcept : dog_(other.dog_) { other.dog_ = nullptr; }
    Guard(const Guard&) = delete;
   private:
    friend class CommWatchdog;
    explicit Guard(CommWatchdog* dog) : dog_(dog) {}
    CommWatchdog* dog_;
  };

  // Starts the deadline for `what` (a description naming the operation); it ends with the
  // guard. A timeout of 0 or less disables the watchdog (guards do nothing).
  [[nodiscard]] Guard guard(std::string what);
  double timeout_s() const { return timeout_s_; }

 private:
  void run();
  void end_guard();

  const int rank_;
  const double timeout_s_;
  std::function<void(const std::string&)> on_timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool active_ = false, stop_ = false, fired_ = false;
  std::string what_;
  std::chrono::steady_clock::time_point deadline_;
  std::thread thread_;
};

}  // namespace foundry
