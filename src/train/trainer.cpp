#include "train/trainer.h"

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>

#include "base/error.h"
#include "base/exit_codes.h"
#include "base/format.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/progress.h"
#include "base/timer.h"
#include "ckpt/checkpoint_dir.h"
#include "comm/agree.h"
#include "comm/comm.h"
#include "cuda/nccl.h"
#include "cuda/runtime.h"
#include "data/dataset.h"
#include "kernels/gemm.h"
#include "model/backends.h"
#include "model/expert_parallel.h"
#include "model/info.h"
#include "optim/device_optimizer.h"
#include "optim/optimizer_kernels.h"
#include "train/checkpointer.h"
#include "train/evaluate.h"
#include "train/events.h"
#include "train/heartbeat.h"
#include "train/memory_tier.h"
#include "train/metrics.h"
#include "train/mfu.h"
#include "train/optimizer_config.h"
#include "train/preflight.h"
#include "train/processes.h"
#include "train/report.h"
#include "train/signals.h"
#include "train/train_fault.h"

namespace foundry {
using data::BatchLoader;
using data::Dataset;

namespace {

// Ranks started with different configs (or options that shape the run: its data, where it
// starts and stops) would train different models and exchange mismatched buffers: every rank
// compares the hash of its effective config and options with every other's before anything
// else is communicated, and all fail together, naming the ranks.
void check_same_config(const Communicator& world, const RunConfig& rc, const TrainOptions& opt) {
  const std::string text =
      rc.source.dump() + fmt::format("|synthetic {} start {} steps {} stop {} change {}",
                                     opt.synthetic_data, static_cast<int>(opt.start), opt.steps,
                                     opt.stop_at_step, opt.allow_config_change);
  const int64_t mine = static_cast<int64_t>(hash64(text.data(), text.size()) >> 1);
  std::vector<int64_t> all;
  const std::vector<int> differ = ranks_differing_from_root(world, {&mine, 1}, &all);
  if (!differ.empty()) {
    // A rank that differs names its own hash; the others, the first that differs.
    const bool mine_differs = std::find(differ.begin(), differ.end(), world.rank()) != differ.end();
    const int other = mine_differs ? world.rank() : differ.front();
    fail(fmt::format("rank {}: the run config or options of rank(s) {} differ from rank 0's "
                     "(config hash {} on rank 0, {} on rank {})",
                     world.rank(), format_rank_list(differ), hash64_hex(uint64_t(all[0])),
                     hash64_hex(uint64_t(all[size_t(other)])), other),
         "start every rank with the same --config, --set and options (--synthetic-data, "
         "--resume or --overwrite, --steps, --stop-at-step, --allow-config-change)");
  }
}

// The layout checks that must pass before anything is allocated or communicated.
void check_layout(const RunConfig& rc, const TrainOptions& opt, const Processes& procs) {
  // The same config on every rank first: the layout's verdict is then every rank's.
  if (procs.world()) check_same_config(*procs.world(), rc, opt);
  check_rank_layout(rc, procs.ranks(), procs.world() != nullptr, "this job");
  if (!opt.synthetic_data && rc.data.dir.empty())
    fail("no dataset: data.dir is empty",
         "prepare one with 'foundry data prepare' and set "
         "data.dir, or train on random tokens with --synthetic-data");
}

// A training run, assembled in order: processes, data, model, optimizer, checkpoints.
struct TrainingRun {
  const int exceptions_at_start = std::uncaught_exceptions();
  // On an error, the NCCL groups (expert, context and data parallel) are given up before
  // anything waits for the device (the checkpointer's pinned buffers, the model's memory): a
  // collective in flight could otherwise hold those waits forever.
  ~TrainingRun() {
    if (std::uncaught_exceptions() <= exceptions_at_start) return;
    if (ep_nccl) ep_nccl->abort();
    if (cp_nccl) cp_nccl->abort();
    if (optimizer) optimizer->abort_collectives();
  }
  TrainingRun(const RunConfig& rc, const TrainOptions& opt);

  const RunConfig& rc;
  const TrainConfig& tc;
  LrSchedule schedule;
  Processes procs;
  bool quiet;
  std::optional<Dataset> dataset;
  std::optional<BatchLoader> train_loader, val_loader;
  std::unique_ptr<Backend> backend;  // where the model computes (train.device)
  // The model's groups, before it: the model refers to them until it is gone.
  std::optional<ExpertParallelGroups> ep_groups;
  std::unique_ptr<gpu::NcclGroup> ep_nccl;  // the expert group over NCCL (GPUs of their own)
  std::optional<Communicator> cp_group;  // context parallel: C consecutive ranks
  std::unique_ptr<gpu::NcclGroup> cp_nccl;  // that group over NCCL (GPUs of their own)
  std::optional<Model> model;
  std::unique_ptr<DataParallelOptimizer> optimizer;
  bool overlap = false;  // the gradient reduction runs during backward
  bool overlap_held_back = false;  // asked for, but the exchanges use NCCL too
  std::optional<TrainBatches> batches;
  std::optional<Checkpointer> checkpointer;
  std::optional<RunDir> run_dir;  // locked for this run
  std::optional<Heartbeat> heartbeat;
  std::optional<AnomalyMonitor> anomalies;
  std::vector<std::string> config_changes;  // by --allow-config-change, logged once resumed
  MfuPeak peak;              // the MFU denominator (train/mfu.h)
  int64_t eval_batches = 0;  // train.eval_batches, or what the validation split holds
  // Seconds since the process started when each phase of the start-up was done: MPI and the
  // checks, the model and optimizer built (and initialized), the checkpoint loaded, the rest
  // before the first step (the MFU peak, the validation at step 0).
  struct {
    double checked = 0, built = 0, loaded = 0, ready = 0;
  } started;

