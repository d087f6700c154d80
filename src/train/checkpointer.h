// Saving and resuming a training run's checkpoints: sharded (format 2, ckpt/sharded.h),
// asynchronous, and loadable under any process layout the config allows.
//
// A save is three phases:
//   snapshot  this rank's part of the parameters and of the optimizer state is copied into
//             a host buffer reused from save to save, by a background thread while the next
//             step's forward and backward run (they change neither); the step loop waits
//             only if the copy is not done when the optimizer is about to update
//             (protect_state);
//   write     (the same thread; with train.checkpoint_async = false, in the step loop
//             straight from the live buffers) the rank's shard file is written and fsynced
//             in the staging directory;
//   commit    (collective, at a step boundary once every rank's write is done) the ranks'
//             outcomes are exchanged; if all succeeded rank 0 writes the metadata and the
//             commit marker and points `latest` at the checkpoint, else every rank fails
//             with the failing ranks and their errors (the previous checkpoint stays valid).
// At most one save is in flight; one that falls due meanwhile waits for it or is skipped
// (train.checkpoint_overlap).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/page_slab.h"
#include "ckpt/checkpoint.h"
#include "data/loader.h"
#include "optim/optimizer.h"
#include "train/processes.h"
#include "train/run_config.h"

namespace foundry {

class Model;

// Which tiers save after `step` (`last`: the run's final step, or a stop; `completes`: the
// run's final step): the durable one every train.checkpoint_every steps and at the end
// (when the run completes, only with train.checkpoint_at_end); the in-memory one every
// train.memory_checkpoint_every steps, durable steps included (a durable checkpoint commits
// only once every rank has written it, seconds later, and a failure meanwhile would otherwise
// go back to the in-memory checkpoint before it), but not at the end, which is durable.
struct SavesDue {
  bool durable = false, memory = false;
};
SavesDue saves_due(const TrainConfig& tc, int64_t step, bool last, bool completes);

class Checkpointer {
 public:
  // `schedule`: the run's learning-rate schedule (its lr at a step is saved with it).
  // `train_loader` null: synthetic data (nothing to resume in the data). Collective (the
  // ranks agree on a tag for their staging directories).
  Checkpointer(const RunConfig& rc, const LrSchedule& schedule, Model& model,
               DataParallelOptimizer& optimizer, data::BatchLoader* train_loader,
               Processes& processes, bool quiet);
  // A save still in flight is abandoned uncommitted (its staging directory is cleaned by a
  // later save): an error is unwinding. Call finish() on the normal paths.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Loads the latest valid checkpoint of the run directory (either format, any layout) into
  // the model, optimizer, data cursor and router balancers, reading only what this rank
  // holds, and returns its step; 0 when there is none. Collective. Fails
  // before loading anything when the checkpoint was written by the other optimizer.
  int64_t resume();

  // The tokens the run has trained on by `step` (applied steps × the global batch's tokens,
  // counted from the resumed checkpoint's own count: the batch may change on a resume).
  int64_t tokens_at(int64_t step) const {
    return tokens_base_ + (step - tokens_base_step_) * tokens_per_step();
  }
  int64_t tokens_per_step() const { return rc_.train.batch_size * rc_.train.seq_len; }

  // Rollback: waits for the save in flight and commits it, then loads the latest committed
  // checkpoint as resume() does and returns its step; -1 (nothing loaded) when the run has
  // none yet. Collective.
  int64_t rollback();

  // Trainer state kept outside the model, optimizer and data cursor (the batch position,
  // dropped batches, the anomaly window): `save` adds its keys to a checkpoint's trainer
  // state, `restore` reads them back from the loaded one (older checkpoints may lack them).
  // The metrics line of the step whose append to metrics.jsonl failed (a full disk): the
  // checkpoints of that step carry it, and a resume from one writes it (resumed_metrics).
  void carry_unwritten_metrics(json line) { unwritten_metrics_ = std::move(line); }
  // The line a resumed checkpoint carried for its own step (null when none).
  const json& resumed_metrics() const { return resumed_metrics_; }
  void set_trainer_state_hooks(std::function<void(json&)> save,
                               std::function<void(const json&)> restore) {
    save_hook_ = std::move(save);
    restore_hook_ = std::move(restore);
  }
  // Called as a resume reads each tensor: the heartbeat's progress through a long load.
  void set_load_progress_hook(std::function<void()> hook) { load_progress_ = std::move(hook); }

