// SIGINT/SIGTERM during training: the loop checkpoints and stops at the end of the step. The
// same agreement carries a rank's failure to write its outputs (metrics.jsonl on a full
// disk), which stops every rank the same way.
#pragma once

namespace foundry {

class Communicator;

// Why the ranks stop after this step (agreed: the same on every rank).
struct StopReasons {
  int signal = 0;              // SIGINT/SIGTERM received by some rank (0: none)
  bool output_failed = false;  // some rank could not write its outputs
  bool any() const { return signal != 0 || output_failed; }
};

// Installs SIGINT/SIGTERM handlers for its lifetime (one at a time, on one thread) and
// restores the previous ones after. The handlers run on a stack of their own;
// `block_on_workers` (a training run, whose OpenMP threads run oneDNN's GEMMs): the other
// OpenMP threads block the signals meanwhile (signals.cpp says why).
class StopSignals {
 public:
  explicit StopSignals(bool block_on_workers = false);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received so far (0: none).
  int received() const;
  // As if `sig` had been received (a stop asked for another way).
  void request(int sig);
  // The signals received so far, and the SIGINTs among them.
  int count() const;
  int interrupts() const;
  // While a run starts (its model built, a checkpoint loaded: minutes for a large one) a stop
  // waits for the first step's agreement. Meanwhile the first SIGINT/SIGTERM says so on stderr
  // (`announce`: rank 0), and a second SIGINT ends the process at once with the shell's code
  // (130), as it would have without handlers: nothing of the run is written before then.
  void while_starting(bool announce);
  // The run trains from here on (every stop ends with a checkpoint).
  void started();
  // Collective: the signal any rank of `world` received (0: none; null world: this
  // process). A signal reaches the ranks at different steps, so they agree at every step
  // and stop together.
  // `output_failed_here`: this rank could not write its outputs this step.
  StopReasons agreed(const Communicator* world, bool output_failed_here = false) const;

 private:
  bool block_on_workers_;
};

}  // namespace foundry