  double evaluate() {
    if (!val_loader) return -1;
    auto g = procs.guard("validation");
    return evaluate_loss(*model, *val_loader, eval_batches, procs.world(),
                         micro_batch_rows(rc.train, batches->local_batch()));
  }
  // Validation at step 0, logged.
  double initial_evaluation() {
    const double loss = evaluate();
    if (!quiet) std::fprintf(stderr, "step 0 | val loss %.4f | ppl %.1f\n", loss, std::exp(loss));
    return loss;
  }
  bool evaluation_due(int64_t step) const {  // every train.eval_every steps
    return val_loader && tc.eval_every > 0 && step % tc.eval_every == 0;
  }
  RankMemory memory_now() const {
    return {double(peak_rss_bytes()), double(model->resident_slab_bytes())};
  }
  // Rank 0: metrics.jsonl (continued after `start_step`) and config.json; nothing elsewhere.
  std::optional<MetricsWriter> open_outputs(int64_t start_step) const {
    if (!procs.root()) return std::nullopt;
    std::optional<MetricsWriter> metrics = open_metrics(start_step);
    // The steps the run trains to (--steps overrides train.steps): what a resume from this
    // file continues to.
    json source = rc.source;
    source["train"]["steps"] = schedule.total_steps;
    // The run's own file: a link there (to the config it was started from) is replaced, not
    // written through.
    const std::string config_path = tc.run_dir + "/config.json";
    if (std::error_code ec; std::filesystem::is_symlink(config_path, ec))
      std::filesystem::remove(config_path, ec);
    write_file_atomic(config_path, source.dump(2) + "\n");
    return metrics;
  }
  // Rank 0's metrics.jsonl, continued after `start_step`, with the line of the resumed
  // checkpoint's own step when its append failed (a full disk), so it describes every step.
  std::optional<MetricsWriter> open_metrics(int64_t start_step) const {
    std::optional<MetricsWriter> metrics(std::in_place, join(tc.run_dir, kMetricsFile), start_step);
    if (const json& line = checkpointer->resumed_metrics();
        line.is_object() && line.value("step", int64_t{-1}) == start_step &&
        metrics->last_step() < start_step)
      metrics->write(line);
    return metrics;
  }
  void start_heartbeat();
  int64_t resume();
  void mark(int64_t step, const char* phase) {
    marked_step = step;
    if (heartbeat) heartbeat->progress(step, phase);
  }
  void starting(const char* phase) {  // before the first step's mark
    if (heartbeat) heartbeat->starting(phase);
  }
  int64_t marked_step = 0;
  void open_dataset();
  void build_model_and_optimizer();
  void watch_anomalies(bool resume);
  void begin_new_run();
  int64_t after_anomaly(int64_t step);
  void print_header() const;
};

// A run needs steps to take. train.steps below the step it resumes from is an error (those
// steps were trained already, and the run would end at once reporting nothing); equal to
// it, the run is complete (a restart after the final checkpoint) and train() returns.
void check_steps_left(int64_t start_step, int64_t total_steps, int64_t stop_at_step,
                      const std::string& run_dir) {
  if (start_step == 0 && total_steps == 0)
    fail("train.steps is 0: nothing to train",
         "set train.steps (or --steps) to the number of steps to train");
  if (start_step > total_steps)
    fail(fmt::format("train.steps = {} (or --steps) is below step {}, the step of the checkpoint "
                     "this run resumes from in '{}': there is nothing left to train",
                     total_steps, start_step, run_dir),
         fmt::format("pass --steps N with N above {} to train further", start_step));
  if (stop_at_step > 0 && (stop_at_step > total_steps || stop_at_step <= start_step)) {
    if (start_step == total_steps)
      fail(fmt::format("--stop-at-step {}: the run in '{}' is complete, at step {} = train.steps",
                       stop_at_step, run_dir, total_steps),
           fmt::format("pass --steps N with N above {} to train further", total_steps));
    fail(fmt::format("--stop-at-step {} is outside the steps this run trains, {} to {}",
                     stop_at_step, start_step + 1, total_steps),
         fmt::format("pass a step from {} to {}, or change --steps", start_step + 1, total_steps));
  }
}

// A resume trains on with the settings the run was trained with (RUN_DIR/config.json): a
// learning rate, batch or seed changed by a forgotten --set would make another run under the
// run's name. Changes meant as such pass with --allow-config-change, printed and logged.
// Deterministic on every rank (each reads the file), so no agreement is needed. Returns the
// changes, which the events log gets once the resume is accepted (train(): a resume refused on
// the way changes nothing of the run on disk; under launch, its heartbeat record stays in
// launch's heartbeat/).
std::vector<std::string> check_same_trajectory(const RunConfig& rc, bool allowed, bool root) {
  std::string path = rc.train.run_dir + "/config.json";
  std::string own = fmt::format("--config {} holds them all", path);
  RunConfig before;
  try {
    if (path_exists(path)) {
      before = load_run_config(path, {});
    } else {
      // Without the run's config.json, the config its latest checkpoint recorded.
      const std::optional<std::string> latest = find_latest_checkpoint(rc.train.run_dir);
      if (!latest) return {};
      path = "the config recorded in " + *latest;
      const json state = read_checkpoint_trainer_state(*latest);
      if (!state.contains("config")) return {};
      own = fmt::format("as recorded under \"config\" in {}'s trainer state", *latest);
      before = parse_run_config(state.at("config"), path);
    }
  } catch (const Error& e) {
    if (root)
      warn(fmt::format("cannot compare this resume's settings with {}: {}", path, e.what()));
    return {};
  }
  std::vector<std::string> changes = trajectory_changes(before.train, rc.train);
  for (std::string& c : balancer_changes(before.model, rc.model)) changes.push_back(std::move(c));
  if (changes.empty()) return {};
  if (!allowed)
    fail(fmt::format("this resume would train on with other settings than the run's ({}): {}", path,
                     fmt::join(changes, "; ")),
         fmt::format("resume with the run's own settings ({}), or pass --allow-config-change "
                     "to change them on purpose",
                     own));
  if (root)
    std::fprintf(stderr, "resume: changing %s\n",
                 fmt::format("{}", fmt::join(changes, "; ")).c_str());
  return changes;
}

// How data-parallel ranks on GPUs exchange gradients and weights (optim/device_optimizer.h),
// from every
// rank's GPU UUID and whether its build has NCCL (collective over `world`: every rank decides
// from the same figures).
GpuGradients gpu_gradients_of(const Communicator& world) {
  const std::array<int64_t, 2> uuid = gpu::current_gpu_uuid();
  const int64_t mine[3] = {uuid[0], uuid[1], gpu::built_with_nccl() ? 1 : 0};
  std::vector<int64_t> all(3 * static_cast<size_t>(world.size()));
  world.allgather(mine, all.data(), 3);
  std::vector<std::array<int64_t, 2>> gpus;
  bool nccl_everywhere = true;
  for (size_t r = 0; r < all.size(); r += 3) {
    gpus.push_back({all[r], all[r + 1]});
    nccl_everywhere = nccl_everywhere && all[r + 2] != 0;
  }
  return gpu_gradients_path(gpus, nccl_everywhere);
}

// This rank's GPU: the one train.device names, or for plain "cuda" under several ranks each
// rank of a host its own (its place among the host's ranks, modulo the GPUs it sees; more
// ranks than GPUs share them). Collective.
DeviceSpec rank_device(const DeviceSpec& device, const Processes& procs) {
  if (!device.cuda || device.index_given || !procs.world()) return device;
  DeviceSpec mine = device;
  const int gpus = gpu::visible_gpus();
  mine.index = gpus > 0 ? rank_on_this_host(*procs.world()) % gpus : 0;
  return mine;
}

// A schedule that never reaches its peak, or decays before its warmup ends, is legal but
// rarely meant.
void warn_about_schedule(const LrSchedule& s) {
  if (s.total_steps > 0 && s.warmup_steps > s.total_steps)
    warn(
        fmt::format("train.warmup_steps = {} is beyond the {} steps this run trains to: the "
                    "learning rate never reaches train.lr",
                    s.warmup_steps, s.total_steps));
  else if (s.kind == ScheduleKind::wsd &&
           s.total_steps - std::llround(s.decay_fraction * double(s.total_steps)) < s.warmup_steps)
    warn(fmt::format(
        "train.decay_fraction = {} starts the wsd decay at step {}, inside the "
        "warmup of {} steps: the learning rate never stays at train.lr",
        s.decay_fraction, s.total_steps - std::llround(s.decay_fraction * double(s.total_steps)),
        s.warmup_steps));
}

TrainingRun::TrainingRun(const RunConfig& rc_, const TrainOptions& opt)
    : rc(rc_),
      tc(rc_.train),
      schedule(lr_schedule(rc_.train)),
      procs(opt.world, rc_.train.comm_timeout_s),
      quiet(opt.quiet || !procs.root()) {
  if (opt.steps >= 0) schedule.total_steps = opt.steps;
  check_layout(rc, opt, procs);
  if (procs.root()) warn_about_schedule(schedule);
  // The device is input too: a GPU that is not there fails before anything is written.
  const DeviceSpec device = rank_device(tc.device, procs);
  backend = open_backend(device, "train.device " + device.name());
  if (!opt.synthetic_data) open_dataset();  // bad input first: it is cheap to check
  // The memory the run will allocate: the host's, or the GPU's (what is free on it, shared
  // by the ranks that train on it).
  if (!tc.device.cuda) {
    check_training_memory(rc, procs);
  } else {
    const gpu::GpuInfo gpu_info = gpu::open_gpu(device.index, "train.device " + device.name());
    check_gpu_training_memory(
        rc, procs,
        {gpu::memory_free(), fmt::format("{} ({})", gpu_info.name, device.name()),
         gpu::current_gpu_uuid()});
  }
  if (tc.memory_checkpoint_every > 0)
    check_memory_tier_room(tc, 2.0 * rank_checkpoint_bytes(rc, procs.ranks()) * procs.ranks());
  // The steps to train, against the checkpoint a resume would start from: before --overwrite
  // removes anything (train() checks again once the checkpoint is loaded).
  const bool resuming = opt.start == StartMode::resume || opt.start == StartMode::auto_resume;
  check_steps_left(resuming ? latest_resume_step(tc) : 0, schedule.total_steps, opt.stop_at_step,
                   tc.run_dir);
  // Before anything is allocated or written: the fault injection's spec parses (--overwrite
  // would otherwise remove the previous run first), and the directory is this run's, or
  // nothing starts.
  TrainFaults::from_environment(procs.rank(), procs.ranks());
  started.checked = process_age_seconds();
  run_dir.emplace(tc, opt.start, procs);
  // A launch's job beats from here on, through building the model and loading a checkpoint
  // (launch's start-up limit then covers only the process start and the checks above).
  if (run_dir->supervised()) start_heartbeat();
  if (run_dir->resume())
    config_changes = check_same_trajectory(rc, opt.allow_config_change, procs.root());
  // On a device with expert parallelism and ZeRO-1 the slabs are made without the other
  // ranks' experts (GpuShardedOptimizer::shard_expert_storage names the same holes), so they
  // never take the whole model's memory.
  SlabHoles holes;
  if (!backend->host_memory() && procs.world() && tc.zero1)
    holes = device_expert_holes(ParamTable(rc.model), rc.model.n_experts,
                                static_cast<int>(tc.expert_parallel), procs.ranks(), procs.rank(),
                                tc.optimizer == OptimizerKind::muon, tc.precision == DType::bf16);
  starting("building the model");
  model.emplace(rc.model, tc.precision, *backend, ModelUse::training, holes);
  build_model_and_optimizer();
  batches.emplace(train_loader ? &*train_loader : nullptr, tc.batch_size, tc.seq_len, procs.rank(),
                  procs.ranks(), rc.model.vocab_size, tc.seed, model->context_parallel());
  checkpointer.emplace(rc, schedule, *model, *optimizer, train_loader ? &*train_loader : nullptr,
                       procs, quiet);
  if (dataset) checkpointer->set_tokenizer_checksum(dataset->meta().tokenizer_checksum);
  checkpointer->set_load_progress_hook([this] { starting("loading a checkpoint"); });
  // Layer by layer inside a step: a step of minutes (long sequences on few cores) is not a
  // hang.
  model->set_progress_hook([this](const char* phase) { mark(marked_step, phase); });
  watch_anomalies(run_dir->resume());
  anomalies->faults().while_starting();
  started.built = process_age_seconds();
}

// The step to go on from: 0 for a new run, else the latest checkpoint's. The run directory
// holds checkpoints when it says to resume, so finding none that loads is an error (starting
// over would replace them).
int64_t TrainingRun::resume() {
  if (!run_dir->resume()) return 0;
  const int64_t step = checkpointer->resume();
  if (step > 0) return step;
  // --overwrite removes only what Foundry committed: the hint names what stops it.
  const std::vector<std::string> foreign = inspect_run_dir(tc.run_dir).foreign_entries;
  fail(fmt::format("no committed checkpoint in '{}/checkpoints' to resume from{}", tc.run_dir,
                   foreign.empty() ? "" : fmt::format(": it holds {}", fmt::join(foreign, ", "))),
       foreign.empty()
           ? "start a new run with --overwrite, or set another train.run_dir"
           : "Foundry did not commit those (and --overwrite leaves them alone): move them out of "
             "the run directory and start a new run with --overwrite, or set another "
             "train.run_dir");
}

// A dead, stopped or hung rank ends the job with kExitRankLost, named on the console and in
// the events log, within seconds (`foundry launch` then restarts it).
void TrainingRun::start_heartbeat() {
  if (heartbeat) return;  // a launch's job, beating since it took the run directory
  HeartbeatConfig config{tc.heartbeat_interval_s, tc.heartbeat_timeout_s, tc.hang_timeout_s};
  // Start-up gets at least launch's --startup-timeout between two marks (a model whose build
  // takes longer needs a larger one), and with several ranks the communication timeout: a rank
  // that has loaded its part of a checkpoint waits for the slowest in a collective, unmarked.
  if (const char* s = std::getenv(kLaunchStartupVariable))
    config.startup_after_s = std::max(0.0, std::atof(s));
  if (procs.ranks() > 1)
    config.startup_after_s = std::max(config.startup_after_s, tc.comm_timeout_s);
  const std::string dir = tc.run_dir;
  const int rank = procs.rank();
  heartbeat.emplace(dir, rank, procs.ranks(), config,
                    [dir, rank](const std::string& cause, int culprit, const std::string& message) {
                      std::fprintf(stderr, "error: %s\n", message.c_str());
                      try {
                        append_event(dir, "train", cause,
                                     {{"rank", culprit}, {"seen_by", rank}, {"message", message}});
                      } catch (const Error& e) {
                        std::fprintf(stderr, "warning: %s\n", e.what());
                      }
                      abort_job(kExitRankLost);
                    });
}

// The anomaly monitor, its part of the checkpoints' trainer state, and the batches earlier
// processes of a resumed run dropped.
void TrainingRun::watch_anomalies(bool resume) {
  anomalies.emplace(tc, procs.world(), procs.root(), *batches);
  checkpointer->set_trainer_state_hooks([this](json& s) { anomalies->save_state(s); },
                                        [this](const json& s) { anomalies->restore_state(s); });
  if (resume) anomalies->load_record();  // a new run's start clears it (begin_new_run)
}

// A new run, once it is ready to train and no stop is pending: what an earlier run left in
// the directory goes now (--overwrite's checkpoints and metrics, the in-memory tier, the
// record of skipped batches), not before, so a failure or a stop while starting leaves it.
void TrainingRun::begin_new_run() {
  auto g = procs.guard("replacing the previous run");
  run_dir->replace_previous_run(procs);
  checkpointer->clear_memory_tier();
  anomalies->clear_record();
}

// After a step judged anomalous: the last completed step to go on from (the same step runs
// again on the next batch after a skip; a rollback returns the checkpoint's step). Fails when
// the run stops, after committing the save in flight (it holds the state before the anomaly).
int64_t TrainingRun::after_anomaly(int64_t step) {
  switch (anomalies->handle()) {
    case AnomalyAction::skip:
      return step - 1;
    case AnomalyAction::rollback: {
      const int64_t to = checkpointer->rollback();
      anomalies->rolled_back(to);
      return to < 0 ? step - 1 : to;
    }
    case AnomalyAction::stop:
      break;
  }
  checkpointer->finish();
  anomalies->stop();
}

void TrainingRun::open_dataset() {
  dataset.emplace(rc.data.dir);
  if (dataset->vocab_size() != rc.model.vocab_size)
    fail(fmt::format("dataset '{}' has vocabulary size {} but model.vocab_size = {}", rc.data.dir,
                     dataset->vocab_size(), rc.model.vocab_size),
         fmt::format("set model.vocab_size to {} (--set model.vocab_size={})",
                     dataset->vocab_size(), dataset->vocab_size()));
  train_loader.emplace(*dataset, tc.batch_size, tc.seq_len, tc.seed);
  if (procs.root() && train_loader->windows_per_epoch() < tc.batch_size)
    warn(
        fmt::format("train.batch_size {} is more than the {} window(s) of {} tokens the train "
                    "split holds: every batch repeats windows",
                    tc.batch_size, train_loader->windows_per_epoch(), tc.seq_len + 1));
  // A split without one whole batch (none at all with --val-fraction 0) turns validation
  // off; the same on every rank.
  const uint64_t val_tokens = dataset->val().token_count();
  const int64_t val_windows = BatchLoader::windows_in(val_tokens, tc.seq_len);
  if (val_windows < tc.batch_size) {
    if (procs.root())
      warn(fmt::format("validation is off for this run: the validation split holds {} token(s), "
                       "{} window(s) of {} tokens, not one batch of {} (lower train.batch_size "
                       "or train.seq_len, or prepare the data with a larger --val-fraction, to "
                       "have it)",
                       val_tokens, val_windows, tc.seq_len + 1, tc.batch_size));
    return;
  }
  val_loader.emplace(BatchLoader::for_eval(*dataset, tc.batch_size, tc.seq_len));
  eval_batches = procs.root() ? validation_batches(*val_loader, tc.eval_batches)
                              : std::min(tc.eval_batches, whole_validation_batches(*val_loader));
}

void TrainingRun::build_model_and_optimizer() {
  const Communicator* world = procs.world();
  // The load-balancing loss counts expert shares over the global batch (arch moe).
  if (world) model->set_data_parallel(world);
  // On GPUs each exchange runs over NCCL where every rank has a GPU of its own, else through
  // host memory (collective: every rank decides from the same figures).
  const GpuGradients gpu_path =
      tc.device.cuda && world && world->size() > 1 ? gpu_gradients_of(*world) : GpuGradients::host;
  if (world && tc.expert_parallel > 1) {
    ep_groups.emplace(split_expert_parallel(*world, static_cast<int>(tc.expert_parallel)));
    if (gpu_path == GpuGradients::nccl) {
      auto g = procs.guard("opening the expert-parallel group of the GPUs over NCCL");
      ep_nccl = open_nccl_group(ep_groups->expert);
    }
    model->set_expert_parallel(&ep_groups->expert, ep_nccl.get());
  }
  if (world && tc.context_parallel > 1) {
    const int c = static_cast<int>(tc.context_parallel);
    cp_group.emplace(world->split(world->rank() / c, world->rank()));
    if (gpu_path == GpuGradients::nccl) {
      auto g = procs.guard("opening the context-parallel group of the GPUs over NCCL");
      cp_nccl = open_nccl_group(*cp_group);
    }
    model->set_context_parallel(&*cp_group, cp_nccl.get());
  }
  // A device's slabs (a GPU's, or the CPU backend posing as one in tests, with the CPU's
  // optimizer kernels): the device optimizers.
  const bool on_device = !backend->host_memory();
  const auto kernels = tc.device.cuda ? gpu_optimizer_kernels : cpu_optimizer_kernels;
  if (on_device && world && world->size() > 1) {
    // Data parallel on GPUs: over NCCL where every rank has a GPU of its own, else through
    // host memory.
    auto g = procs.guard("opening the data-parallel group of the GPUs");
    optimizer = make_device_data_parallel_optimizer(model->table(), optimizer_options(tc), *backend,
                                                    *world, gpu_path, kernels);
  } else if (on_device) {
    optimizer = make_device_optimizer(model->table(), optimizer_options(tc), *backend, kernels());
  } else {
    optimizer = make_optimizer(model->table(), optimizer_options(tc), world);
  }
  // Expert parallel with ZeRO-1: a rank stores its own experts, the dense tensors and its
  // shard, not the other ranks' experts (before initializing, so it never writes them).
  if (ep_groups) optimizer->shard_expert_storage(*model, static_cast<int>(tc.expert_parallel));
  // A resume loads every stored element or fails: drawing the initial weights first would
  // only delay a restart (seconds for a model of 10⁸ parameters).
  if (!run_dir->resume()) model->init_weights(tc.seed);
  optimizer->set_op_times(&model->op_times());
  // Data parallel: the backward pass reports finished gradients and the reduction of the
  // first buckets starts while the rest of backward computes (optim/grad_reduce.h). Not where
  // the expert- or context-parallel exchanges also run over NCCL: NCCL does not promise that
  // collectives of several communicators in flight at once on one GPU make progress (each
  // waits for its peers, and a device synchronization waits for all of them).
  overlap_held_back = world && tc.overlap_grad_reduce && (ep_nccl || cp_nccl);
  overlap = world && tc.overlap_grad_reduce && !overlap_held_back;
  if (overlap)
    model->set_gradients_final_hook([this](int64_t o) { optimizer->gradients_final(o); });
}

void TrainingRun::print_header() const {
  if (quiet) return;
  const ModelConfig& mc = rc.model;
  const ParamCounts counts = count_parameters(mc);
  std::fprintf(stderr,
               "model: %s params (%s active/token), %lld layers, %lld experts top-%lld | "
               "batch %lld x %lld tokens | %s GEMMs\n",
               format_count(counts.total).c_str(), format_count(counts.active).c_str(),
               static_cast<long long>(mc.n_layers), static_cast<long long>(mc.n_experts),
               static_cast<long long>(mc.top_k), static_cast<long long>(tc.batch_size),
               static_cast<long long>(tc.seq_len), dtype_name(tc.precision));
  if (dataset)
    std::fprintf(stderr, "data: %s (%s training tokens)\n", rc.data.dir.c_str(),
                 format_count(double(dataset->meta().train.tokens)).c_str());
  else
    std::fprintf(
        stderr, "data: random tokens (--synthetic-data)%s\n",
        rc.data.dir.empty() ? "" : fmt::format("; data.dir '{}' is not read", rc.data.dir).c_str());
  if (tc.precision == DType::bf16 && !tc.device.cuda && !native_bf16_products())
    std::fprintf(stderr,
                 "note: this CPU has no AVX-512, which oneDNN needs for bf16 products: they run "
                 "as fp32 products of the bf16 values, at about the fp32 rate\n");
  std::fprintf(stderr, "MFU peak: %.0f GFLOP/s (%s)\n", peak.flops_per_s / 1e9,
               peak.source.c_str());
  std::fprintf(stderr, "optimizer: %s\n", optimizer->describe().c_str());
  if (const int64_t share = batches->local_batch(), micro = micro_batch_rows(tc, share);
      micro < share)
    std::fprintf(stderr, "micro-batches: %lld of %lld sequences a step%s, gradients accumulated\n",
                 static_cast<long long>(share / micro), static_cast<long long>(micro),
                 procs.world() ? " on each rank" : "");
  if (!procs.world()) return;
  std::fprintf(
      stderr, "processes: %d ranks, %lld sequences each per step%s, expert parallel %lld%s%s\n",
      procs.ranks(), static_cast<long long>(batches->local_batch()),
      tc.context_parallel > 1 ? fmt::format(" (context parallel {}: {} tokens of each per rank)",
                                            tc.context_parallel, batches->local_seq())
                                    .c_str()
                              : "",
      static_cast<long long>(tc.expert_parallel),
      !backend->host_memory() && (tc.expert_parallel > 1 || tc.context_parallel > 1)
          ? (ep_nccl || cp_nccl ? " | their exchanges over NCCL"
                                : " | their exchanges through host memory")
          : "",
      fmt::format(
          " | optimizer state per rank {} ({}) | gradient reduction {}",
          format_bytes(double(optimizer->state_bytes()), ByteUnit::MiB, 1),
          optimizer->layout_name(),
          overlap ? fmt::format("overlapped with backward, {:g} MiB buckets", tc.grad_bucket_mib)
          : overlap_held_back
              ? std::string("after backward (not overlapped: the exchanges use NCCL on the same "
                            "GPUs)")
              : std::string("after backward"))
          .c_str());
}

// [sublayers][classes] rows of a flat array, rounded to 5 decimals (metrics stay readable).
json per_sublayer(const std::vector<double>& flat, int64_t classes) {
  json rows = json::array();
  for (size_t i = 0; i < flat.size(); i += classes) {
    json row = json::array();
    for (int64_t c = 0; c < classes; ++c) row.push_back(std::round(flat[i + c] * 1e5) / 1e5);
    rows.push_back(std::move(row));
  }
  return rows;
}

// The router's detail on logged steps: each sublayer's class loads (after this step's
// routing) and balancing biases (after this step's update).
void add_router_detail(json& m, const StepResult& r, const Model& model) {
  const int64_t S = model.config().router_classes();
  std::vector<double> bias;
  for (const ops::ZayaBalancer& b : model.balancers())
    bias.insert(bias.end(), b.bias.begin(), b.bias.end());
  m["class_loads"] = per_sublayer(r.balance.loads, S);
  m["balance_bias"] = per_sublayer(bias, S);
}

// One step's line of metrics.jsonl.
json step_metrics(int64_t step, const StepResult& r, int64_t tokens_per_step, int64_t tokens,
                  double mfu, const DataParallelOptimizer& optimizer, bool balancing) {
  const double tokens_per_s = tokens_per_step / r.seconds;
  json m = {{"step", step}, {"loss", r.losses.ce_loss}, {"aux_loss", r.losses.aux_loss},
            {"lr", r.lr},   {"grad_norm", r.grad_norm}, {"tokens_per_s", tokens_per_s},
            {"mfu", mfu},   {"step_time_s", r.seconds}, {"tokens", tokens}};
  if (const GradientReduceStats* reduce = optimizer.last_reduce())
    m["grad_comm_exposed_s"] = reduce->exposed_seconds;
  if (balancing) {
    m["max_load_error"] = r.balance.max_load_error;
    if (r.balance.skip_fraction >= 0) m["skip_fraction"] = r.balance.skip_fraction;
  }
  return m;
}

// The human-readable line of a step on stderr.
std::string step_line(const json& m, int64_t total_steps, bool balancing) {
  std::string line = fmt::format(
      "step {:>6}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | MFU {:.1f}%",
      m["step"].get<int64_t>(), total_steps, m["loss"].get<double>(), m["lr"].get<double>(),
      m["grad_norm"].get<double>(), m["tokens_per_s"].get<double>(), 100 * m["mfu"].get<double>());
  if (balancing) {
    line += fmt::format(" | load err {:.3f}", m["max_load_error"].get<double>());
    if (m.contains("skip_fraction"))
      line += fmt::format(" | skip {:.1f}%", 100 * m["skip_fraction"].get<double>());
  }
  if (m.contains("val_loss"))
    line += fmt::format(" | val loss {:.4f}", m["val_loss"].get<double>());
  return line;
}

// The bookkeeping of the step loop: throughput over the timed steps, the gradient-reduction
// totals, metrics.jsonl, the log line and the progress bar.
class StepLog {
 public:
  StepLog(const TrainingRun& run, std::optional<MetricsWriter> metrics, int64_t start_step)
      : run_(run),
        metrics_(std::move(metrics)),
        start_step_(start_step),
        total_steps_(run.schedule.total_steps),
        tokens_per_step_(run.checkpointer->tokens_per_step()),
        flops_per_token_(train_flops_per_token(run.rc.model, run.tc.seq_len)),
        expert_flops_per_token_(expert_train_flops_per_token(run.rc.model)),
        // The first steps create oneDNN primitives and fault in memory: the per-operation
        // table leaves them out when there are enough steps.
        warmup_(total_steps_ - start_step > 4 ? 2 : 0),
        balancing_(!run.model->balancers().empty()),  // arch zaya1
        watch_(run.peak),
        progress_("train", total_steps_, "step"),
        show_bar_(Progress::stderr_is_terminal() && !run.quiet) {}

