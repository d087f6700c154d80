#include "train/checkpointer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "base/hash.h"
#include "base/timer.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/fault.h"
#include "ckpt/model_state.h"
#include "ckpt/sharded.h"
#include "comm/agree.h"
#include "comm/comm.h"
#include "model/model.h"

namespace foundry {

void check_same_optimizer(const std::string& dir, const json& saved_state,
                          OptimizerKind configured) {
  std::string saved = "adamw";
  if (auto it = saved_state.find("optimizer"); it != saved_state.end()) {
    if (!it->is_string())
      fail(fmt::format("{}/trainer_state.json: \"optimizer\" is not a string", dir),
           "the checkpoint is corrupt; resume from another one or start a new run directory");
    saved = it->get<std::string>();
  }
  const std::string wanted = optimizer_name(configured);
  if (parse_optimizer(saved) != configured)
    fail(fmt::format("{} was written with train.optimizer = \"{}\", but the config says "
                     "train.optimizer = \"{}\"; the optimizer state of one cannot continue "
                     "the other",
                     dir, saved, wanted),
         fmt::format("resume with --set train.optimizer={}, or train with {} in a new run "
                     "directory (train.run_dir)",
                     saved, wanted));
}

namespace {

constexpr int kWriterNice = 19;  // the background write's niceness (lowest priority)

// A tag that names this run's staging directories, the same on every rank (rank 0's pid and
// clock, broadcast).
std::string agreed_tag(const Processes& processes) {
  int64_t tag[2] = {static_cast<int64_t>(::getpid()),
                    std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007};
  if (processes.world()) processes.world()->broadcast(tag, 2, 0);
  return fmt::format("{}-{}", tag[0], tag[1]);
}

// [0, n) without `holes` (sorted, disjoint).
std::vector<std::pair<int64_t, int64_t>> complement(
    const std::vector<std::pair<int64_t, int64_t>>& holes, int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> parts;
  int64_t at = 0;
  for (const auto& [b, e] : holes) {
    if (b > at) parts.push_back({at, b});
    at = e;
  }
  if (at < n) parts.push_back({at, n});
  return parts;
}

}  // namespace

Checkpointer::Checkpointer(const RunConfig& rc, const LrSchedule& schedule, Model& model,
                           DataParallelOptimizer& optimizer, data::BatchLoader* train_loader,
                           Processes& processes, bool quiet)
    : rc_(rc),
      schedule_(schedule),
      model_(model),
      optimizer_(optimizer),
      train_loader_(train_loader),
      processes_(processes),
      quiet_(quiet),
      tag_(agreed_tag(processes)) {
  set_checkpoint_fault_rank(processes.rank());
  // The snapshot buffer, allocated and touched once here rather than in the first save.
  if (rc.train.checkpoint_async) {
    const SlabInterval params = optimizer.parameters_to_save();
    int64_t total = params.end - params.begin;
    for (const StateRun& r : optimizer.states_to_save_runs()) total += r.end - r.begin;
    buffer_.assign(static_cast<size_t>(total), 0.0f);
  }
}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();
}

// ---- resume ---------------------------------------------------------------------------------

// What this rank holds: every parameter it stores, every optimizer state element it keeps.
std::vector<SlabTarget> Checkpointer::load_targets() {
  std::vector<SlabTarget> targets;
  for (const auto& [b, e] : complement(model_.released_param_ranges(), model_.slab_size()))
    targets.push_back({"", b, e, model_.params() + b});
  for (const StateRun& r : optimizer_.states_to_load_runs())
    targets.push_back({r.state, r.begin, r.end, r.data});
  return targets;
}

// The checkpoints to try, newest first: the one find_latest_checkpoint picks, then the
// older ones (a checkpoint whose data fails its checksums while loading is skipped).
void Checkpointer::check_same_tokenizer(const std::string& dir, const json& state) const {
  auto saved = state.find("tokenizer_xxh3_64");
  if (!tokenizer_checksum_ || saved == state.end()) return;
  const std::string mine = hash64_hex(*tokenizer_checksum_);
  if (*saved != mine)
    fail(fmt::format("{} was trained with a tokenizer of XXH3-64 {}, data.dir '{}' has {}", dir,
                     saved->is_string() ? saved->get<std::string>() : saved->dump(), rc_.data.dir,
                     mine),
         "resume with the dataset (and tokenizer) the run was trained on");
}

