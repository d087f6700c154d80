#include "train/memory_tier.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <filesystem>

#include "base/error.h"
#include "base/hash.h"
#include "base/io.h"
#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_dir.h"

namespace foundry {

namespace {

int64_t step_of(const std::string& checkpoint_dir) {
  const size_t slash = checkpoint_dir.find_last_of('/');
  return parse_checkpoint_dir_name(checkpoint_dir.substr(slash + 1)).value_or(0);
}

// The run directory's checkpoint of `step`, if it is there and committed.
std::optional<std::string> committed_dir(const std::string& run_dir, int64_t step) {
  for (const CheckpointDir& d : list_checkpoint_dirs(run_dir)) {
    if (d.step != step) continue;
    try {
      verify_checkpoint(d.path);
      return d.path;
    } catch (const Error&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace

void check_memory_tier_room(const TrainConfig& tc, double bytes) {
  const std::string& dir = tc.memory_checkpoint_dir;
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail(fmt::format("train.memory_checkpoint_dir = '{}' is not a directory", dir),
         "point it at a RAM-backed directory (/dev/shm) or turn in-memory checkpoints off with "
         "train.memory_checkpoint_every=0");
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) != 0) return;
  const double free = static_cast<double>(fs.f_bavail) * fs.f_frsize;
  if (free < bytes)
    fail(fmt::format("train.memory_checkpoint_dir = '{}' has {:.2f} GB free; in-memory "
                     "checkpoints need {:.2f} GB there (two copies of every rank's state)",
                     dir, free / 1e9, bytes / 1e9),
         "free space there, point train.memory_checkpoint_dir at a larger RAM-backed "
         "directory, or turn in-memory checkpoints off with train.memory_checkpoint_every=0");
}

std::string memory_tier_root(const TrainConfig& tc) {
  return tc.memory_checkpoint_every > 0 ? memory_tier_location(tc) : "";
}

std::string durable_checkpoint_checksum(const std::string& run_dir, int64_t step) {
  for (const CheckpointDir& d : list_checkpoint_dirs(run_dir))
    if (d.step == step) return checkpoint_checksum(d.path);
  return "";
}

std::string memory_tier_location(const TrainConfig& tc) {
  std::error_code ec;
  std::string run_dir = std::filesystem::weakly_canonical(tc.run_dir, ec).string();
  if (ec) run_dir = std::filesystem::absolute(tc.run_dir).lexically_normal().string();
  while (run_dir.size() > 1 && run_dir.back() == '/') run_dir.pop_back();
  return join(tc.memory_checkpoint_dir,
              "foundry-" + hash64_hex(hash64(run_dir.data(), run_dir.size())));
}

std::optional<std::string> usable_memory_checkpoint(const TrainConfig& tc,
                                                    const std::optional<std::string>& durable,
                                                    bool even_when_off) {
  const std::string root = even_when_off ? memory_tier_location(tc) : memory_tier_root(tc);
  if (root.empty() || !path_exists(root)) return std::nullopt;
  const std::optional<std::string> memory = find_latest_checkpoint(root);
  if (!memory) return std::nullopt;
  if (durable && step_of(*durable) >= step_of(*memory)) return std::nullopt;
  try {
    const json state = read_checkpoint_trainer_state(*memory);
    const auto base = state.find(kDurableStepKey);
    if (base == state.end() || !base->is_number_integer()) return std::nullopt;
    const int64_t base_step = base->get<int64_t>();
    // Written before its run had a durable checkpoint, while the directory now holds an
    // older one: that is the save that was in flight then, or another run's (an earlier
    // run's tier in a memory_checkpoint_dir the new run did not clear).
    if (base_step == 0) {
      if (durable && state.value(kDurableInFlightKey, int64_t{-1}) != step_of(*durable))
        return std::nullopt;
    } else {
      const std::optional<std::string> base_dir = committed_dir(tc.run_dir, base_step);
      if (!base_dir) return std::nullopt;
      // The very checkpoint it descends from, not another run's of the same step.
      const auto sum = state.find(kDurableChecksumKey);
      if (sum != state.end() && *sum != checkpoint_checksum(*base_dir)) return std::nullopt;
    }
  } catch (const Error& e) {
    warn(fmt::format("skipping in-memory checkpoint {}: {}", *memory, e.what()));
    return std::nullopt;
  }
  return memory;
}

int64_t latest_resume_step(const TrainConfig& tc) {
  const auto durable = find_latest_checkpoint(tc.run_dir);
  if (const auto memory = usable_memory_checkpoint(tc, durable)) return step_of(*memory);
  return durable ? step_of(*durable) : 0;
}

}  // namespace foundry