  int64_t warmup() const { return warmup_; }
  const GradientCommTotals& comm() const { return comm_; }

  // The metrics of step `step`, counted into the totals.
  json record(int64_t step, const StepResult& r) {
    if (const GradientReduceStats* reduce = run_.optimizer->last_reduce();
        reduce && step > start_step_ + warmup_)
      comm_.add(*reduce);
    // The FLOPs the step ran: the ZAYA1 router's skip-class choices run no expert.
    const double flops_per_token =
        flops_per_token_ - std::max(0.0, r.balance.skip_fraction) * expert_flops_per_token_;
    if (step > start_step_ + 1 || total_steps_ - start_step_ == 1) {  // the first step warms caches
      timed_seconds_ += r.seconds;
      timed_tokens_ += tokens_per_step_;
      timed_flops_ += tokens_per_step_ * flops_per_token;
    }
    const double mfu = watch_.mfu(tokens_per_step_ / r.seconds * flops_per_token);
    json m = step_metrics(step, r, tokens_per_step_, run_.checkpointer->tokens_at(step), mfu,
                          *run_.optimizer, balancing_);
    m["peak_gflops"] = watch_.peak().flops_per_s / 1e9;
    m["peak_source"] = watch_.peak().source;
    if (const std::string warning = watch_.check(step, mfu); !warning.empty() && run_.procs.root())
      warn(warning);
    if (balancing_ && r.applied && logged(step)) add_router_detail(m, r, *run_.model);
    return m;
  }

