#include "train/checkpointer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "base/build_info.h"
#include "base/error.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/timer.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/fault.h"
#include "ckpt/model_state.h"
#include "ckpt/sharded.h"
#include "comm/agree.h"
#include "comm/comm.h"
#include "model/model.h"
#include "train/memory_tier.h"

namespace foundry {

namespace {
constexpr char kTokenizerChecksumKey[] = "tokenizer_xxh3_64";
constexpr char kUnwrittenMetricsKey[] = "unwritten_metrics";
}  // namespace

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
  disk_.root = rc.train.run_dir;
  disk_.keep = rc.train.keep_checkpoints;
  // The snapshot buffer: mapped once here, backed by memory as the first save copies into it
  // (beside a step, not before the first one: a restart waits for none of it).
  // What lives in device memory goes to a buffer of the tier's own instead, allocated here:
  // page-locking takes seconds, which no save should wait for.
  if (rc.train.checkpoint_async) {
    const SlabRange params = optimizer.parameters_to_save();
    int64_t total = model.on_device() ? 0 : params.end - params.begin;
    for (const StateRun& r : optimizer.live_state_runs())
      if (!r.on_device) total += r.end - r.begin;
    if (total > 0) buffer_ = PageSlab<float>(static_cast<size_t>(total));
  }
  allocate_device_snapshot(disk_);
  if (rc.train.memory_checkpoint_every > 0) open_memory_tier();
  if (processes.root()) {
    remove_unfinished_saves(disk_.root);
    if (!memory_.root.empty()) remove_unfinished_saves(memory_.root);
  }
}

// What saves of an earlier attempt left unfinished (a process killed, a disk that filled up
// mid-save) holds space the saves of this one need: removed before the first, and said.
void Checkpointer::remove_unfinished_saves(const std::string& run_dir) const {
  const std::string root = checkpoints_root(run_dir);
  if (!path_exists(root)) return;
  try {
    const std::vector<std::string> removed = remove_leftovers(root);
    if (!removed.empty() && !quiet_)
      std::fprintf(stderr, "removed what %zu unfinished checkpoint save%s left in %s: %s\n",
                   removed.size(), removed.size() == 1 ? "" : "s", root.c_str(),
                   fmt::format("{}", fmt::join(removed, ", ")).c_str());
  } catch (const Error& e) {
    warn(e.what());
  }
}

Checkpointer::~Checkpointer() {
  for (Tier* tier : {&disk_, &memory_}) {
    if (tier->writer.joinable()) tier->writer.join();
    if (tier->device_snapshot) {
      model_.backend().wait_host_copies();  // none may land in a released block
      model_.backend().release_host(tier->device_snapshot);
    }
  }
}

// ---- the memory tier ------------------------------------------------------------------------

// Turns the memory tier on when every rank runs on this host (TrainingRun checked its
// directory and room before the run started). Collective.
void Checkpointer::open_memory_tier() {
  std::vector<std::string> hosts = {host_name()};
  if (const Communicator* w = processes_.world()) hosts = allgather_strings(*w, hosts[0]);
  for (const std::string& h : hosts)
    if (h != hosts[0]) {
      if (processes_.root())
        warn(
            fmt::format("in-memory checkpoints are off: the ranks run on several hosts ({} and "
                        "{}), and a rank restarted elsewhere could not read them",
                        hosts[0], h));
      return;
    }
  memory_.root = memory_tier_root(rc_.train);
  memory_.keep = 2;
  allocate_device_snapshot(memory_);
}

SavesDue saves_due(const TrainConfig& tc, int64_t step, bool last, bool completes) {
  SavesDue due;
  const bool at_end = last && (tc.checkpoint_at_end || !completes);
  due.durable = at_end || (tc.checkpoint_every > 0 && step % tc.checkpoint_every == 0);
  due.memory = !last && tc.memory_checkpoint_every > 0 && step % tc.memory_checkpoint_every == 0;
  return due;
}

