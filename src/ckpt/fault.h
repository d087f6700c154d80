// Fault injection for the checkpoint commit protocol's tests: FOUNDRY_CHECKPOINT_FAULT makes
// one rank fail, or die, at one point of a save (or a load), so tests can check that the previous
// checkpoint stays loadable and the failure is reported.
//
//   FOUNDRY_CHECKPOINT_FAULT=<point>@<rank>[#<n>][:exit|:pause|:sleep=S]
//     point  write          a rank's shard, after its parameters, before its optimizer state
//            before_fsync   a rank's shard, written, before it is fsynced
//            before_commit  rank 0, metadata written, before COMMITTED
//            before_latest  rank 0, the checkpoint renamed into place, before `latest`
//            load           a rank loading a format-2 checkpoint, before its last slab
//     rank   the rank that fails (set_checkpoint_fault_rank; 0 in one process)
//     n      fail the n-th time this rank reaches the point (default 1)
//     exit   _exit(86) there instead of throwing (a process dying mid-save)
//     pause  sleep there for two minutes (a test then kills the process with SIGKILL)
//     sleep  sleep there for S seconds, then go on (a slow disk)
// A thrown fault reads as a disk error: "... No space left on device (injected fault)".
// Unset: checkpoint_fault_point is one relaxed load and a compare.
#pragma once
#include <string>

namespace foundry {

enum class CheckpointFault { disk_full, before_fsync, before_commit, before_latest, load };

void set_checkpoint_fault_rank(int rank);
// Throws (or exits) when the injected fault names this point and rank; `path` goes into the
// message as the file being written.
void checkpoint_fault_point(CheckpointFault point, const std::string& path);

}  // namespace foundry