static std::vector<std::string> resume_candidates(const std::string& run_dir) {
  std::vector<std::string> candidates;
  const auto latest = find_latest_checkpoint(run_dir);
  if (!latest) return candidates;
  candidates.push_back(*latest);
  const std::vector<CheckpointDir> dirs = list_checkpoint_dirs(run_dir);
  int64_t latest_step = -1;
  for (const CheckpointDir& d : dirs)
    if (d.path == *latest) latest_step = d.step;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it)
    if (it->step < latest_step) candidates.push_back(it->path);
  return candidates;
}

int64_t Checkpointer::resume() {
  const std::string& run_dir = rc_.train.run_dir;
  const double t0 = now_seconds();
  const std::vector<std::string> candidates = resume_candidates(run_dir);
  std::string newest_failure;  // why the newest checkpoint could not be loaded
  for (const std::string& dir : candidates) {
    // Before loading anything: a checkpoint of the other optimizer lacks (or has extra)
    // state, and the plain message says more than a missing tensor would.
    check_same_optimizer(dir, read_checkpoint_trainer_state(dir), rc_.train.optimizer);
    auto g = processes_.guard("loading " + dir);
    json state;
    std::string error;
    try {
      state = load_checkpoint_targets(dir, rc_.model, model_.table(), load_targets());
    } catch (const Error& e) {
      error = e.what();
    }
    // Every rank loads from the same checkpoint: a fault one rank found rules it out for all.
    std::vector<std::string> errors = {error};
    if (const Communicator* w = processes_.world()) errors = allgather_strings(*w, error);
    std::vector<std::string> failures;
    for (size_t r = 0; r < errors.size(); ++r)
      if (!errors[r].empty()) failures.push_back(fmt::format("rank {}: {}", r, errors[r]));
    if (!failures.empty()) {
      if (processes_.root())
        warn(fmt::format("skipping checkpoint {}: {}", dir, fmt::join(failures, "; ")));
      if (newest_failure.empty())
        newest_failure = fmt::format("{}: {}", dir, fmt::join(failures, "; "));
      continue;
    }
    check_same_tokenizer(dir, state);
    const int64_t step = state.at("step").get<int64_t>();
    if (train_loader_) {
      if (!state.contains("data_cursor"))
        fail(fmt::format("{} was written by a run on synthetic data: it has no data cursor for "
                         "data.dir '{}'",
                         dir, rc_.data.dir),
             "resume with --synthetic-data, or train on the dataset in a new run directory");
      try {
        train_loader_->restore(state.at("data_cursor"));
      } catch (const Error& e) {
        fail(fmt::format("{}: {}", dir, e.what()), e.hint());
      }
    }
    restore_router_balancers(model_, state, dir, /*required=*/true);
    if (restore_hook_) restore_hook_(state);
    model_.sync_weights();
    if (processes_.root())
      std::fprintf(stderr, "resumed from %s (step %lld, loaded in %.2f s)\n", dir.c_str(),
                   static_cast<long long>(step), now_seconds() - t0);
    return step;
  }
  // A failed load may have written part of the state: never train on from there.
  if (!candidates.empty())
    fail(fmt::format("no checkpoint in {}/checkpoints could be loaded; the newest, {}", run_dir,
                     newest_failure),
         "restore the checkpoint files, resume with the config they were written with, or "
         "start a new run directory");
  return 0;
}

int64_t Checkpointer::rollback() {
  finish();
  if (resume_candidates(rc_.train.run_dir).empty()) return -1;
  return resume();
}

// ---- save -----------------------------------------------------------------------------------