  // Starts a checkpoint of `step`: the snapshot, then the write in the background (or to the
  // end, and the commit, when not asynchronous). `last`: the process's last checkpoint (the
  // end, --stop-at-step, a stop signal), which waits for one in flight even under
  // train.checkpoint_overlap = skip. Collective.
  void save(int64_t step, bool last = false);
  // At a step boundary: commits the save in flight once every rank has written it, and
  // fails (on every rank) if a rank's write failed. Collective: every rank calls it at the
  // same steps (one small all-reduce while a save is in flight).
  void poll();
  // Starts an in-memory checkpoint of `step` (train/memory_tier.h), unless the tier is off
  // or its previous save is still in flight: written from the live buffers by a background
  // thread beside the next step's forward and backward (protect_state() waits for it), and
  // committed by a later poll(). Collective.
  void save_in_memory(int64_t step);
  bool memory_tier_on() const { return !memory_.root.empty(); }
  // Waits for the saves in flight and commits them (end of run, signal). Collective.
  void finish();
  // After the final checkpoint is committed in the run directory: removes the memory tier,
  // which holds nothing newer. Collective.
  void retire_memory_tier();
  // A new run: removes what an earlier run in this directory left in the memory tier.
  void clear_memory_tier();
  // Before the optimizer changes the parameters or its state: waits until the snapshot of
  // an asynchronous save (copied beside this step's forward and backward) is complete.
  void protect_state();

  // The XXH3-64 of the dataset's tokenizer.model: saved with every checkpoint, and a resume
  // with another tokenizer is refused. Unset (synthetic data): neither.
  void set_tokenizer_checksum(uint64_t checksum) { tokenizer_checksum_ = checksum; }

 private:
  // Where checkpoints go: the run directory (durable) or the memory tier (train/memory_tier.h),
  // each with at most one save in flight.
  struct Tier {
    explicit Tier(const char* what) : name(what) {}
    const char* name;  // "checkpoint" or "in-memory checkpoint", for messages
    std::string root;  // the directory holding checkpoints/ ("" for a tier that is off)
    int64_t keep = 0;  // committed checkpoints kept (0 = all)
    // The save in flight (in_flight from snapshot to commit).
    bool in_flight = false;
    int64_t step = 0;
    json state;
    std::string staging;
    std::string recycle;  // an old checkpoint whose files this save reuses ("" for none)
    std::vector<SlabRun> runs;
    std::thread writer;
    std::atomic<bool> written{false};
    bool snapshot_pending = false;  // guarded by mutex_
    std::string shard;              // this rank's description (JSON) or, on failure, ""
    std::string error;              // this rank's write error
    // What lives in device memory (a model on a GPU, its optimizer's state) is copied into
    // `device_snapshot` (the backend's host memory, page-locked on a GPU; allocated once)
    // beside the next step; snapshotted[i]: run i points at such a copy already.
    float* device_snapshot = nullptr;
    int64_t device_snapshot_floats = 0;
    bool device_copies = false;
    std::vector<bool> snapshotted;
    // When save() began, when its copies were queued, how long the snapshot took from then,
    // and the time the step loop waited for it (save() and protect_state()), for the log line.
    double started = 0, copies_queued = 0, snapshot_seconds = 0, blocked_seconds = 0;
  };