void Checkpointer::save_in_memory(int64_t step) {
  if (memory_.root.empty() || memory_.in_flight) return;
  memory_.started = now_seconds();
  plan(memory_, step);
  memory_.state[kDurableStepKey] = durable_step_;
  memory_.state[kDurableInFlightKey] = disk_.in_flight ? disk_.step : 0;
  if (durable_step_ > 0)
    memory_.state[kDurableChecksumKey] =
        durable_checkpoint_checksum(rc_.train.run_dir, durable_step_);
  // The older of the two committed checkpoints lends its files (and their pages) to this one.
  const std::vector<CheckpointDir> kept = list_checkpoint_dirs(memory_.root);
  memory_.recycle = kept.size() >= 2 ? kept.front().path : "";
  // Straight from the live buffers, beside the next step's forward and backward, which
  // change neither; protect_state() waits for the whole write before they change. At normal
  // priority: the optimizer step waits for it.
  memory_.snapshot_pending = true;
  memory_.writer = std::thread([this] {
    if (device_copies_arrived(memory_)) write_shard(memory_);
    release_snapshot(memory_);
  });
  memory_.blocked_seconds = now_seconds() - memory_.started;
}

// On or off: what an earlier process of the run left there goes too.
void Checkpointer::retire_memory_tier() {
  if (!memory_.root.empty()) finish();
  if (processes_.root()) remove_all(memory_tier_location(rc_.train));
}

void Checkpointer::clear_memory_tier() {
  if (processes_.root()) remove_all(memory_tier_location(rc_.train));
}

// ---- resume ---------------------------------------------------------------------------------

// What this rank holds: every parameter it stores, every optimizer state element it keeps.
float* Checkpointer::host_params() {
  if (!model_.on_device()) return model_.params();
  // Pages only where the load writes: a rank of sharded expert storage pays for its share (the
  // holes also keep huge pages from backing their edges).
  host_params_ = PageSlab<float>(static_cast<size_t>(model_.slab_size()));
  host_params_.set_holes(model_.released_param_ranges());
  return host_params_.data();
}

std::vector<SlabTarget> Checkpointer::load_targets() {
  std::vector<SlabTarget> targets;
  float* params = host_params();
  for (const auto& [b, e] : complement(model_.released_param_ranges(), model_.slab_size()))
    targets.push_back({"", b, e, params + b});
  for (const StateRun& r : optimizer_.states_to_load_runs())
    targets.push_back({r.state, r.begin, r.end, r.data});
  return targets;
}

void check_checkpoint_tokenizer(const std::string& dir, const json& saved_state, uint64_t checksum,
                                const std::string& source) {
  auto saved = saved_state.find(kTokenizerChecksumKey);
  if (saved == saved_state.end()) return;
  const std::string mine = hash64_hex(checksum);
  if (*saved != mine)
    fail(fmt::format("{} was trained with a tokenizer of XXH3-64 {}, {} has {}", dir,
                     saved->is_string() ? saved->get<std::string>() : saved->dump(), source, mine),
         "use the dataset (or its tokenizer.model) the model was trained on");
}

void warn_if_synthetic(const std::string& dir, const json& saved_state, const std::string& source) {
  if (saved_state.contains("data_cursor") || saved_state.contains(kTokenizerChecksumKey)) return;
  warn(
      fmt::format("{} was trained on random tokens (--synthetic-data), not on text: what it "
                  "gives on {} means nothing beyond a smoke test",
                  dir, source));
}

void Checkpointer::check_same_tokenizer(const std::string& dir, const json& state) const {
  if (tokenizer_checksum_)
    check_checkpoint_tokenizer(dir, state, *tokenizer_checksum_,
                               fmt::format("data.dir '{}'", rc_.data.dir));
}

