#include "train/processes.h"

#include "comm/comm.h"

namespace foundry {

Processes::Processes(const Communicator* world, double comm_timeout_s)
    : world_(world && world->size() > 1 ? world : nullptr) {
  if (!world_) return;
  rank_ = world_->rank();
  ranks_ = world_->size();
  watchdog_.emplace(rank_, comm_timeout_s);
}

std::optional<CommWatchdog::Guard> Processes::guard(std::string what) {
  if (!watchdog_) return std::nullopt;
  return watchdog_->guard(std::move(what));
}

void Processes::barrier() const {
  if (world_) world_->barrier();
}

}  // namespace foundry
