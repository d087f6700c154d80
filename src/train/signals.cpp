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

int StopSignals::agreed(const Communicator* world) const {
  int sig = received();
  if (world) {
    double s = sig;
    world->allreduce(&s, &s, 1, ReduceOp::max);
    sig = static_cast<int>(s);
  }
  return sig;
}

}  // namespace foundry
