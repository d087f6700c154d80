// SIGINT/SIGTERM during training: the loop checkpoints and stops at the end of the step.
#pragma once

namespace foundry {

class Communicator;

// Installs SIGINT/SIGTERM handlers for its lifetime (one at a time) and restores the
// previous ones after.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal received so far (0: none).
  int received() const;
  // Collective: the signal any rank of `world` received (0: none; null world: this
  // process). A signal reaches the ranks at different steps, so they agree at every step
  // and stop together.
  int agreed(const Communicator* world) const;
};

}  // namespace foundry
