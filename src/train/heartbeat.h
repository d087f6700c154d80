// Heartbeats: how a training job notices a rank that died, stopped or hangs, in seconds,
// without waiting for MPI (a collective whose peer vanished can block for many minutes).
//
// Every rank's heartbeat thread rewrites RUN_DIR/heartbeat/rank_NNNNN.json every
// `interval_s` (docs/formats.md): its pid and host, a beat counter, and its progress (a
// counter the training loop advances at every step, validation and checkpoint, and after every
// layer's forward and backward, with the step and the phase). The same thread watches:
//   - its right neighbour (rank r watches r+1 mod N, so every rank is watched once and the
//     reads stay O(N) over the job): a beat counter that has not changed for `lost_after_s`
//     means the neighbour died or was stopped (a stopped process's threads stop too);
//   - its own progress: none for the hang threshold means the job hangs (a stuck collective,
//     a rank spinning); the report says where every rank is.
// Ages are measured on the watcher's own monotonic clock from when it last saw a counter
// change, so clocks of different hosts need not agree. The hang threshold is
// max(hang_after_s, 3 × the longest interval between two progress marks so far) (4 ×
// hang_after_s until the first step completes: start-up creates primitives and faults in
// memory; or HeartbeatConfig::startup_after_s when larger), written into the record so
// `foundry launch` applies the same one.
// A rank that ends normally writes state "exited" and is no longer watched.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace foundry {

struct HeartbeatConfig {
  double interval_s = 1;     // 0: no heartbeats
  double lost_after_s = 5;   // a rank silent this long has died or stopped
  double hang_after_s = 45;  // no progress this long (at least): the job hangs
  // Before the first step completes, the threshold is the larger of 4 × hang_after_s and
  // this (launch's --startup-timeout, the communication timeout: a rank that loaded its part
  // of a checkpoint waits for the slowest without marks).
  double startup_after_s = 0;
};

// One rank's heartbeat file.
struct HeartbeatRecord {
  int rank = 0;
  int64_t pid = 0;
  std::string host;
  int64_t beats = 0;      // advanced by every write
  int64_t progress = 0;   // advanced by every progress mark
  int64_t step = 0;
  std::string phase;      // "starting", "step", "validation", "checkpoint", ...
  double hang_after_s = 0;  // this rank's current hang threshold
  bool exited = false;    // ended normally (not watched any more)
};

std::string heartbeat_dir(const std::string& run_dir);
// RUN_DIR/heartbeat/stop: `foundry launch`, asked to stop, writes it before it signals the job,
// whose ranks check it where they agree on a stop before the first step. A stop that reaches
// mpirun before any rank could be signalled is forwarded late, maybe after that agreement.
std::string launch_stop_path(const std::string& run_dir);
// RUN_DIR/heartbeat/rank_NNNNN.json, or nothing when absent or being replaced.
std::optional<HeartbeatRecord> read_heartbeat(const std::string& run_dir, int rank);
// Every rank's record there is, by rank.
std::map<int, HeartbeatRecord> read_heartbeats(const std::string& run_dir);

// When a counter of a watched record last changed, on the watcher's monotonic clock.
class ChangeClock {
 public:
  // Records `value` seen at `now` (seconds); returns seconds since it last changed.
  double seen(int64_t value, double now);

 private:
  std::optional<int64_t> value_;
  double since_ = 0;
};

// Why a rank is silent, from this host when it is the rank's: "has died", "is stopped
// (SIGSTOP?)", else "has stopped responding".
std::string describe_silence(const HeartbeatRecord& r);
// The state of process `pid` on this host: "running", "stopped", "gone" (none, or a zombie).
std::string local_process_state(int64_t pid);
// "rank 3 (pid 4121 on node7) at step 12 (step)".
std::string describe_rank(const HeartbeatRecord& r);
// Where every rank is, for a hang report: "ranks 0, 1, 3 at step 12 (step); rank 2 at step
// 11 (validation)".
std::string describe_positions(const std::map<int, HeartbeatRecord>& records);

class Heartbeat {
 public:
  // `on_failure(cause, rank, message)`: cause "rank_lost" or "hang", the rank at fault (-1:
  // not known), a message naming it; called once, from the heartbeat thread (it should end
  // the job). Starts the thread unless config.interval_s is 0.
  using FailureHandler = std::function<void(const std::string&, int, const std::string&)>;
  Heartbeat(std::string run_dir, int rank, int ranks, HeartbeatConfig config,
            FailureHandler on_failure);
  // Writes the "exited" record and stops the thread.
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // The training loop moved on (cheap: a lock and two stores; no I/O).
  void progress(int64_t step, const char* phase);
  // Start-up moved on (building the model, loading a checkpoint; a rollback's load too):
  // progress without a step, the threshold unchanged.
  void starting(const char* phase);

 private:
  void run();
  void write(bool exited);
  void watch_neighbour(double now);
  void watch_progress(double now);
  double hang_threshold() const;

  const std::string run_dir_;
  const int rank_, ranks_;
  const HeartbeatConfig config_;
  FailureHandler on_failure_;
  std::string host_;
  int fd_ = -1;  // this rank's record

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  int64_t beats_ = 0;
  // Guarded by mutex_: the loop's marks.
  int64_t progress_ = 0, step_ = 0;
  const char* phase_ = "starting";
  double last_mark_ = 0, longest_interval_ = 0;
  bool first_step_done_ = false;
  int64_t first_mark_step_ = -1;  // the step of the first mark: 0, or the step resumed from

  ChangeClock neighbour_beats_;
  double started_ = 0;
  bool fired_ = false;
  std::thread thread_;
};

}  // namespace foundry