// The checkpoints to try, newest first: the memory tier's when a resume may use it
// (train/memory_tier.h), the one find_latest_checkpoint picks, then the older ones (a
// checkpoint whose data fails its checksums while loading is skipped).
std::vector<std::string> Checkpointer::resume_candidates() const {
  std::vector<std::string> candidates;
  const std::string& run_dir = rc_.train.run_dir;
  const auto latest = find_latest_checkpoint(run_dir);
  if (!memory_.root.empty()) {
    if (auto memory = usable_memory_checkpoint(rc_.train, latest)) candidates.push_back(*memory);
  } else if (processes_.root()) {
    if (auto unused = usable_memory_checkpoint(rc_.train, latest, /*even_when_off=*/true))
      warn(
          fmt::format("{} is newer than the run directory's checkpoints and is left unused: "
                      "in-memory checkpoints are off in this run (train.memory_checkpoint_every "
                      "= 0, or ranks on several hosts), which goes on from the run directory's "
                      "checkpoint",
                      *unused));
  }
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
  const double t0 = now_seconds();
  // A device model's host copy lives only while loading, whichever way this returns.
  struct ReleaseHostCopy {
    PageSlab<float>& copy;
    ~ReleaseHostCopy() { copy = PageSlab<float>(); }
  } release_host_copy{host_params_};
  const std::vector<std::string> candidates = resume_candidates();
  std::string newest_failure;  // why the newest checkpoint could not be loaded
  for (const std::string& dir : candidates) {
    // Before loading anything: a checkpoint of the other optimizer lacks (or has extra)
    // state, and the plain message says more than a missing tensor would.
    check_same_optimizer(dir, read_checkpoint_trainer_state(dir), rc_.train.optimizer);
    if (processes_.root() && !quiet_)  // a large one loads for minutes: say which, from where
      std::fprintf(stderr, "loading %s ...\n", dir.c_str());
    auto g = processes_.guard("loading " + dir);
    if (std::optional<json> state = load_on_every_rank(dir, newest_failure)) {
      const int64_t step = restore_from(dir, *state, t0);
      drop_newer_memory_checkpoints(step);
      return step;
    }
  }
  // A failed load may have written part of the state: never train on from there.
  if (!candidates.empty())
    fail(fmt::format("no checkpoint in {}/checkpoints could be loaded; the newest, {}",
                     rc_.train.run_dir, newest_failure),
         "restore the checkpoint files, resume with the config they were written with, or "
         "start a new run directory");
  return 0;
}

// In-memory checkpoints newer than the step this run goes on from (the tier off, or its
// checkpoint unloadable) hold steps this run replaces: a later resume must not go back to
// them, so they go (the tier lives on one host: rank 0's).
void Checkpointer::drop_newer_memory_checkpoints(int64_t step) const {
  if (!processes_.root()) return;
  const std::string location = memory_tier_location(rc_.train);
  if (!path_exists(location)) return;
  try {  // rank 0 alone: a failure here must not leave the other ranks waiting
    for (const CheckpointDir& d : list_checkpoint_dirs(location)) {
      if (d.step <= step) continue;
      warn(
          fmt::format("removing the in-memory checkpoint {}: this run goes on from step {} and "
                      "replaces its steps",
                      d.path, step));
      remove_all(d.path);
    }
  } catch (const Error& e) {
    warn(
        fmt::format("cannot remove the newer in-memory checkpoints in {}: {}", location, e.what()));
  }
}

std::optional<json> Checkpointer::load_on_every_rank(const std::string& dir,
                                                     std::string& newest_failure) {
  json state;
  std::string error;
  try {
    state = load_checkpoint_targets(dir, rc_.model, model_.table(), load_targets(), load_progress_);
  } catch (const Error& e) {
    error = e.what();
  }
  // Every rank loads from the same checkpoint: a fault one rank found rules it out for all.
  std::vector<std::string> errors = {error};
  if (const Communicator* w = processes_.world()) errors = allgather_strings(*w, error);
  std::vector<std::string> failures;
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) failures.push_back(fmt::format("rank {}: {}", r, errors[r]));
  if (failures.empty()) return state;
  if (processes_.root())
    warn(fmt::format("skipping checkpoint {}: {}", dir, fmt::join(failures, "; ")));
  if (newest_failure.empty())
    newest_failure = fmt::format("{}: {}", dir, fmt::join(failures, "; "));
  return std::nullopt;
}