  bool logged(int64_t step) const { return step % run_.tc.log_every == 0 || step == total_steps_; }

  // After a rollback to `step`: metrics.jsonl drops the lines of the steps after it.
  void rewind(int64_t step) {
    if (metrics_) metrics_.emplace(run_.tc.run_dir + "/metrics.jsonl", step);
  }

  // metrics.jsonl (rank 0), the log line every train.log_every steps, the progress bar.
  void publish(const json& m, bool evaluated) {
    const int64_t step = m["step"].get<int64_t>();
    if (metrics_) metrics_->write(m);
    if (!run_.quiet && (logged(step) || evaluated)) {
      if (show_bar_) std::fprintf(stderr, "\r\x1b[K");
      std::fprintf(stderr, "%s\n", step_line(m, total_steps_, balancing_).c_str());
    }
    if (show_bar_) progress_.update(step, fmt::format("loss {:.3f}", m["loss"].get<double>()));
  }

  // Throughput and MFU over the timed steps.
  void finish(TrainSummary& summary) {
    if (show_bar_) progress_.finish();
    if (timed_seconds_ <= 0) return;
    summary.tokens_per_s = timed_tokens_ / timed_seconds_;
    summary.mfu = watch_.mfu(timed_flops_ / timed_seconds_);
  }

