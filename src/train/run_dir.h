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
//   --overwrite      remove the previous run's checkpoints, metrics and events, then start
//
// A second process on a locked directory is refused, naming the holder's pid and host. A
// directory this job created is removed again if the job fails before training starts.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace foundry {

class Processes;

enum class StartMode { fresh, resume, auto_resume, overwrite };

inline constexpr char kLockFile[] = "lock";
inline constexpr char kMetricsFile[] = "metrics.jsonl";

// What a run directory holds of an earlier run.
struct RunDirContents {
  bool exists = false;
  int64_t checkpoints = 0;     // step_N directories (committed or not) and `latest`
  int64_t metrics_lines = 0;   // lines of metrics.jsonl
  bool any() const { return checkpoints > 0 || metrics_lines > 0; }
  std::string describe() const;  // "3 checkpoints and 120 metrics lines"
};
RunDirContents inspect_run_dir(const std::string& run_dir);

// The holder of a run directory's lock, as written in RUN_DIR/lock.
struct LockHolder {
  int64_t pid = 0;
  std::string host, since;
};

class RunDirLock {
 public:
  // Takes the lock of `run_dir` (which must exist) or fails naming the holder.
  explicit RunDirLock(const std::string& run_dir);
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
  RunDir(const std::string& run_dir, StartMode mode, const Processes& processes);
  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

  bool resume() const { return resume_; }
  // Training has started: the directory is kept whatever happens next.
  void started() { created_ = false; }

 private:
  void claim(StartMode mode);  // rank 0

  std::string path_;
  bool root_;
  bool created_ = false;  // rank 0 made the directory (removed again if nothing starts)
  std::string created_path_;  // the outermost directory it made
  bool resume_ = false;
  std::unique_ptr<RunDirLock> lock_;
};

}  // namespace foundry
