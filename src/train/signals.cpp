#include "train/signals.h"

#include <atomic>
#include <csignal>

#include "comm/comm.h"

namespace foundry {
namespace {

std::atomic<int> g_stop_signal{0};
struct sigaction g_old_int {}, g_old_term {};

void on_stop_signal(int sig) { g_stop_signal.store(sig); }

}  // namespace

StopSignals::StopSignals() {
  g_stop_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

int StopSignals::received() const { return g_stop_signal.load(); }

StopReasons StopSignals::agreed(const Communicator* world, bool output_failed_here) const {
  double reasons[2] = {double(received()), output_failed_here ? 1.0 : 0.0};
  if (world) world->allreduce(reasons, reasons, 2, ReduceOp::max);
  return {static_cast<int>(reasons[0]), reasons[1] > 0};
}

}  // namespace foundry
