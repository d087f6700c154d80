#include "base/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace foundry {
namespace {

std::atomic<int> g_signal{0};
std::string* g_note = nullptr;  // written by the handler: set before it is installed
struct sigaction g_old_int {
}, g_old_term{};

void restore_default(int sig) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
}

// Async-signal-safe: an atomic, write(2), sigaction, raise.
void on_signal(int sig) {
  int before = 0;
  if (g_signal.compare_exchange_strong(before, sig)) {
    if (g_note) [[maybe_unused]]
      const ssize_t n = ::write(STDERR_FILENO, g_note->data(), g_note->size());
    return;
  }
  restore_default(sig);  // the second signal: what it would have done without the scope
  ::raise(sig);
}

}  // namespace

InterruptScope::InterruptScope(std::string note) {
  g_signal.store(0);
  g_note = new std::string("\n" + note + " (press Ctrl-C again to exit at once)\n");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

InterruptScope::~InterruptScope() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  delete g_note;
  g_note = nullptr;
  g_signal.store(0);  // an Interrupted thrown carries its signal on
}

void check_interrupted() {
  const int sig = g_signal.load(std::memory_order_relaxed);
  if (sig != 0)
    throw Interrupted(sig, std::string("stopped by ") + (sig == SIGINT    ? "SIGINT"
                                                         : sig == SIGTERM ? "SIGTERM"
                                                                          : ::strsignal(sig)));
}

void die_by_signal(int signal) {
  restore_default(signal);
  ::raise(signal);
  std::_Exit(128 + signal);  // not reached: the signal's default action ends the process
}

}  // namespace foundry