// Everything random in training derives from the seed and the step (initialization,
// synthetic batches) or lives in the data cursor, so this state fully determines the future.
json Checkpointer::trainer_state(int64_t step) const {
  const TrainConfig& tc = rc_.train;
  json state = {{"step", step},
                {"format", "foundry-trainer-state"},
                {"seed", tc.seed},
                {"optimizer", optimizer_name(tc.optimizer)},
                {"config", rc_.source}};
  if (train_loader_) state["data_cursor"] = train_loader_->cursor();
  if (tokenizer_checksum_) state["tokenizer_xxh3_64"] = hash64_hex(*tokenizer_checksum_);
  // The balancers are model state outside the parameter slab: saved here in full (bias and
  // its AdamW state, for a bitwise resume) and, as biases only, in model.safetensors.
  if (!model_.balancers().empty()) state["router_balancers"] = model_.balancer_state();
  if (save_hook_) save_hook_(state);
  state["schedule"] = {{"lr", learning_rate(schedule_, std::max<int64_t>(step, 1))},
                       {"total_steps", schedule_.total_steps}};
  return state;
}

void Checkpointer::save(int64_t step) {
  const double t0 = save_started_ = now_seconds();
  if (in_flight_) {
    if (rc_.train.checkpoint_overlap == CheckpointOverlap::skip) {
      if (processes_.root())
        std::fprintf(stderr, "skipping the checkpoint of step %lld: step %lld is still being "
                             "written (train.checkpoint_overlap = skip)\n",
                     static_cast<long long>(step), static_cast<long long>(step_));
      return;
    }
    if (processes_.root())
      std::fprintf(stderr, "checkpoint of step %lld waits for step %lld to be written\n",
                   static_cast<long long>(step), static_cast<long long>(step_));
    finish();
  }
  plan(step);
  if (rc_.train.checkpoint_async) {
    // The copy runs beside the next step's forward and backward, which change neither the
    // parameters nor the optimizer state; protect_state() waits for it before they change.
    snapshot_pending_ = true;
    writer_ = std::thread([this] {
      copy_snapshot();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        snapshot_pending_ = false;
      }
      snapshot_done_.notify_all();
      // The write yields the cores to training: on a machine whose cores all compute, a
      // writer at equal priority preempts OpenMP threads and stalls every parallel region.
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kWriterNice);
      write_shard();
    });
  } else {
    write_shard();  // straight from the live buffers: nothing changes them meanwhile
    commit();
  }
  blocked_seconds_ = now_seconds() - t0;
}

void Checkpointer::protect_state() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!snapshot_pending_) return;
  const double t0 = now_seconds();
  snapshot_done_.wait(lock, [this] { return !snapshot_pending_; });
  blocked_seconds_ += now_seconds() - t0;
}

// What this rank saves: its share of the parameters and its optimizer state runs, pointing
// at the live buffers (copy_snapshot points them at the snapshot instead).
void Checkpointer::plan(int64_t step) {
  in_flight_ = true;
  step_ = step;
  state_ = trainer_state(step);
  staging_ = staging_dir(rc_.train.run_dir, step, tag_);
  const SlabInterval params = optimizer_.parameters_to_save();
  runs_.clear();
  runs_.push_back({"", params.begin, params.end, model_.params() + params.begin});
  for (const StateRun& r : optimizer_.states_to_save_runs())
    runs_.push_back({r.state, r.begin, r.end, r.data});
  written_ = false;
  shard_.clear();
  error_.clear();
}

// Copies every run into the reused snapshot buffer and points the runs at the copies.
void Checkpointer::copy_snapshot() {
  const double t0 = now_seconds();
  int64_t total = 0;
  for (const SlabRun& r : runs_) total += r.end - r.begin;
  if (static_cast<int64_t>(buffer_.size()) < total) buffer_.resize(static_cast<size_t>(total));
  float* at = buffer_.data();
  for (SlabRun& r : runs_) {
    std::memcpy(at, r.data, static_cast<size_t>(r.end - r.begin) * sizeof(float));
    r.data = at;
    at += r.end - r.begin;
  }
  snapshot_seconds_ = now_seconds() - t0;
}