int64_t Checkpointer::restore_from(const std::string& dir, const json& state, double started) {
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
  } else if (state.contains("data_cursor")) {
    fail(fmt::format("{} was written by a run on a dataset (it has a data cursor); "
                     "--synthetic-data would go on with random tokens, and the run could not go "
                     "back to its data",
                     dir),
         "resume without --synthetic-data (data.dir names the dataset), or train on random "
         "tokens in a new run directory");
  }
  restore_router_balancers(model_, state, dir, /*required=*/true);
  if (restore_hook_) restore_hook_(state);
  if (const auto it = state.find(kUnwrittenMetricsKey); it != state.end() && it->is_object())
    resumed_metrics_ = *it;
  if (model_.on_device())
    model_.write_params(host_params_.data());  // and the bf16 copy
  else
    model_.sync_weights();
  // Checkpoints before the count was saved: as if the batch had never changed.
  tokens_base_ = state.value("tokens", step * tokens_per_step());
  tokens_base_step_ = step;
  const bool from_memory = state.contains(kDurableStepKey);
  durable_step_ = from_memory ? state.at(kDurableStepKey).get<int64_t>() : step;
  if (processes_.root()) {
    std::fprintf(stderr, "resumed from %s%s (step %lld, loaded in %.2f s)\n", dir.c_str(),
                 from_memory ? ", an in-memory checkpoint" : "", static_cast<long long>(step),
                 now_seconds() - started);
    warn_schedule_change(state, step);
  }
  return step;
}

// train.steps (or --steps) may change on a resume, and a decaying schedule then takes
// another shape from this step on: said, with the learning rate the next step gets.
void Checkpointer::warn_schedule_change(const json& state, int64_t step) const {
  const json* saved = state.contains("schedule") ? &state.at("schedule") : nullptr;
  if (!saved || !saved->is_object() || !saved->contains("total_steps") ||
      !saved->at("total_steps").is_number_integer())
    return;  // kept for the record only: nothing to compare with
  // The checkpoint's own schedule: its recorded config's (train.lr and the rest may have
  // changed with --allow-config-change, which says so itself), over the steps it spanned.
  LrSchedule before = schedule_;
  if (state.contains("config")) try {
      before = lr_schedule(parse_run_config(state.at("config"), "the checkpoint's config").train);
    } catch (const Error&) {
      before = schedule_;  // a config this build does not read: the span alone is compared
    }
  before.total_steps = saved->at("total_steps").get<int64_t>();
  if (before.total_steps == schedule_.total_steps) return;
  const double was = learning_rate(before, step + 1), is = learning_rate(schedule_, step + 1);
  if (was == is) return;  // a constant schedule, or one still warming up
  warn(
      fmt::format("the learning-rate schedule now spans {} steps instead of the checkpoint's "
                  "{}: step {} trains at lr {:.3g} instead of the checkpoint schedule's {:.3g}",
                  schedule_.total_steps, before.total_steps, step + 1, is, was));
}

int64_t Checkpointer::rollback() {
  finish();
  if (resume_candidates().empty()) return -1;
  return resume();
}

// ---- save -----------------------------------------------------------------------------------

// Everything random in training derives from the seed and the step (initialization,
// synthetic batches) or lives in the data cursor, so this state fully determines the future.
json Checkpointer::trainer_state(int64_t step) const {
  const TrainConfig& tc = rc_.train;
  json state = {
      {"step", step},    {"format", "foundry-trainer-state"},         {"foundry", build_commit()},
      {"seed", tc.seed}, {"optimizer", optimizer_name(tc.optimizer)}, {"config", rc_.source}};
  if (train_loader_) state["data_cursor"] = train_loader_->cursor();
  if (tokenizer_checksum_) state[kTokenizerChecksumKey] = hash64_hex(*tokenizer_checksum_);
  // The balancers are model state outside the parameter slab: saved here in full (bias and
  // its AdamW state, for a bitwise resume) and, as biases only, in model.safetensors.
  if (!model_.balancers().empty()) state["router_balancers"] = model_.balancer_state();
  if (save_hook_) save_hook_(state);
  if (unwritten_metrics_.is_object() && unwritten_metrics_.value("step", int64_t{-1}) == step)
    state[kUnwrittenMetricsKey] = unwritten_metrics_;
  state["tokens"] = tokens_at(step);
  state["schedule"] = {{"lr", learning_rate(schedule_, std::max<int64_t>(step, 1))},
                       {"total_steps", schedule_.total_steps}};
  return state;
}