  json trainer_state(int64_t step) const;
  void plan(Tier& tier, int64_t step);
  // Floats a save copies out of device memory (0 when everything is in host memory), and the
  // tier's buffer for them.
  int64_t device_floats();
  void allocate_device_snapshot(Tier& tier);
  void wait_device_copies(Tier& tier);
  // The same on a writer thread, which must not throw: a failed copy becomes the tier's
  // error (the ranks' commit reports it, as a failed write) and false.
  bool device_copies_arrived(Tier& tier);
  bool copy_snapshot(Tier& tier);
  void release_snapshot(Tier& tier);
  void write_shard(Tier& tier);  // the write phase (background thread or inline)
  void commit(Tier& tier);       // the commit phase, collective
  [[noreturn]] void fail_durable_save(const Tier& tier, const std::string& outcome) const;
  void remove_unfinished_saves(const std::string& run_dir) const;
  void report_save(const Tier& tier, const std::string& path, const std::vector<json>& shards,
                   double commit_seconds) const;
  std::vector<SlabTarget> load_targets();
  // The parameter slab as a load fills it: the slab itself, or for a model on a device a host
  // copy (which the load writes back).
  float* host_params();
  std::vector<std::string> resume_candidates() const;
  // resume's steps: the state of checkpoint `dir` loaded on every rank (nothing when a rank
  // failed: warned, and the first such failure kept in `newest_failure`); the rest of the
  // trainer put back from it, returning its step.
  std::optional<json> load_on_every_rank(const std::string& dir, std::string& newest_failure);
  void warn_schedule_change(const json& state, int64_t step) const;
  void drop_newer_memory_checkpoints(int64_t step) const;
  int64_t restore_from(const std::string& dir, const json& state, double started);
  void check_same_tokenizer(const std::string& dir, const json& state) const;
  void open_memory_tier();

  const RunConfig& rc_;
  LrSchedule schedule_;
  Model& model_;
  DataParallelOptimizer& optimizer_;
  data::BatchLoader* train_loader_;
  Processes& processes_;
  bool quiet_;
  std::string tag_;  // the same on every rank: names this run's staging directories
  std::optional<uint64_t> tokenizer_checksum_;
  std::function<void(json&)> save_hook_;
  std::function<void(const json&)> restore_hook_;
  std::function<void()> load_progress_;

  Tier disk_{"checkpoint"};
  Tier memory_{"in-memory checkpoint"};
  // The run directory's newest committed checkpoint (as this run knows it; 0 for none): the
  // memory tier's checkpoints name it as the durable one they descend from.
  int64_t durable_step_ = 0;
  json unwritten_metrics_, resumed_metrics_;
  int64_t tokens_base_ = 0, tokens_base_step_ = 0;  // tokens_at(): the count at the resumed step
  // The durable tier's snapshot of what lives in host memory, reused (backed from its first copy).
  PageSlab<float> buffer_;
  PageSlab<float> host_params_;  // a model on a device: its parameters' host copy while loading
  std::mutex mutex_;
  std::condition_variable snapshot_done_;
};

// Fails unless the checkpoint `dir` (its trainer state `saved_state`) was written by the
// `configured` optimizer: the state of one cannot continue the other. Checkpoints from
// before train.optimizer existed have no "optimizer" key and were written by AdamW.
void check_same_optimizer(const std::string& dir, const json& saved_state,
                          OptimizerKind configured);

// Fails unless the checkpoint `dir` (its trainer state `saved_state`) was trained with the
// tokenizer whose XXH3-64 is `checksum`, read from `source` (a dataset or a tokenizer file,
// for the message): another tokenizer of the same size gives wrong losses and garbage text
// without any other error. Checkpoints of runs on synthetic data record none: no check.
void check_checkpoint_tokenizer(const std::string& dir, const json& saved_state, uint64_t checksum,
                                const std::string& source);
// A checkpoint trained on random tokens (--synthetic-data: its state has no data cursor)
// learned no text: a warning that results on `source` mean nothing beyond a smoke test.
void warn_if_synthetic(const std::string& dir, const json& saved_state, const std::string& source);

}  // namespace foundry
