// `foundry launch`: runs a training job and keeps it running. It starts `foundry train` (one
// process, or under mpirun/srun) and watches it: the job's exit status, and every rank's
// heartbeat (train/heartbeat.h) for a rank that died, stopped or hangs when the job itself
// cannot tell (one process, a whole node gone). When the job fails it ends what is left of
// it, waits (backoff), and starts it again from the latest committed checkpoint
// (--auto-resume; checkpoints load under any rank count, so a restart may use another),
// until the run finishes or the restart budget is spent.
//
// What is retried: a lost rank (exit 3), a death by signal, any failure after the attempt
// made progress or of a restart. What is not: a first start that fails before its first step
// (bad input fails the same way again), or a failure the job marked fatal (a numerical
// failure beyond its policy). Every start,
// failure (cause, rank, detection), restart (steps lost) and the end go to RUN_DIR/events.jsonl
// and to the console. Injected faults (FOUNDRY_CHECKPOINT_FAULT, FOUNDRY_TRAIN_FAULT) reach the
// first attempt only: the restart is the recovery being tested.
#pragma once
#include <string>
#include <vector>

#include "launch/command.h"

namespace foundry {

struct LaunchOptions {
  std::string config_path;
  std::vector<std::string> overrides;   // --set section.key=value
  std::vector<std::string> train_args;  // other options for every attempt's `foundry train`
  bool overwrite = false;               // the first attempt replaces an earlier run
  int ranks = 1;
  int restart_ranks = 0;                // ranks of the restarts (0: as the first attempt)
  Launcher launcher = Launcher::automatic;
  std::vector<std::string> launcher_args;
  int max_restarts = 10;
  double backoff_s = 1, max_backoff_s = 60;
  // A rank with no heartbeat this long never took the run directory (a rank beats from then
  // on, through building its model and loading its checkpoint, under its hang threshold).
  double startup_timeout_s = 120;
  std::string exe;                      // this binary
};

// Runs the job to its end; returns the exit code for `foundry launch` (base/exit_codes.h):
// finished, interrupted (a stop signal to launch, forwarded to the job, which saved a
// checkpoint), or failed (not retryable, or the restart budget spent).
int supervise(const LaunchOptions& options);

}  // namespace foundry
