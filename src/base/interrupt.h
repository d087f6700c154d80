// SIGINT/SIGTERM for a command that undoes its unfinished work (`data prepare`): while an
// InterruptScope lives, the first signal is noted and said, and the work stops at its next
// check_interrupted(), whose Interrupted error unwinds through the destructors that remove
// what it wrote; a second signal ends the process at once, as it would without the scope.
// (Training stops differently: at a step, with a checkpoint: train/signals.h.)
#pragma once

#include <string>

#include "base/error.h"

namespace foundry {

class Interrupted : public Error {
 public:
  Interrupted(int signal, std::string what) : Error(std::move(what)), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

class InterruptScope {
 public:
  // `note` is written to stderr when the first signal comes (what stopping does).
  explicit InterruptScope(std::string note);
  ~InterruptScope();  // restores the handlers it replaced
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
};

// Throws Interrupted once a signal came while the InterruptScope lives (never outside one);
// cheap (one atomic load).
void check_interrupted();

// Ends the process by `signal` with its default action (after an Interrupted has unwound), so
// the caller sees what it sees of a command killed by it (a shell's 130 for SIGINT).
[[noreturn]] void die_by_signal(int signal);

}  // namespace foundry