void Checkpointer::save(int64_t step, bool last) {
  const double t0 = disk_.started = now_seconds();
  if (disk_.in_flight) {
    if (rc_.train.checkpoint_overlap == CheckpointOverlap::skip && !last) {
      if (processes_.root())
        std::fprintf(stderr,
                     "skipping the checkpoint of step %lld: step %lld is still being "
                     "written (train.checkpoint_overlap = skip)\n",
                     static_cast<long long>(step), static_cast<long long>(disk_.step));
      return;
    }
    if (processes_.root() && !quiet_)
      std::fprintf(stderr, "checkpoint of step %lld waits for step %lld to be written\n",
                   static_cast<long long>(step), static_cast<long long>(disk_.step));
    commit(disk_);
  }
  plan(disk_, step);
  if (rc_.train.checkpoint_async) {
    // The copy runs beside the next step's forward and backward, which change neither the
    // parameters nor the optimizer state; protect_state() waits for it before they change.
    disk_.snapshot_pending = true;
    disk_.writer = std::thread([this] {
      const bool copied = copy_snapshot(disk_);
      release_snapshot(disk_);
      if (!copied) return;
      // The write yields the cores to training: on a machine whose cores all compute, a
      // writer at equal priority preempts OpenMP threads and stalls every parallel region.
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kWriterNice);
      write_shard(disk_);
    });
  } else {
    wait_device_copies(disk_);
    write_shard(disk_);  // straight from the live buffers: nothing changes them meanwhile
    commit(disk_);
  }
  disk_.blocked_seconds = now_seconds() - t0;
}

// The writer thread: the live buffers are no longer read, protect_state() may return.
void Checkpointer::release_snapshot(Tier& tier) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tier.snapshot_pending = false;
  }
  snapshot_done_.notify_all();
}

void Checkpointer::protect_state() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (Tier* tier : {&disk_, &memory_}) {
    if (!tier->snapshot_pending) continue;
    const double t0 = now_seconds();
    snapshot_done_.wait(lock, [tier] { return !tier->snapshot_pending; });
    tier->blocked_seconds += now_seconds() - t0;
  }
}

namespace {

// Copies of device runs into consecutive places of a host snapshot, queued beside the work
// that follows; runs that follow each other on the device go as one copy.
class SnapshotCopies {
 public:
  SnapshotCopies(Backend& backend, float* snapshot, int64_t capacity)
      : backend_(backend), snapshot_(snapshot), capacity_(capacity) {}
  ~SnapshotCopies() { flush(); }
  // Where `n` floats from `src` will be once the copies are done.
  const float* queue(const float* src, int64_t n) {
    FOUNDRY_CHECK(snapshot_ && used_ + n <= capacity_);
    float* dst = snapshot_ + used_;
    used_ += n;
    if (pending_ > 0 && src == from_ + pending_) {
      pending_ += n;
    } else {
      flush();
      from_ = src, to_ = dst, pending_ = n;
    }
    return dst;
  }
  void flush() {
    if (pending_ > 0)
      backend_.to_host_async(to_, from_, pending_ * static_cast<int64_t>(sizeof(float)));
    pending_ = 0;
  }

 private:
  Backend& backend_;
  float* snapshot_;
  int64_t capacity_, used_ = 0;
  const float* from_ = nullptr;
  float* to_ = nullptr;
  int64_t pending_ = 0;
};

}  // namespace

int64_t Checkpointer::device_floats() {
  const SlabRange params = optimizer_.parameters_to_save();
  int64_t n = model_.on_device() ? params.end - params.begin : 0;
  for (const StateRun& r : optimizer_.live_state_runs())
    if (r.on_device) n += r.end - r.begin;
  return n;
}

void Checkpointer::allocate_device_snapshot(Tier& tier) {
  if (tier.device_snapshot) return;
  const int64_t n = device_floats();
  if (n == 0) return;
  tier.device_snapshot = static_cast<float*>(
      model_.backend().allocate_host(n * static_cast<int64_t>(sizeof(float))));
  tier.device_snapshot_floats = n;
}

void Checkpointer::wait_device_copies(Tier& tier) {
  if (tier.device_copies) model_.backend().wait_host_copies();
}

bool Checkpointer::device_copies_arrived(Tier& tier) {
  try {
    wait_device_copies(tier);
    return true;
  } catch (const std::exception& e) {
    tier.error = e.what();
    tier.written = true;
    return false;
  }
}

