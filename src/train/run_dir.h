// A run directory belongs to one run. Before a training job writes anything into it, rank 0
// takes its lock (RUN_DIR/lock, flock: released by the kernel when the process ends, however
// it ends; the file names the holder and is removed when it ends) and checks what the directory
// holds against what the user asked for:
//
//   start            a new run: refused if the directory holds another run's checkpoints
//                    or metrics (nothing is touched)
//   --resume         continue the run: refused if it has no checkpoint to continue from
//   --auto-resume    continue if there is a checkpoint, else start a new run (metrics of
//                    steps never checkpointed are replaced); what `foundry launch` uses
//   --overwrite      remove the previous run's checkpoints and metrics, naming each, then
//                    start; refused, with nothing removed, when checkpoints/ holds anything
//                    Foundry does not write there (a file of the user's, a step_N directory
//                    without a commit marker: saves commit before they take that name). The
//                    removal waits for replace_previous_run, once the job is ready to train:
//                    a failure or a stop before then leaves the previous run as it was
//
// A checkpoint is one in the run directory or a usable one of the in-memory tier
// (train/memory_tier.h): a run whose only checkpoint is in memory resumes from it.
//
// A second process on a locked directory is refused, naming the holder's pid and host. A
// directory this job created is removed again if the job fails before training starts.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/config_reader.h"
#include "train/run_config.h"

namespace foundry {

class Processes;

enum class StartMode { fresh, resume, auto_resume, overwrite };

inline constexpr char kLockFile[] = "lock";
inline constexpr char kMetricsFile[] = "metrics.jsonl";
inline constexpr char kSkippedBatchesFile[] = "skipped_batches.json";  // train/anomaly.h
// Whether `file` (kSkippedBatchesFile's contents) is a record of skipped batches as Foundry
// writes it: an object with a "batches" list.
bool is_skipped_batches_record(const json& file);

// What a run directory holds of an earlier run.
struct RunDirContents {
  bool exists = false;
  int64_t checkpoints = 0;     // step_N directories (committed or not)
  bool latest = false;         // checkpoints/latest
  int64_t metrics_lines = 0;   // lines of metrics.jsonl
  int64_t memory_step = 0;     // step of the in-memory tier's usable checkpoint (0: none)
  // Entries of checkpoints/ that Foundry writes (committed step_N directories, `latest`,
  // staging and leftover *.tmp), and those it does not (with the reason), by name.
  std::vector<std::string> foundry_entries, foreign_entries;
  // The step_N directories among the foreign entries: a save of that step would replace them.
  std::vector<std::string> foreign_steps;
  bool any() const { return checkpoints > 0 || latest || metrics_lines > 0 || memory_step > 0; }
  std::string describe() const;  // "3 checkpoint(s) and 120 line(s) of metrics.jsonl"
};
// Fails when a file of the run directory Foundry reads and rewrites (metrics.jsonl,
// events.jsonl, config.json, skipped_batches.json, checkpoints/latest) is not a regular file,
// or checkpoints/ not a directory: reading a named pipe there would wait forever for a writer.
void check_run_files(const std::string& run_dir);
// `tier`: the run's config, to count the in-memory tier's checkpoint too. Checks the run's
// files first (check_run_files).
RunDirContents inspect_run_dir(const std::string& run_dir, const TrainConfig* tier = nullptr);

// The holder of a run directory's lock, as written in RUN_DIR/lock.
struct LockHolder {
  int64_t pid = 0;
  std::string host, since;
};

inline constexpr char kLaunchLockFile[] = "launch.lock";
// Set by `foundry launch` in its jobs' environment: its pid, so that the job it started may
// train in the run directory it supervises, and no other job may.
inline constexpr char kLaunchPidVariable[] = "FOUNDRY_LAUNCH_PID";
// Set by `foundry launch` too: its --startup-timeout in seconds, the least a launched job's
// start-up (building its model, loading its checkpoint) may go between two progress marks.
inline constexpr char kLaunchStartupVariable[] = "FOUNDRY_LAUNCH_STARTUP_S";

class RunDirLock {
 public:
  // Takes the lock file `file` of `run_dir` (which must exist) or fails naming the holder:
  // kLockFile for the training job, kLaunchLockFile for the `foundry launch` supervising it.
  explicit RunDirLock(const std::string& run_dir, const char* file = kLockFile);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// The run directory of a training job, claimed for this run. Collective: rank 0 creates,
// locks and checks the directory; the other ranks fail with rank 0's error when it fails.
// Returns whether to resume (`resume` or `auto_resume` with a checkpoint present).
class RunDir {
 public:
  // `tc.run_dir` is the directory; the rest of `tc` locates the in-memory tier.
  RunDir(const TrainConfig& tc, StartMode mode, const Processes& processes);
  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

  bool resume() const { return resume_; }
  // The job is one `foundry launch` started (the launch holds the directory's launch lock):
  // the launch owns the directory's heartbeat/ and watches it from the job's first moments.
  bool supervised() const { return supervised_; }
  // Collective, for a new run once its job is ready to train (the model built, no stop
  // pending): under --overwrite, removes the previous run's checkpoints and metrics, naming
  // each (nothing otherwise). Every rank fails with rank 0's error when the removal fails.
  void replace_previous_run(const Processes& processes);
  // Training has started: the directory is kept whatever happens next.
  void started() { created_ = false; }

 private:
  void claim(StartMode mode);  // rank 0
  void check_overwrite(const RunDirContents& held) const;
  void overwrite(const RunDirContents& held);

  std::string path_;
  const TrainConfig tc_;  // a copy: a RunDir may outlive the config it was given
  bool root_;
  bool created_ = false;  // rank 0 made the directory (removed again if nothing starts)
  std::string created_path_;  // the outermost directory it made
  bool resume_ = false;
  bool supervised_ = false;
  bool overwrite_pending_ = false;  // --overwrite: replace_previous_run removes the old run
  std::unique_ptr<RunDirLock> lock_;
};

}  // namespace foundry
