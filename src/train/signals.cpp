#include "train/signals.h"

#include <omp.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <memory>

#include "comm/comm.h"

namespace foundry {
namespace {

std::atomic<int> g_stop_signal{0};
std::atomic<int> g_stop_count{0}, g_interrupt_count{0};  // signals received, SIGINTs among them
std::atomic<bool> g_starting{false}, g_announce{false};
struct sigaction g_old_int {}, g_old_term {};
stack_t g_old_stack{};
std::unique_ptr<char[]> g_stack;
constexpr size_t kSignalStackBytes = 64 * 1024;

// Async-signal-safe: atomics, write(2), sigaction, raise.
// Records `sig` unless a signal came first (the first is the one named); returns that one.
int keep_first_signal(int sig) {
  int before = 0;
  g_stop_signal.compare_exchange_strong(before, sig);
  return before;
}

void on_stop_signal(int sig) {
  const int before = keep_first_signal(sig);
  g_stop_count.fetch_add(1);
  if (sig == SIGINT) g_interrupt_count.fetch_add(1);
  if (!g_starting.load()) return;
  if (before == 0) {
    if (!g_announce.load()) return;
    static const char kNote[] =
        "\nreceived a stop signal while starting: the run stops before its first step, once its "
        "model is built and its checkpoint loaded (press Ctrl-C again to exit now)\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, kNote, sizeof(kNote) - 1);
  } else if (sig == SIGINT) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGINT, &dfl, nullptr);
    ::raise(SIGINT);
  }
}

// oneDNN 2.6's JIT fp32 GEMM kernels point the stack pointer into the heap while they run
// (fixed in oneDNN 3.11.2): a signal handler entered there writes its frame over the heap,
// which a later free() finds corrupted. So the handlers run on a stack of their own
// (SA_ONSTACK) for the thread that installs them, and a training run's other OpenMP threads,
// which run such GEMMs without that stack, block the signals. Threads that run no GEMMs (the
// checkpoint writer, the heartbeat, MPI's) may still take them, on their own stacks.
void set_stop_signals_blocked_on_workers(bool blocked) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
#pragma omp parallel
  {
    if (omp_get_thread_num() != 0) pthread_sigmask(blocked ? SIG_BLOCK : SIG_UNBLOCK, &set, nullptr);
  }
}

void use_signal_stack() {
  if (!g_stack) g_stack = std::make_unique<char[]>(kSignalStackBytes);
  stack_t st{};
  st.ss_sp = g_stack.get();
  st.ss_size = kSignalStackBytes;
  sigaltstack(&st, &g_old_stack);
}

}  // namespace

StopSignals::StopSignals(bool block_on_workers) : block_on_workers_(block_on_workers) {
  g_stop_signal.store(0);
  g_stop_count.store(0);
  g_interrupt_count.store(0);
  if (block_on_workers_) set_stop_signals_blocked_on_workers(true);
  use_signal_stack();
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  // SA_RESTART: a system call the handler interrupts (a blocking waitpid, a read of a pipe)
  // goes on instead of failing with EINTR; the stop is seen where it is checked.
  sa.sa_flags = SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

StopSignals::~StopSignals() {
  started();
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaltstack(&g_old_stack, nullptr);
  if (block_on_workers_) set_stop_signals_blocked_on_workers(false);
}

int StopSignals::received() const { return g_stop_signal.load(); }

void StopSignals::request(int sig) { keep_first_signal(sig); }

int StopSignals::count() const { return g_stop_count.load(); }

int StopSignals::interrupts() const { return g_interrupt_count.load(); }

void StopSignals::while_starting(bool announce) {
  g_announce.store(announce);
  g_starting.store(true);
}

void StopSignals::started() {
  g_starting.store(false);
  g_announce.store(false);
}

StopReasons StopSignals::agreed(const Communicator* world, bool output_failed_here) const {
  double reasons[2] = {double(received()), output_failed_here ? 1.0 : 0.0};
  if (world) world->allreduce(reasons, reasons, 2, ReduceOp::max);
  return {static_cast<int>(reasons[0]), reasons[1] > 0};
}

}  // namespace foundry