// What this rank saves: its share of the parameters and its optimizer state runs, pointing
// at the live buffers (copy_snapshot points them at the snapshot instead), or for what lives
// in device memory at the tier's copy of it, whose copies this queues.
void Checkpointer::plan(Tier& tier, int64_t step) {
  tier.in_flight = true;
  tier.step = step;
  tier.state = trainer_state(step);
  tier.staging = staging_dir(tier.root, step, tag_);
  tier.runs.clear();
  tier.snapshotted.clear();
  tier.device_copies = false;
  allocate_device_snapshot(tier);
  {
    SnapshotCopies copies(model_.backend(), tier.device_snapshot, tier.device_snapshot_floats);
    auto add = [&](const std::string& slab, int64_t begin, int64_t end, const float* data,
                   bool on_device) {
      if (on_device) data = copies.queue(data, end - begin);
      tier.device_copies |= on_device;
      tier.runs.push_back({slab, begin, end, data});
      tier.snapshotted.push_back(on_device);
    };
    const SlabRange params = optimizer_.parameters_to_save();
    add("", params.begin, params.end, model_.params() + params.begin, model_.on_device());
    for (const StateRun& r : optimizer_.live_state_runs())
      add(r.state, r.begin, r.end, r.data, r.on_device);
  }
  tier.copies_queued = now_seconds();
  tier.written = false;
  tier.recycle.clear();
  tier.shard.clear();
  tier.error.clear();
}

// Waits for the copies out of device memory, then copies every run still pointing at live
// host buffers into the reused snapshot buffer and points those runs at the copies. False
// when the device copies failed (device_copies_arrived).
bool Checkpointer::copy_snapshot(Tier& tier) {
  if (!device_copies_arrived(tier)) return false;
  int64_t total = 0;
  for (size_t i = 0; i < tier.runs.size(); ++i)
    if (!tier.snapshotted[i]) total += tier.runs[i].end - tier.runs[i].begin;
  if (static_cast<int64_t>(buffer_.size()) < total)
    buffer_ = PageSlab<float>(static_cast<size_t>(total));
  float* at = buffer_.data();
  for (size_t i = 0; i < tier.runs.size(); ++i) {
    if (tier.snapshotted[i]) continue;
    SlabRun& r = tier.runs[i];
    std::memcpy(at, r.data, static_cast<size_t>(r.end - r.begin) * sizeof(float));
    r.data = at;
    at += r.end - r.begin;
  }
  tier.snapshot_seconds = now_seconds() - tier.copies_queued;
  return true;
}

void Checkpointer::write_shard(Tier& tier) {
  try {
    const double t0 = now_seconds();
    json shard =
        write_rank_shard(tier.staging, processes_.rank(), model_.table(), tier.runs, tier.recycle);
    shard["write_seconds"] = now_seconds() - t0;
    tier.shard = shard.dump();
  } catch (const std::exception& e) {
    tier.error = e.what();
  }
  tier.written = true;
}

void Checkpointer::poll() {
  if (!disk_.in_flight && !memory_.in_flight) return;
  // Per tier: 1 when nothing is in flight or every rank has written it.
  int64_t written[2] = {!disk_.in_flight || disk_.written ? 1 : 0,
                        !memory_.in_flight || memory_.written ? 1 : 0};
  if (const Communicator* w = processes_.world()) w->allreduce(written, written, 2, ReduceOp::min);
  if (disk_.in_flight && written[0]) commit(disk_);
  if (memory_.in_flight && written[1]) commit(memory_);
}

void Checkpointer::finish() {
  if (disk_.in_flight) commit(disk_);
  if (memory_.in_flight) commit(memory_);
}

