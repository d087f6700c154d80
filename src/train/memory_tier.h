// The in-memory checkpoint tier: checkpoints of the same sharded format as the run
// directory's, written every train.memory_checkpoint_every steps to a RAM-backed directory
// (train.memory_checkpoint_dir, /dev/shm by default), so that a restart after a crash loses
// a few steps instead of up to a checkpoint interval. They outlive the processes, not the
// host: the run directory's checkpoints remain the durable ones.
//
// The tier keeps two committed checkpoints in MEMORY_DIR/foundry-<XXH3 of the run directory's
// absolute path>/checkpoints; a save moves the older one's files into its staging directory
// and overwrites them in place, so the tier holds two copies of the state at most and a save
// allocates no memory. A resume uses
// it only when it is newer than every checkpoint of the run directory and descends from one
// still there (its trainer state's "durable_step": the run directory's newest committed
// checkpoint when it was written, 0 for none, and "durable_xxh3": that checkpoint's commit
// marker's checksum, so another run's checkpoint of the same step does not pass; one written
// with no durable checkpoint yet goes only with the save that was in flight then, if any:
// "durable_in_flight"), so removing checkpoints from the run directory to go back sets the
// memory tier aside too. A resume with
// the tier off leaves it unused (with a warning when it is newer: its ranks may span hosts,
// whose /dev/shm differ); a resume from an older step than the tier's checkpoints removes the
// newer ones (their steps are replaced); a new run, and a run that ends with its final
// checkpoint in the run directory, remove it whether the tier is on or off.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "train/run_config.h"

namespace foundry {

inline constexpr char kDurableStepKey[] = "durable_step";
inline constexpr char kDurableChecksumKey[] = "durable_xxh3";
// The step of the run directory's save in flight when it was written (0: none): with
// durable_step 0, the one durable checkpoint it may go with.
inline constexpr char kDurableInFlightKey[] = "durable_in_flight";

// Before a run starts (the tier on): fails unless train.memory_checkpoint_dir is a directory
// with room for `bytes` (two copies of every rank's state on this host).
void check_memory_tier_room(const TrainConfig& tc, double bytes);

// The tier's directory for this run; "" when the tier is off.
std::string memory_tier_root(const TrainConfig& tc);
// Where the tier of this run lies, on or off (a run with it off still finds, or removes, what
// an earlier process of the run left there).
std::string memory_tier_location(const TrainConfig& tc);

// checkpoint_checksum (ckpt/checkpoint_dir.h) of the run directory's checkpoint of `step`;
// "" when there is none.
std::string durable_checkpoint_checksum(const std::string& run_dir, int64_t step);

// The tier's newest committed checkpoint that a resume may use (see above), if any, given
// the run directory's latest committed checkpoint (find_latest_checkpoint(tc.run_dir));
// `even_when_off`: also with train.memory_checkpoint_every 0 (what such a resume leaves unused).
std::optional<std::string> usable_memory_checkpoint(const TrainConfig& tc,
                                                    const std::optional<std::string>& durable,
                                                    bool even_when_off = false);

// The step of the newest checkpoint a resume would start from (the memory tier's when
// usable, else the run directory's latest); 0 when there is none.
int64_t latest_resume_step(const TrainConfig& tc);

}  // namespace foundry