void Checkpointer::write_shard() {
  try {
    const double t0 = now_seconds();
    json shard = write_rank_shard(staging_, processes_.rank(), model_.table(), runs_);
    shard["write_seconds"] = now_seconds() - t0;
    shard_ = shard.dump();
  } catch (const std::exception& e) {
    error_ = e.what();
  }
  written_ = true;
}

void Checkpointer::poll() {
  if (!in_flight_) return;
  int64_t written = written_ ? 1 : 0;
  if (const Communicator* w = processes_.world()) w->allreduce(&written, &written, 1, ReduceOp::min);
  if (written) commit();
}

void Checkpointer::finish() {
  if (!in_flight_) return;
  commit();
}

// "saved checkpoint DIR: 704.9 MB from 2 ranks, written in 0.989 s (357 MB/s by the slowest
// rank); the step loop was blocked 0.000 s (its snapshot took 0.065 s beside the next step),
// the commit 0.011 s".
void Checkpointer::report_save(const std::string& path, const std::vector<json>& shards,
                               double commit_seconds) const {
  double bytes = 0, write_seconds = 0;
  for (const json& s : shards) {
    bytes += s.at("bytes").get<double>();
    write_seconds = std::max(write_seconds, s.at("write_seconds").get<double>());
  }
  // A synchronous save is reported from inside save(): the loop has been blocked since it
  // began.
  const double blocked =
      rc_.train.checkpoint_async ? blocked_seconds_ : now_seconds() - save_started_;
  const std::string how =
      rc_.train.checkpoint_async
          ? fmt::format("its snapshot took {:.3f} s beside the next step", snapshot_seconds_)
          : std::string("a synchronous save");
  std::fprintf(stderr,
               "saved checkpoint %s: %.1f MB from %zu ranks, written in %.3f s (%.0f MB/s by the "
               "slowest rank); the step loop was blocked %.3f s (%s), the commit %.3f s\n",
               path.c_str(), bytes / 1e6, shards.size(), write_seconds,
               bytes / shards.size() / 1e6 / std::max(write_seconds, 1e-9), blocked, how.c_str(),
               commit_seconds);
}

void Checkpointer::commit() {
  if (writer_.joinable()) writer_.join();
  const double t0 = now_seconds();
  in_flight_ = false;
  auto g = processes_.guard(fmt::format("checkpoint of step {}", step_));
  // Every rank learns every rank's outcome; the descriptions travel with them.
  const std::string mine = error_.empty() ? "ok " + shard_ : "error " + error_;
  std::vector<std::string> all = {mine};
  if (const Communicator* w = processes_.world()) all = allgather_strings(*w, mine);
  std::vector<std::string> failures;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].starts_with("error "))
      failures.push_back(fmt::format("rank {}: {}", r, all[r].substr(6)));
  if (!failures.empty())
    fail(fmt::format("the checkpoint of step {} failed: {}", step_, fmt::join(failures, "; ")),
         "the previous checkpoint is intact; fix the cause (space, permissions) and resume");
  std::string outcome = "ok";
  if (processes_.root()) {
    try {
      std::vector<json> shards;
      for (const std::string& s : all) shards.push_back(json::parse(s.substr(3)));
      const SavedLayout layout{processes_.ranks(), static_cast<int>(rc_.train.expert_parallel),
                               rc_.train.zero1 && processes_.ranks() > 1};
      const std::string path =
          commit_sharded_checkpoint(rc_.train.run_dir, staging_, step_, rc_.model, model_.table(),
                                    shards, state_, layout, rc_.train.keep_checkpoints);
      if (!quiet_) report_save(path, shards, now_seconds() - t0);
    } catch (const std::exception& e) {
      outcome = e.what();
    }
  }
  // Every rank learns the commit's outcome: nobody goes on past a failed one.
  if (const Communicator* w = processes_.world()) outcome = allgather_strings(*w, outcome)[0];
  if (outcome != "ok")
    fail(fmt::format("the checkpoint of step {} failed: rank 0: {}", step_, outcome),
         "the previous checkpoint is intact; fix the cause (space, permissions) and resume");
}

}  // namespace foundry