// "saved checkpoint DIR: 704.9 MB from 2 ranks, written in 0.989 s (357 MB/s by the slowest
// rank, direct I/O); the step loop was blocked 0.000 s (its snapshot took 0.065 s beside the next
// step), the commit 0.011 s".
void Checkpointer::report_save(const Tier& tier, const std::string& path,
                               const std::vector<json>& shards, double commit_seconds) const {
  double bytes = 0, write_seconds = 0;
  bool direct = true;
  for (const json& s : shards) {
    bytes += s.at("bytes").get<double>();
    write_seconds = std::max(write_seconds, s.at("write_seconds").get<double>());
    direct = direct && s.value("direct_io", false);
  }
  // A synchronous save is reported from inside save(): the loop has been blocked since it
  // began.
  const double blocked =
      rc_.train.checkpoint_async ? tier.blocked_seconds : now_seconds() - tier.started;
  const std::string how =
      rc_.train.checkpoint_async
          ? fmt::format("its snapshot took {:.3f} s beside the next step", tier.snapshot_seconds)
          : std::string("a synchronous save");
  std::fprintf(stderr,
               "saved checkpoint %s: %.1f MB from %zu ranks, written in %.3f s (%.0f MB/s by the "
               "slowest rank%s); the step loop was blocked %.3f s (%s), the commit %.3f s\n",
               path.c_str(), bytes / 1e6, shards.size(), write_seconds,
               bytes / shards.size() / 1e6 / std::max(write_seconds, 1e-9),
               direct ? ", direct I/O" : "", blocked, how.c_str(), commit_seconds);
}

// A durable save that failed: its unfinished directory is removed (it would hold the space a
// resume needs), and the error says what stands and what to do.
void Checkpointer::fail_durable_save(const Tier& tier, const std::string& outcome) const {
  std::string removed;
  if (processes_.root()) {
    std::error_code ec;
    std::filesystem::remove_all(tier.staging, ec);
    removed = ec ? fmt::format("; its unfinished '{}' could not be removed ({})", tier.staging,
                               ec.message())
                 : "; its unfinished files were removed";
  }
  const std::string stands =
      durable_step_ > 0
          ? fmt::format("the checkpoint of step {} is intact: resume from it with --resume",
                        durable_step_)
          : "no earlier checkpoint of this run was saved: run again once fixed";
  fail(fmt::format("the checkpoint of step {} failed: {}{}", tier.step, outcome, removed),
       io_error_hint(outcome, tier.staging, "fix the cause (space, permissions)") + "; " + stands);
}

void Checkpointer::commit(Tier& tier) {
  if (tier.writer.joinable()) tier.writer.join();
  const double t0 = now_seconds();
  tier.in_flight = false;
  auto g = processes_.guard(fmt::format("{} of step {}", tier.name, tier.step));
  // Every rank learns every rank's outcome; the descriptions travel with them.
  const std::string mine = tier.error.empty() ? "ok " + tier.shard : "error " + tier.error;
  std::vector<std::string> all = {mine};
  if (const Communicator* w = processes_.world()) all = allgather_strings(*w, mine);
  std::vector<std::string> failures;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].starts_with("error "))
      failures.push_back(fmt::format("rank {}: {}", r, all[r].substr(6)));
  std::string outcome = "ok";
  if (!failures.empty()) {
    outcome = fmt::format("{}", fmt::join(failures, "; "));
  } else if (processes_.root()) {
    try {
      std::vector<json> shards;
      for (const std::string& s : all) shards.push_back(json::parse(s.substr(3)));
      const SavedLayout layout{processes_.ranks(), static_cast<int>(rc_.train.expert_parallel),
                               rc_.train.zero1 && processes_.ranks() > 1,
                               static_cast<int>(rc_.train.context_parallel)};
      const std::string path =
          commit_sharded_checkpoint(tier.root, tier.staging, tier.step, rc_.model, model_.table(),
                                    shards, tier.state, layout, tier.keep);
      if (!quiet_ && &tier == &disk_) report_save(tier, path, shards, now_seconds() - t0);
    } catch (const std::exception& e) {
      outcome = "rank 0: " + std::string(e.what());
    }
  }
  // Every rank learns the commit's outcome: nobody goes on past a failed one.
  if (const Communicator* w = processes_.world()) outcome = allgather_strings(*w, outcome)[0];
  if (outcome == "ok") {
    if (&tier == &disk_) durable_step_ = tier.step;
    return;
  }
  if (&tier == &disk_) fail_durable_save(tier, outcome);
  // The memory tier only shortens restarts: the run goes on without it.
  if (processes_.root()) {
    warn(
        fmt::format("the in-memory checkpoint of step {} failed ({}); in-memory checkpoints "
                    "are off for the rest of this run",
                    tier.step, outcome));
    try {
      remove_all(tier.root);
    } catch (const Error& e) {
      warn(e.what());
    }
  }
  tier.root.clear();
}

}  // namespace foundry