 private:
  const TrainingRun& run_;
  std::optional<MetricsWriter> metrics_;
  int64_t start_step_, total_steps_, tokens_per_step_;
  double flops_per_token_;         // the model's, every choice an expert
  double expert_flops_per_token_;  // of the top_k experts' products alone
  int64_t warmup_;
  bool balancing_;
  MfuWatch watch_;
  Progress progress_;
  bool show_bar_;
  GradientCommTotals comm_;
  double timed_seconds_ = 0, timed_flops_ = 0;
  int64_t timed_tokens_ = 0;
};

// Memory and communication at the end of the run, every rank's (collective), printed by rank 0.
void finish_report(TrainingRun& run, const TrainOptions& opt, const RankMemory& memory,
                   const GradientCommTotals& comm_stats, int64_t steps_run, TrainSummary& summary) {
  summary.optimizer_state_bytes = run.optimizer->state_bytes();
  const std::vector<RankMemory> ranks = gather_rank_memory(run.procs.world(), memory);
  for (const RankMemory& r : ranks)
    summary.peak_rss_bytes = std::max(summary.peak_rss_bytes, int64_t(r.rss_bytes));
  summary.grad_comm_exposed_s = comm_stats.exposed_per_step();
  if (!run.procs.root()) return;
  if (!run.quiet || opt.op_breakdown) {
    std::fprintf(stderr, "%s\n",
                 format_memory_line(double(summary.optimizer_state_bytes),
                                    run.optimizer->layout_name(), ranks, run.procs.world())
                     .c_str());
    if (comm_stats.steps > 0)
      std::fprintf(stderr, "%s\n", comm_stats.describe(run.model->slab_size()).c_str());
    if (run.tc.device.cuda) {
      // The memory check's figures for this rank (its share of the batch, ZeRO-1's share of
      // the state, the device slabs in whole chunks), without its margin.
      const MemoryNeed need =
          gpu_training_memory_need(run.rc, run.tc.batch_size, run.procs.ranks());
      const int64_t estimate = need.per_process() - need.parts.back().second;
      std::fprintf(stderr, "GPU memory in use at the end: %s (the memory check estimates %s)\n",
                   format_bytes(double(gpu::memory_in_use()), ByteUnit::GiB, 2).c_str(),
                   format_bytes(double(estimate), ByteUnit::GiB, 2).c_str());
    }
  }
  if (opt.op_breakdown && steps_run > 0)
    std::fprintf(stderr, "%s", format_op_breakdown(run.model->op_times(), steps_run).c_str());
}

// A rank could not write its outputs: the run stops on every rank, with the checkpoint of
// `step` saved, or with `save_error` when that failed too (as it does on a full disk): its
// error then follows the metrics' (the first cause), with its hint.
[[noreturn]] void report_output_failure(const TrainingRun& run, int64_t step,
                                        const std::string& error, const Error* save_error) {
  const std::string saved =
      save_error ? fmt::format("and its checkpoint failed too: {}", save_error->what())
                 : fmt::format("checkpoint of step {} saved", step);
  if (!error.empty())
    fail(fmt::format("{}; training stopped ({})", error, saved),
         save_error ? save_error->hint()
                    : io_error_hint(error, join(run.tc.run_dir, kMetricsFile),
                                    "free space on the run directory's file system") +
                          "; then continue with --resume");
  fail(fmt::format("rank {}: training stopped because rank 0 could not write its metrics ({})",
                   run.procs.rank(), saved),
       "see rank 0's error");
}

}  // namespace

namespace {

// Adds `part` into `sum` element by element (`sum` empty: becomes `part`).
void add_counts(std::vector<int64_t>& sum, const std::vector<int64_t>& part) {
  if (sum.empty()) {
    sum = part;
    return;
  }
  FOUNDRY_CHECK(sum.size() == part.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
}

// The step's forward and backward passes on this rank's rows, in micro-batches of
// `micro_rows` sequences (0: all at once) whose gradients add up in place: `losses` their
// means, the router counts their sums (copies: a validation forward before the balancer
// update would overwrite the model's), the batch's injected faults applied.
void forward_backward(Model& model, DataParallelOptimizer& optimizer, const TrainBatches& batches,
                      bool overlap, int64_t micro_rows, AnomalyMonitor* anomalies,
                      ForwardResult& losses, std::vector<int64_t>& class_counts,
                      std::vector<int64_t>& boundary_counts) {
  const int64_t rows = batches.local_batch(), seq = batches.local_seq();
  const int64_t micro = micro_rows > 0 ? micro_rows : rows;
  FOUNDRY_CHECK(rows % micro == 0);
  const int64_t n = rows / micro;
  const bool balancing = !model.balancers().empty();
  model.zero_grads();
  // Each loss weighs 1/n until the batch is done, however it ends (an error, a stop).
  struct LossWeight {
    Model& model;
    ~LossWeight() { model.set_loss_weight(1); }
  } weight{model};
  model.set_loss_weight(1.0 / static_cast<double>(n));
  for (int64_t m = 0; m < n; ++m) {
    const int64_t at = m * micro * seq;
    const ForwardResult f =
        model.forward(batches.local_inputs() + at, batches.local_targets() + at, micro, seq);
    if (n == 1) {
      losses = f;
    } else {  // the mean of equal parts: the batch's mean
      losses.loss += f.loss / static_cast<double>(n);
      losses.ce_loss += f.ce_loss / static_cast<double>(n);
      losses.aux_loss += f.aux_loss / static_cast<double>(n);
    }
    if (balancing) {
      add_counts(class_counts, model.router_class_counts());
      if (!model.router_boundary_counts().empty())
        add_counts(boundary_counts, model.router_boundary_counts());
    }
    if (m == 0 && anomalies) anomalies->faults().poison_gradients(batches.batch(), model);
    // The reduction starts as the last backward finishes each bucket's gradients.
    if (m == n - 1 && overlap) optimizer.begin_backward(model.grads());
    model.backward(/*accumulate=*/m > 0);
  }
  if (anomalies) anomalies->faults().poison_losses(batches.batch(), losses);
}

}  // namespace

StepResult run_step(Model& model, DataParallelOptimizer& optimizer, const TrainBatches& batches,
                    double lr, int64_t step, double max_grad_norm, bool overlap,
                    const Communicator* world, const std::function<void()>& before_update,
                    AnomalyMonitor* anomalies, int64_t micro_rows) {
  StepResult r;
  r.lr = lr;
  const int64_t batch = batches.batch();
  const bool balancing = !model.balancers().empty();
  std::vector<int64_t> class_counts, boundary_counts;
  forward_backward(model, optimizer, batches, overlap, micro_rows, anomalies, r.losses,
                   class_counts, boundary_counts);
  // The batch's routing, summed over ranks: every rank's balancer sees the global batch and
  // stays identical.
  if (balancing && world) {
    sum_router_counts(*world, class_counts);
    if (!boundary_counts.empty()) sum_router_counts(*world, boundary_counts);
  }
  if (before_update) before_update();
  // The losses over the ranks first: the anomaly veto judges them with the gradient norm.
  r.losses.loss = mean_over_ranks(world, r.losses.loss);
  r.losses.ce_loss = mean_over_ranks(world, r.losses.ce_loss);
  r.losses.aux_loss = mean_over_ranks(world, r.losses.aux_loss);
  auto judge = [&](double norm) {
    return !(r.applied = !anomalies->veto(step, batch, r.losses, norm));
  };
  UpdateVeto veto;
  if (anomalies) veto = std::ref(judge);  // by reference: nothing allocated per step
  // The optimizer times its own phases (communication apart from the local update), and
  // refreshes the bf16 weight copy in its update's pass where its layout can.
  bf16* weights_bf16 = model.bf16_weights();
  const bool mirrored = weights_bf16 && optimizer.write_bf16_weights(weights_bf16);
  r.grad_norm = optimizer.step(model.params(), model.grads(), lr, step, max_grad_norm, veto);
  if (!r.applied) return r;
  if (!std::isfinite(r.losses.loss) || !std::isfinite(r.grad_norm))
    fail(fmt::format("step {}: loss {} / gradient norm {} is not finite", step, r.losses.loss,
                     r.grad_norm),
         "lower train.lr, raise train.warmup_steps, or use precision fp32 to investigate");
  if (!mirrored) model.sync_weights();
  if (balancing) {
    ScopedOpTimer t(&model.op_times(), "router balancing");
    const ModelConfig& mc = model.config();
    const int64_t S = mc.router_classes();
    const int64_t assignments = batches.global_tokens() * mc.top_k;  // per MoE sublayer
    FOUNDRY_CHECK(static_cast<int64_t>(class_counts.size()) == mc.n_layers * S);
    r.balance = balance_stats(class_counts, S, assignments, mc.router_skip_class);
    model.update_balancers(class_counts.data(), assignments,
                           boundary_counts.empty() ? nullptr : boundary_counts.data());
  }
  return r;
}

// What the start cost, process start to the end of the first step, phase by phase: printed
// after a resume (what a restart cost, even with --quiet), and for a new run unless quiet.
void report_start_up(const TrainingRun& run, int64_t start_step) {
  if (!run.procs.root() || (start_step == 0 && run.quiet)) return;
  const auto& t = run.started;
  const double now = process_age_seconds();
  std::string phases = fmt::format("start-up and MPI {:.1f} s, model and optimizer {:.1f} s",
                                   t.checked, t.built - t.checked);
  if (start_step > 0)
    phases += fmt::format(", loading the checkpoint {:.1f} s", t.loaded - t.built);
  if (t.ready - t.loaded >= 0.05)
    phases += fmt::format(", MFU peak and validation {:.1f} s", t.ready - t.loaded);
  phases += fmt::format(", first step {:.1f} s", now - t.ready);
  if (start_step > 0)
    std::fprintf(stderr,
                 "first step after resuming at step %lld: %.1f s after the process "
                 "started (%s)\n",
                 static_cast<long long>(start_step), now, phases.c_str());
  else
    std::fprintf(stderr, "first step: %.1f s after the process started (%s)\n", now,
                 phases.c_str());
}

namespace {

// From the run directory taken to the first step: heartbeats, the MFU peak, the header and
// the validation at step 0.
TrainSummary start_training(TrainingRun& run, const TrainOptions& opt, int64_t start_step) {
  // Heartbeats, unless a launch's job beats already (before, a failure changes nothing on disk,
  // and the communication watchdog and launch's start-up limit watch); from then on the run
  // directory is this run's (a directory it made is no longer removed when it fails: until
  // here, not even a file that could not be created is left behind).
  run.start_heartbeat();
  run.run_dir->started();
  run.peak = choose_mfu_peak(run.tc, opt.profile_peak, run.procs, start_step > 0);
  run.print_header();
  TrainSummary summary;
  summary.start_step = start_step;
  summary.peak_gflops = run.peak.flops_per_s / 1e9;
  summary.peak_source = run.peak.source;
  run.mark(start_step, "validation");
  if (start_step == 0 && run.val_loader && run.schedule.total_steps > 0)
    summary.initial_val_loss = run.initial_evaluation();
  run.started.ready = process_age_seconds();
  return summary;
}

// The checkpoints step `step` owes: the durable and in-memory saves when due; at the last
// step the checkpointer finishes its writes, and a run that ends with its final checkpoint
// (finished or interrupted) removes the memory tier.
void save_due_checkpoints(TrainingRun& run, int64_t step, bool last, bool final_step,
                          bool interrupted) {
  run.checkpointer->poll();
  // Only the run's own end may go without its checkpoint (train.checkpoint_at_end):
  // --stop-at-step is a stop, to be resumed.
  const bool completes = step == run.schedule.total_steps;
  const SavesDue due = saves_due(run.tc, step, last, completes);
  if (due.durable) {
    run.mark(step, "checkpoint");
    run.checkpointer->save(step, last);
  }
  if (due.memory) run.checkpointer->save_in_memory(step);
  if (last) run.checkpointer->finish();
  if (final_step || interrupted) run.checkpointer->retire_memory_tier();
}

// The end of step `step`, applied, whose metrics are `m`: the validation when due, the metrics
// published, the ranks' agreement on stopping, the checkpoints due. True when training ends
// with this step; `memory` is then the rank's memory before its final checkpoint.
bool finish_step(TrainingRun& run, const TrainOptions& opt, StepLog& log, StopSignals& signals,
                 int64_t step, json m, TrainSummary& summary, RankMemory& memory) {
  // A run ends validated, at train.steps or at --stop-at-step.
  const bool final_step = step == run.schedule.total_steps || step == opt.stop_at_step;
  const bool eval_now = run.evaluation_due(step) || (run.val_loader && final_step);
  if (eval_now) {
    run.mark(step, "validation");
    m["val_loss"] = summary.final_val_loss = run.evaluate();
    summary.final_val_step = step;
  }
  std::string output_error;  // rank 0 could not write metrics.jsonl
  try {
    log.publish(m, eval_now);
  } catch (const Error& e) {
    output_error = e.what();
    run.checkpointer->carry_unwritten_metrics(m);  // the step's checkpoint keeps its line
  }
  const StopReasons stop = signals.agreed(run.procs.world(), !output_error.empty());
  // Memory at the last step, before its checkpoint's snapshot (not training memory).
  const bool last = final_step || stop.any();
  if (last) memory = run.memory_now();
  try {
    save_due_checkpoints(run, step, last, final_step, stop.signal != 0);
  } catch (const Error& e) {
    if (!stop.output_failed) throw;
    report_output_failure(run, step, output_error, &e);
  }
  if (stop.output_failed) report_output_failure(run, step, output_error, nullptr);
  if (stop.signal) {
    const char* name = stop.signal == SIGINT ? "SIGINT" : "SIGTERM";
    // A stop that came during the run's last step finds it complete: it ends as finished
    // (with the final checkpoint train.checkpoint_at_end asks for), nothing left to resume.
    if (step == run.schedule.total_steps) {
      if (run.procs.rank() == 0)
        std::fprintf(stderr, "received %s during the last step: the run is complete\n", name);
      return true;
    }
    if (run.procs.rank() == 0)  // every rank agreed on the stop: one line for the job
      std::fprintf(stderr, "received %s: checkpoint saved at step %lld, exiting\n", name,
                   static_cast<long long>(step));
    summary.interrupted = true;
    return true;
  }
  return final_step;
}

}  // namespace

TrainSummary train(const RunConfig& rc, const TrainOptions& opt) {
  // First: SIGINT/SIGTERM while the run starts (building the model, loading a checkpoint:
  // minutes for a large one) are a stop, agreed on once the checkpoint is loaded, not a death.
  StopSignals signals(/*block_on_workers=*/true);
  signals.while_starting(/*announce=*/!opt.world || opt.world->rank() == 0);
  TrainingRun run(rc, opt);
  const int64_t total_steps = run.schedule.total_steps;
  const int64_t start_step = run.resume();
  run.started.loaded = process_age_seconds();
  check_steps_left(start_step, total_steps, opt.stop_at_step, rc.train.run_dir);
  if (start_step == total_steps) {  // nothing trained: the run stays as it is
    if (run.procs.root() && run.checkpointer->resumed_metrics().is_object())
      run.open_metrics(start_step);  // its last step's line, if the file lacks it
    TrainSummary done;
    done.start_step = done.final_step = start_step;
    done.already_complete = true;
    return done;
  }
  // A launch asked to stop may not have reached this rank with its signal yet.
  if (run.run_dir->supervised() && path_exists(launch_stop_path(rc.train.run_dir)))
    signals.request(SIGTERM);
  const int start_signal = [&] {
    auto g = run.procs.guard("agreeing on a stop before the first step");
    return signals.agreed(run.procs.world()).signal;
  }();
  signals.started();
  if (const int sig = start_signal) {
    if (run.procs.root())
      std::fprintf(stderr, "received %s while starting: no step trained, exiting (%s)\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM",
                   start_step > 0 ? fmt::format("the run stays at step {}", start_step).c_str()
                                  : "the run directory stays as it was");
    TrainSummary stopped;
    stopped.start_step = stopped.final_step = start_step;
    stopped.interrupted = stopped.stopped_at_start = true;
    return stopped;
  }
  if (!run.run_dir->resume()) run.begin_new_run();
  // The resume is accepted: its changes of settings go to the events log.
  if (run.procs.root() && !run.config_changes.empty())
    append_event(rc.train.run_dir, "train", "config_change", {{"changes", run.config_changes}});
  std::optional<MetricsWriter> metrics = run.open_outputs(start_step);
  TrainSummary summary = start_training(run, opt, start_step);
  run.model->op_times().enabled = opt.op_breakdown;
  StepLog log(run, std::move(metrics), start_step);
  RankMemory memory = run.memory_now();
  int64_t step = start_step;
  while (step < total_steps) {
    ++step;
    if (step == start_step + log.warmup() + 1) run.model->op_times().clear();
    const double t0 = now_seconds();
    auto step_guard = run.procs.guard(fmt::format("training step {}", step));
    run.mark(step, "step");
    run.batches->next();
    StepResult r = run_step(
        *run.model, *run.optimizer, *run.batches, learning_rate(run.schedule, step), step,
        rc.train.grad_clip, run.overlap, run.procs.world(),
        [&] { run.checkpointer->protect_state(); }, &*run.anomalies,
        micro_batch_rows(rc.train, run.batches->local_batch()));
    if (!r.applied) {  // nothing changed: skip the batch, or roll back (train/anomaly.h)
      const int64_t last = run.after_anomaly(step);
      if (last < step - 1) log.rewind(last);
      step = last;
      continue;
    }
    r.seconds = now_seconds() - t0;
    json m = log.record(step, r);
    summary.last_train_loss = r.losses.ce_loss;
    if (step == start_step + 1) report_start_up(run, start_step);
    if (finish_step(run, opt, log, signals, step, std::move(m), summary, memory)) break;
  }
  log.finish(summary);
  summary.final_step = step;
  finish_report(run, opt, memory, log.comm(), step - start_step - log.warmup(), summary);
  return summary;
}

}  // namespace foundry
