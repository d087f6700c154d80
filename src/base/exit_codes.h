// The exit status of every foundry command (docs/fault-tolerance.md, "Exit codes"). Scripts and
// `foundry launch` act on them: a failure is not retried, a lost rank is, an interrupted run
// resumes from the checkpoint it saved.
#pragma once

namespace foundry {

enum ExitCode : int {
  kExitFinished = 0,     // done: the run reached its last step / the command succeeded
  kExitFailed = 1,       // an error (bad input, I/O, a numerical failure beyond its policy);
                         // retrying will fail the same way
  kExitUsage = 2,        // the command line itself is wrong (unknown option, missing value)
  kExitRankLost = 3,     // a rank died, stopped or hung (heartbeat or communication
                         // watchdog); the job can resume from its last checkpoint
  kExitInterrupted = 75  // stopped by SIGINT/SIGTERM after saving a checkpoint (EX_TEMPFAIL)
};

}  // namespace foundry
