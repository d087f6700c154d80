// The processes of a training run: one, or the ranks of an mpirun job, with the watchdog
// that turns a hang in communication into an error naming the rank and the operation.
#pragma once
#include <optional>
#include <string>

#include "comm/watchdog.h"

namespace foundry {

class Communicator;

class Processes {
 public:
  // `world` null or of one rank: a single process. `comm_timeout_s` as train.comm_timeout_s.
  Processes(const Communicator* world, double comm_timeout_s);

  const Communicator* world() const { return world_; }  // null in a single process
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  bool root() const { return rank_ == 0; }

  // Under mpirun, a deadline for `what` (a step, a checkpoint) that ends with the returned
  // guard; nothing in a single process.
  [[nodiscard]] std::optional<CommWatchdog::Guard> guard(std::string what);
  void barrier() const;  // no-op in a single process

 private:
  const Communicator* world_;
  int rank_ = 0, ranks_ = 1;
  std::optional<CommWatchdog> watchdog_;
};

}  // namespace foundry
