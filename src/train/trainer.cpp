#include "train/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "base/error.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/progress.h"
#include "base/rng.h"
#include "base/timer.h"
#include "ckpt/checkpoint.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "kernels/gemm.h"
#include "model/info.h"
#include "model/model.h"
#include "comm/comm.h"
#include "comm/watchdog.h"
#include "model/expert_parallel.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/muon.h"
#include "optim/grad_reduce.h"
#include "optim/zero1.h"
#include "optim/schedule.h"

namespace foundry {
using data::BatchLoader;
using data::Dataset;

namespace {

std::atomic<int> g_stop_signal{0};

void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// Installs SIGINT/SIGTERM handlers for the lifetime of the training loop.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  int received() const { return g_stop_signal.load(); }

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// Batches of uniformly random tokens, a pure function of (seed, step): no cursor needed.
void synthetic_batch(int32_t* inputs, int32_t* targets, int64_t n, int64_t vocab, uint64_t seed,
                     int64_t step) {
  uint64_t key = seed ^ (0x5851f42d4c957f2dULL * static_cast<uint64_t>(step + 1));
  Rng rng(Rng::splitmix64(key));
  for (int64_t i = 0; i < n; ++i) {
    inputs[i] = static_cast<int32_t>(rng.below(vocab));
    targets[i] = static_cast<int32_t>(rng.below(vocab));
  }
}

// Keeps only metrics lines of steps ≤ last_step (so a resumed run's file has no duplicates).
void truncate_metrics(const std::string& path, int64_t last_step) {
  if (!path_exists(path)) return;
  std::istringstream in(read_text_file(path));
  std::string line, kept;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      json j = json::parse(line);
      if (j.value("step", int64_t{0}) > last_step) continue;
    } catch (const json::parse_error&) {
      continue;  // a torn last line from a crash
    }
    kept += line + "\n";
  }
  write_file_atomic(path, kept);
}

std::string format_count(double v) {
  if (v >= 1e9) return fmt::format("{:.2f}B", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

// ---- optimizers ---------------------------------------------------------------------------

bool muon_enabled(const TrainConfig& tc) { return tc.optimizer == "muon"; }

AdamWOptions adamw_options(const TrainConfig& tc) {
  AdamWOptions o;
  o.beta1 = tc.beta1;
  o.beta2 = tc.beta2;
  o.eps = tc.eps;
  o.weight_decay = tc.weight_decay;
  // With Muon, AdamW keeps only what Muon does not update (embedding, norms, router, ...).
  if (muon_enabled(tc)) o.applies = [](const ParamInfo& info) { return !muon_applies(info); };
  return o;
}

// Muon's options from the train.muon_* keys; the run config accepts a wider range than Muon
// does for two of them, so those are checked here, naming the key.
MuonOptions muon_options(const TrainConfig& tc) {
  if (tc.muon_ns_steps < 1)
    fail(fmt::format("train.muon_ns_steps = {}: Muon needs at least 1 Newton-Schulz step",
                     tc.muon_ns_steps),
         "set train.muon_ns_steps to 5 (the usual value)");
  if (!(tc.muon_rms_scale > 0))
    fail(fmt::format("train.muon_rms_scale = {} must be positive", tc.muon_rms_scale),
         "set train.muon_rms_scale to 0.2 (matches the RMS of a typical AdamW update)");
  MuonOptions o;
  o.momentum = tc.muon_momentum;
  o.nesterov = tc.muon_nesterov;
  o.ns_steps = static_cast<int>(tc.muon_ns_steps);
  o.bf16_newton_schulz = tc.muon_ns_precision == "bf16";
  o.weight_decay = tc.weight_decay;  // one decay coefficient for both (see optim/muon.h)
  o.rms_scale = tc.muon_rms_scale;
  return o;
}

// Peak resident memory of this process (bytes).
int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

// The data-parallel gradient reduction summed over the timed steps, for the end-of-run line.
struct GradientCommTotals {
  int64_t steps = 0;
  double exposed = 0, in_backward = 0, collectives = 0, started_in_backward = 0;
  double elements_in_backward = 0;
  void add(const GradientReduceStats& s) {
    ++steps;
    exposed += s.exposed_seconds;
    in_backward += s.in_backward_seconds;
    collectives += static_cast<double>(s.collectives);
    started_in_backward += static_cast<double>(s.started_in_backward);
    elements_in_backward += static_cast<double>(s.elements_in_backward);
  }
  std::string describe(int64_t slab_elements) const {
    const double n = static_cast<double>(steps);
    return fmt::format(
        "gradient reduction per step ({} steps): {:.1f} buckets, {:.1f} started during "
        "backward carrying {:.0f}% of the slab; {:.1f} ms starting and polling inside backward, "
        "{:.1f} ms exposed after it",
        steps, collectives / n, started_in_backward / n,
        100 * elements_in_backward / n / static_cast<double>(slab_elements), 1e3 * in_backward / n,
        1e3 * exposed / n);
  }
};

// The optimizers of a run: AdamW for every tensor, or Muon for the 2-D hidden matrices plus
// AdamW for the rest. They update disjoint tensors, so the order of their steps is irrelevant.
// Under mpirun both are sharded over the ranks (ZeRO-1, optim/zero1.h). Checkpoints hold
// every state slab of both in full, by the optimizers' state names, whatever the layout.
class Optimizers {
 public:
  Optimizers(const ParamTable& table, const TrainConfig& tc, const Communicator* world)
      : table_(table) {
    std::optional<MuonOptions> muon;
    if (muon_enabled(tc)) muon = muon_options(tc);
    const int64_t bucket = static_cast<int64_t>(tc.grad_bucket_mib * (1 << 20) / sizeof(float));
    if (world && world->size() > 1 && tc.zero1) {
      Zero1Options z;
      z.bucket_elements = bucket;
      zero1_.emplace(table, adamw_options(tc), muon, *world, z);
      return;
    }
    if (world && world->size() > 1) {
      GradientReducerOptions r;
      r.bucket_elements = bucket;
      allreduce_.emplace(*world, table.total_elements(), std::vector<int64_t>{}, r);
      dp_ = world->size();
    }
    adam_.emplace(table, adamw_options(tc));
    if (muon) muon_.emplace(table, *muon);
  }

  // Overlap: arms the data-parallel gradient reduction before backward; the model's hook
  // then reports finished gradients (no-ops in a single process).
  void begin_backward(float* grads) {
    if (zero1_) zero1_->begin_backward(grads);
    if (allreduce_) allreduce_->begin(grads, nullptr);
  }
  void gradients_final(int64_t offset) {
    if (zero1_) zero1_->gradients_final(offset);
    if (allreduce_) allreduce_->final_from(offset);
  }
  bool data_parallel() const { return zero1_ || allreduce_; }
  // The last step's gradient reduction (data parallel only).
  const GradientReduceStats& last_reduce() const {
    return zero1_ ? zero1_->last_reduce() : last_allreduce_;
  }

  // Clips the (global) gradient to `max_norm` and updates `params`; returns the norm before
  // clipping. A non-finite norm leaves everything unchanged (the caller stops).
  double step(float* params, float* grads, double lr, int64_t step, double max_norm) {
    if (zero1_) return zero1_->step(params, grads, lr, step, max_norm);
    if (allreduce_) {
      // Replicated data parallel: every rank gets the summed gradient, averages it and runs
      // the single-process step on identical inputs, so the replicas stay identical.
      last_allreduce_ = allreduce_->finish(grads, nullptr);
      ScopedOpTimer t(op_times_, "optimizer");
      const float inv_dp = static_cast<float>(1.0 / dp_);
      const int64_t E = table_.total_elements();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < E; ++i) grads[i] *= inv_dp;
      return local_step(params, grads, lr, step, max_norm);
    }
    ScopedOpTimer t(op_times_, "optimizer");
    return local_step(params, grads, lr, step, max_norm);
  }

  // Optimizer memory of this rank (bytes): the state it keeps (ZeRO-1: its shard's, plus
  // its buffers; otherwise every state slab in full).
  int64_t state_bytes() const {
    if (zero1_) return zero1_->allocated_bytes();
    int64_t n = 0;
    for (const std::string& name : AdamW::state_names())
      n += static_cast<int64_t>(adam_->state(name).size());
    if (muon_)
      for (const std::string& name : Muon::state_names())
        n += static_cast<int64_t>(muon_->state(name).size());
    return n * static_cast<int64_t>(sizeof(float));
  }

 private:
  double local_step(float* params, float* grads, double lr, int64_t step, double max_norm) {
    const double norm = clip_grad_norm(grads, table_, max_norm);
    if (!std::isfinite(norm)) return norm;
    adam_->step(params, grads, lr, step);
    if (muon_) muon_->step(params, grads, lr, step);
    return norm;
  }

 public:

  // Collective under ZeRO-1 (the shards are gathered on rank 0, whose pointers are valid
  // until the next call; the other ranks get an empty list).
  std::vector<StateSlabToSave> states_to_save() {
    std::vector<StateSlabToSave> states;
    if (zero1_) {
      gathered_.clear();
      for (const std::string& name : zero1_->state_names())
        gathered_.push_back({name, zero1_->gather_state(name)});
      if (zero1_->rank() == 0)
        for (const auto& [name, slab] : gathered_) states.push_back({name, slab.data()});
      return states;
    }
    for (const std::string& name : AdamW::state_names())
      states.push_back({name, adam_->state(name).data()});
    if (muon_)
      for (const std::string& name : Muon::state_names())
        states.push_back({name, muon_->state(name).data()});
    return states;
  }
  // Buffers load_checkpoint fills; then finish_load() hands them to the sharded optimizer.
  std::vector<StateSlabToLoad> states_to_load() {
    std::vector<StateSlabToLoad> states;
    if (zero1_) {
      gathered_.clear();
      for (const std::string& name : zero1_->state_names()) {
        gathered_.push_back({name, std::vector<float>(static_cast<size_t>(table_.total_elements()))});
        states.push_back({name, gathered_.back().second.data()});
      }
      return states;
    }
    for (const StateSlabToSave& s : states_to_save())
      states.push_back({s.suffix, const_cast<float*>(s.data)});
    return states;
  }
  void finish_load() {  // collective under ZeRO-1
    if (!zero1_) return;
    for (const auto& [name, slab] : gathered_) zero1_->load_state(name, slab);
    gathered_.clear();
  }

  // "muon (12 tensors, 1.20M params) + adamw (rest: 9 tensors, 40.5k params)" or
  // "adamw (all 21 tensors, 1.24M params)", with ", ZeRO-1 over N ranks" when sharded.
  std::string describe(const ParamTable& table, bool muon_on) const {
    int64_t muon_tensors = 0, adam_tensors = 0;
    double muon_params = 0, adam_params = 0;
    for (const ParamInfo& p : table.params()) {
      if (muon_on && muon_applies(p)) {
        ++muon_tensors;
        muon_params += static_cast<double>(p.numel);
      } else {
        ++adam_tensors;
        adam_params += static_cast<double>(p.numel);
      }
    }
    std::string out =
        muon_on ? fmt::format("muon ({} tensors, {} params) + adamw (rest: {} tensors, {} params)",
                              muon_tensors, format_count(muon_params), adam_tensors,
                              format_count(adam_params))
                : fmt::format("adamw (all {} tensors, {} params)", adam_tensors,
                              format_count(adam_params));
    if (zero1_) out += fmt::format(", ZeRO-1 over {} ranks", zero1_->dp());
    if (allreduce_) out += fmt::format(", replicated on {} ranks (train.zero1 = false)", dp_);
    return out;
  }
  const Zero1Optimizer* zero1() const { return zero1_ ? &*zero1_ : nullptr; }
  // Under ZeRO-1 with expert parallelism: `model` stops storing the other EP ranks' experts
  // and the weight all-gather skips them (Model::shard_expert_storage). Replicated state
  // (train.zero1 = false) updates every parameter on every rank, so it keeps them all.
  void shard_expert_storage(Model& model, int ep_size) {
    if (!zero1_ || ep_size <= 1) return;
    auto unowned = unowned_expert_ranges_by_rank(
        table_, ExpertSharding(model.config().n_experts, ep_size), zero1_->dp());
    auto released = zero1_released_ranges(zero1_->layout(), unowned);
    model.shard_expert_storage(released[zero1_->rank()]);
    zero1_->set_released_ranges(std::move(released));
    zero1_->set_zero_gradient_ranges(std::move(unowned));
  }
  // Collective: before rank 0 writes a checkpoint, it receives the parameters it does not
  // store; it releases them again after (Model::release_again).
  void gather_parameters_to_root(float* params) {
    if (zero1_) zero1_->gather_released(params, 0);
  }
  void set_op_times(OpTimes* times) {
    op_times_ = times;
    if (zero1_) zero1_->set_op_times(times);
    if (allreduce_) allreduce_->set_op_times(times);
  }

 private:
  const ParamTable& table_;
  std::optional<AdamW> adam_;
  std::optional<Muon> muon_;
  std::optional<Zero1Optimizer> zero1_;
  std::optional<GradientReducer> allreduce_;  // replicated data parallel
  GradientReduceStats last_allreduce_;
  int dp_ = 1;
  OpTimes* op_times_ = nullptr;
  std::vector<std::pair<std::string, std::vector<float>>> gathered_;
};

// Ranks started with different configs would train different models and exchange
// mismatched buffers: every rank compares the hash of its effective config with every
// other's before anything else is communicated, and all fail together, naming the ranks.
void check_same_config(const Communicator& world, const RunConfig& rc) {
  const std::string text = rc.source.dump();
  const int64_t mine = static_cast<int64_t>(hash64(text.data(), text.size()) >> 1);
  std::vector<int64_t> all(static_cast<size_t>(world.size()));
  world.allgather(&mine, all.data(), 1);
  std::string differ;
  for (int r = 1; r < world.size(); ++r)
    if (all[static_cast<size_t>(r)] != all[0]) differ += fmt::format("{}{}", differ.empty() ? "" : ", ", r);
  if (!differ.empty())
    fail(fmt::format("rank {}: the run config of rank(s) {} differs from rank 0's (config hash {} "
                     "against {})",
                     world.rank(), differ, hash64_hex(uint64_t(all[0])), hash64_hex(uint64_t(mine))),
         "start every rank with the same --config and --set options");
}

// A resumed run must continue with the optimizer its state was written by. Checkpoints from
// before train.optimizer existed have no "optimizer" key and were written by AdamW.
void check_same_optimizer(const std::string& dir, const json& saved_state,
                          const std::string& configured) {
  std::string saved = "adamw";
  if (auto it = saved_state.find("optimizer"); it != saved_state.end()) {
    if (!it->is_string())
      fail(fmt::format("{}/trainer_state.json: \"optimizer\" is not a string", dir),
           "the checkpoint is corrupt; resume from another one or start a new run directory");
    saved = it->get<std::string>();
  }
  if (saved != configured)
    fail(fmt::format("{} was written with train.optimizer = \"{}\", but the config says "
                     "train.optimizer = \"{}\"; the optimizer state of one cannot continue "
                     "the other",
                     dir, saved, configured),
         fmt::format("resume with --set train.optimizer={}, or train with {} in a new run "
                     "directory (train.run_dir)",
                     saved, configured));
}

// ---- router balancers (arch zaya1) ----------------------------------------------------------

// One step's balance of the ZAYA1 router, from its class counts [layers × classes].
struct BalanceStats {
  double max_load_error = 0;  // max over sublayers and classes of |load − 1/S|
  double skip_fraction = -1;  // mean over sublayers of the skip class's load (-1: no skip class)
};

BalanceStats balance_stats(const std::vector<int64_t>& counts, int64_t classes,
                           int64_t assignments, bool skip_class) {
  BalanceStats stats;
  const int64_t layers = static_cast<int64_t>(counts.size()) / classes;
  std::vector<double> err(classes);
  double skip_sum = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t* row = counts.data() + l * classes;
    ops::zaya_load_error(err.data(), row, assignments, classes);
    for (double e : err) stats.max_load_error = std::max(stats.max_load_error, std::abs(e));
    // The skip class is the last one (index n_experts).
    if (skip_class) skip_sum += static_cast<double>(row[classes - 1]) / assignments;
  }
  if (skip_class && layers > 0) stats.skip_fraction = skip_sum / static_cast<double>(layers);
  return stats;
}

// The balancing biases under Hugging Face ZAYA's buffer name, one [S] tensor per MoE
// sublayer, for model.safetensors (so an exported checkpoint routes like the trained model).
std::vector<ExtraTensorToSave> balancing_bias_tensors(const Model& model) {
  std::vector<ExtraTensorToSave> tensors;
  const auto& balancers = model.balancers();
  for (size_t l = 0; l < balancers.size(); ++l)
    tensors.push_back({fmt::format("model.layers.{}.mlp.gate.balancing_biases", l),
                       {balancers[l].classes()},
                       balancers[l].bias.data()});
  return tensors;
}

}  // namespace

void restore_router_balancers(Model& model, const json& trainer_state,
                              const std::string& checkpoint_dir, bool required) {
  if (model.balancers().empty()) return;  // arch moe: nothing to restore
  const std::string file = checkpoint_dir + "/trainer_state.json";
  auto it = trainer_state.find("router_balancers");
  if (it == trainer_state.end() || (it->is_array() && it->empty())) {
    const std::string what = fmt::format(
        "{} has no \"router_balancers\": the routing biases of this zaya1 model were not saved",
        file);
    if (required)
      fail(what, "resume from a checkpoint written by a zaya1 training run, or start a new run "
                 "directory (train.run_dir)");
    std::fprintf(stderr, "warning: %s; routing uses the initial balancing biases\n",
                 what.c_str());
    return;
  }
  try {
    model.load_balancer_state(*it);
  } catch (const Error& e) {
    fail(fmt::format("{}: {}", file, e.what()), e.hint());
  }
}

double measure_gemm_peak_gflops(bool use_bf16) {
  // The best of several square products large enough to reach the library's top rate.
  const int64_t n = 2048;
  std::vector<float> a(n * n, 0.5f), c(n * n);
  std::vector<bf16> ah(n * n);
  convert_to_bf16(a.data(), ah.data(), n * n);
  const void* ap = use_bf16 ? static_cast<const void*>(ah.data()) : a.data();
  const DType dt = use_bf16 ? DType::bf16 : DType::f32;
  gemm(ap, false, ap, true, c.data(), n, n, n, dt);  // warm-up and primitive creation
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    double t0 = now_seconds();
    gemm(ap, false, ap, true, c.data(), n, n, n, dt);
    best = std::min(best, now_seconds() - t0);
  }
  return 2.0 * n * n * n / best / 1e9;
}

TrainSummary train(const RunConfig& rc, const TrainOptions& opt) {
  const ModelConfig& mc = rc.model;
  const TrainConfig& tc = rc.train;
  TrainConfig schedule_cfg = tc;
  if (opt.steps >= 0) schedule_cfg.steps = opt.steps;
  const int64_t total_steps = schedule_cfg.steps;
  const int64_t B = tc.batch_size, T = tc.seq_len, N = B * T;
  const DType precision = tc.precision == "bf16" ? DType::bf16 : DType::f32;

  // ---- processes: each rank trains on its slice of every global batch ----
  const Communicator* world = opt.world && opt.world->size() > 1 ? opt.world : nullptr;
  const int ranks = world ? world->size() : 1, rank = world ? world->rank() : 0;
  const bool root = rank == 0;
  const bool quiet = opt.quiet || !root;
  if (B % ranks != 0)
    fail(fmt::format("train.batch_size = {} sequences cannot be split evenly over {} ranks",
                     B, ranks),
         fmt::format("make train.batch_size a multiple of {} (it is the global batch)", ranks));
  const int64_t Bl = B / ranks, Nl = Bl * T;  // this rank's sequences and tokens
  if (world) check_same_config(*world, rc);
  if (tc.expert_parallel > 1 && !world)
    fail(fmt::format("train.expert_parallel = {} needs that many MPI ranks, but this is one process",
                     tc.expert_parallel),
         fmt::format("run under mpirun -np N with N a multiple of {}, or set train.expert_parallel=1",
                     tc.expert_parallel));
  std::optional<CommWatchdog> watchdog;
  if (world) watchdog.emplace(rank, tc.comm_timeout_s);
  auto guard = [&](const std::string& what) {
    return watchdog ? std::optional<CommWatchdog::Guard>(watchdog->guard(what))
                    : std::optional<CommWatchdog::Guard>();
  };

  if (!opt.synthetic_data && rc.data.dir.empty())
    fail("no dataset: data.dir is empty", "prepare one with 'foundry data prepare' and set "
         "data.dir, or train on random tokens with --synthetic-data");

  // ---- data ----
  std::optional<Dataset> dataset;
  std::optional<BatchLoader> train_loader, val_loader;
  if (!opt.synthetic_data) {
    dataset.emplace(rc.data.dir);
    if (dataset->vocab_size() != mc.vocab_size)
      fail(fmt::format("dataset '{}' has vocabulary size {} but model.vocab_size = {}",
                       rc.data.dir, dataset->vocab_size(), mc.vocab_size),
           fmt::format("set model.vocab_size to {} (--set model.vocab_size={})",
                       dataset->vocab_size(), dataset->vocab_size()));
    train_loader.emplace(*dataset, B, T, tc.seed);
    val_loader.emplace(BatchLoader::for_eval(*dataset, B, T));
  }

  // ---- model and optimizer ----
  Model model(mc, precision);
  // The load-balancing loss counts expert shares over the global batch (arch moe).
  if (world) model.set_data_parallel(world);
  std::optional<ExpertParallelGroups> ep_groups;
  if (world && tc.expert_parallel > 1) {
    ep_groups.emplace(split_expert_parallel(*world, static_cast<int>(tc.expert_parallel)));
    model.set_expert_parallel(&ep_groups->expert);
  }
  Optimizers optimizers(model.table(), tc, world);
  // Expert parallel with ZeRO-1: a rank stores its own experts, the dense tensors and its
  // shard, not the other ranks' experts (before initializing, so it never writes them).
  if (ep_groups) optimizers.shard_expert_storage(model, static_cast<int>(tc.expert_parallel));
  model.init_weights(tc.seed);
  optimizers.set_op_times(&model.op_times());
  // Data parallel: the backward pass reports finished gradients and the reduction of the
  // first buckets starts while the rest of backward computes (optim/grad_reduce.h).
  const bool overlap = optimizers.data_parallel() && tc.overlap_grad_reduce;
  if (overlap)
    model.set_gradients_final_hook([&optimizers](int64_t o) { optimizers.gradients_final(o); });
  GradientCommTotals comm_stats;
  const bool balancing = !model.balancers().empty();  // arch zaya1
  const int64_t assignments = N * mc.top_k;           // router choices per MoE sublayer (global)

  if (root) make_dirs(tc.run_dir);
  if (world) world->barrier();
  const std::string metrics_path = tc.run_dir + "/metrics.jsonl";
  int64_t start_step = 0;
  if (opt.resume) {
    auto latest = find_latest_checkpoint(tc.run_dir);
    if (!latest) {
      std::fprintf(stderr, "resume: no valid checkpoint in %s/checkpoints, starting fresh\n",
                   tc.run_dir.c_str());
    } else {
      // Before loading anything: a checkpoint of the other optimizer lacks (or has extra)
      // state slabs, and the plain message says more than a missing tensor would.
      check_same_optimizer(*latest, read_checkpoint_trainer_state(*latest), tc.optimizer);
      auto g = guard("loading " + *latest);
      json state = load_checkpoint(*latest, mc, model.table(), model.params(),
                                   optimizers.states_to_load());
      optimizers.finish_load();
      model.release_again();  // the checkpoint filled every parameter
      start_step = state.at("step").get<int64_t>();
      if (train_loader) train_loader->restore(state.at("data_cursor"));
      restore_router_balancers(model, state, *latest, /*required=*/true);
      model.sync_weights();
      if (root)
        std::fprintf(stderr, "resumed from %s (step %lld)\n", latest->c_str(),
                     static_cast<long long>(start_step));
    }
  }
  if (root) {
    truncate_metrics(metrics_path, start_step);
    write_file_atomic(tc.run_dir + "/config.json", rc.source.dump(2) + "\n");
  }

  const ParamCounts counts = count_parameters(mc);
  const double flops_per_token = train_flops_per_token(mc, T);
  double peak_gflops = tc.peak_gflops;
  if (peak_gflops <= 0) {
    // Every rank measures at once, so on a shared host each sees its share of the cores:
    // the sum is the job's peak.
    peak_gflops = measure_gemm_peak_gflops(precision == DType::bf16);
    if (world) world->allreduce(&peak_gflops, &peak_gflops, 1);
  } else {
    peak_gflops *= ranks;  // train.peak_gflops is per process
  }

  if (!quiet)
    std::fprintf(stderr,
                 "model: %s params (%s active/token), %lld layers, %lld experts top-%lld | "
                 "batch %lld x %lld tokens | %s GEMMs, peak %.0f GFLOP/s\n",
                 format_count(counts.total).c_str(), format_count(counts.active).c_str(), static_cast<long long>(mc.n_layers),
                 static_cast<long long>(mc.n_experts), static_cast<long long>(mc.top_k),
                 static_cast<long long>(B), static_cast<long long>(T), tc.precision.c_str(),
                 peak_gflops);
  if (!quiet) {
    std::fprintf(stderr, "optimizer: %s\n",
                 optimizers.describe(model.table(), muon_enabled(tc)).c_str());
    if (world)
      std::fprintf(stderr, "processes: %d ranks, %lld sequences each per step, expert parallel %lld%s\n",
                   ranks, static_cast<long long>(Bl), static_cast<long long>(tc.expert_parallel),
                   fmt::format(" | optimizer state per rank {:.1f} MiB ({}) | gradient reduction {}",
                               double(optimizers.state_bytes()) / (1 << 20),
                               optimizers.zero1() ? "ZeRO-1" : "replicated",
                               overlap ? fmt::format("overlapped with backward, {:g} MiB buckets",
                                                     tc.grad_bucket_mib)
                                       : std::string("after backward")).c_str());
  }

  // Every rank reads the whole global batch and keeps its slice, so the data each rank sees
  // depends only on the global batch and the rank count, not on how ranks read.
  std::vector<int32_t> inputs(N), targets(N);
  const int32_t* my_inputs = inputs.data() + rank * Nl;
  const int32_t* my_targets = targets.data() + rank * Nl;
  // The mean over ranks (equal token counts: the mean of the global batch).
  auto global_mean = [&](double local) {
    if (world) world->allreduce(&local, &local, 1);
    return local / ranks;
  };
  auto evaluate = [&]() -> double {
    if (!val_loader) return -1;
    auto g = guard("validation");
    val_loader->reset();
    double sum = 0;
    for (int64_t i = 0; i < tc.eval_batches; ++i) {
      val_loader->next(inputs.data(), targets.data());
      sum += model.forward(my_inputs, my_targets, Bl, T).ce_loss;
    }
    return global_mean(sum / static_cast<double>(tc.eval_batches));
  };
  auto save = [&](int64_t step) {
    // Everything random in training derives from the seed and the step (initialization,
    // synthetic batches) or lives in the data cursor, so these fully determine the future.
    json state = {{"step", step},          {"format", "foundry-trainer-state"},
                  {"seed", tc.seed},       {"optimizer", tc.optimizer},
                  {"config", rc.source}};
    if (train_loader) state["data_cursor"] = train_loader->cursor();
    // The balancers are model state outside the parameter slab: saved here in full (bias and
    // its AdamW state, for a bitwise resume) and, as biases only, in model.safetensors.
    if (balancing) state["router_balancers"] = model.balancer_state();
    state["schedule"] = {{"lr", learning_rate(schedule_cfg, std::max<int64_t>(step, 1))},
                         {"total_steps", total_steps}};
    double t0 = now_seconds();
    auto g = guard(fmt::format("checkpoint of step {}", step));
    std::vector<StateSlabToSave> states = optimizers.states_to_save();  // collective
    optimizers.gather_parameters_to_root(model.params());                // collective
    if (root) {
      std::string path = save_checkpoint(tc.run_dir, step, mc, model.table(), model.params(),
                                         states, state, tc.keep_checkpoints,
                                         balancing_bias_tensors(model));
      model.release_again();
      if (!quiet)
        std::fprintf(stderr, "saved checkpoint %s (%.2f s)\n", path.c_str(), now_seconds() - t0);
    }
    // Nobody goes on (or exits) before the checkpoint is committed.
    if (world) world->barrier();
  };

  TrainSummary summary;
  summary.start_step = start_step;
  summary.peak_gflops = peak_gflops;
  if (start_step == 0 && val_loader && total_steps > 0) {
    summary.initial_val_loss = evaluate();
    if (!quiet)
      std::fprintf(stderr, "step 0 | val loss %.4f | ppl %.1f\n", summary.initial_val_loss,
                   std::exp(summary.initial_val_loss));
  }

  std::ofstream metrics;
  if (root) {
    metrics.open(metrics_path, std::ios::app);
    if (!metrics) fail(fmt::format("cannot open '{}' for writing", metrics_path));
  }
  StopSignals signals;
  model.op_times().enabled = opt.op_breakdown;
  Progress progress("train", total_steps, "step");
  const bool show_bar = Progress::stderr_is_terminal() && !quiet;
  double timed_seconds = 0;
  int64_t timed_tokens = 0;
  int64_t step = start_step;
  int64_t training_rss = peak_rss_bytes();
  int64_t training_slabs = model.resident_slab_bytes();
  // The first steps create oneDNN primitives and fault in memory: the per-operation table
  // leaves them out when there are enough steps.
  const int64_t breakdown_warmup = total_steps - start_step > 4 ? 2 : 0;
  while (step < total_steps) {
    ++step;
    if (step == start_step + breakdown_warmup + 1) model.op_times().clear();
    const double t0 = now_seconds();
    auto step_guard = guard(fmt::format("training step {}", step));
    if (train_loader)
      train_loader->next(inputs.data(), targets.data());
    else
      synthetic_batch(inputs.data(), targets.data(), N, mc.vocab_size, tc.seed, step);
    const double lr = learning_rate(schedule_cfg, step);
    model.zero_grads();
    ForwardResult fr = model.forward(my_inputs, my_targets, Bl, T);
    // This batch's routing, for the balancer update after the optimizer step (a copy: a
    // validation forward before then would overwrite the model's counts), summed over ranks:
    // every rank's balancer sees the global batch and stays identical.
    std::vector<int64_t> class_counts;
    if (balancing) {
      class_counts = model.router_class_counts();
      if (world) sum_router_counts(*world, class_counts);
    }
    if (overlap) optimizers.begin_backward(model.grads());
    model.backward();
    double grad_norm;
    {
      // The optimizers time their own phases (communication apart from the local update).
      grad_norm = optimizers.step(model.params(), model.grads(), lr, step, tc.grad_clip);
      if (optimizers.data_parallel() && step > start_step + breakdown_warmup)
        comm_stats.add(optimizers.last_reduce());
      fr.loss = global_mean(fr.loss);
      fr.ce_loss = global_mean(fr.ce_loss);
      fr.aux_loss = global_mean(fr.aux_loss);
      if (!std::isfinite(fr.loss) || !std::isfinite(grad_norm))
        fail(fmt::format("step {}: loss {} / gradient norm {} is not finite", step, fr.loss,
                         grad_norm),
             "lower train.lr, raise train.warmup_steps, or use precision fp32 to investigate");
      model.sync_weights();
    }
    BalanceStats balance;
    if (balancing) {
      ScopedOpTimer t(&model.op_times(), "router balancing");
      const int64_t S = mc.router_classes();
      FOUNDRY_CHECK(static_cast<int64_t>(class_counts.size()) == mc.n_layers * S);
      balance = balance_stats(class_counts, S, assignments, mc.router_skip_class);
      model.update_balancers(class_counts.data(), assignments);
    }
    const double dt = now_seconds() - t0;
    if (step > start_step + 1 || total_steps - start_step == 1) {  // first step warms caches
      timed_seconds += dt;
      timed_tokens += N;
    }
    const double tokens_per_s = N / dt;
    const double mfu = tokens_per_s * flops_per_token / (peak_gflops * 1e9);
    json m = {{"step", step},           {"loss", fr.ce_loss},     {"aux_loss", fr.aux_loss},
              {"lr", lr},               {"grad_norm", grad_norm}, {"tokens_per_s", tokens_per_s},
              {"mfu", mfu},             {"step_time_s", dt},      {"tokens", step * N}};
    if (optimizers.data_parallel())
      m["grad_comm_exposed_s"] = optimizers.last_reduce().exposed_seconds;
    if (balancing) {
      m["max_load_error"] = balance.max_load_error;
      if (balance.skip_fraction >= 0) m["skip_fraction"] = balance.skip_fraction;
    }
    summary.last_train_loss = fr.ce_loss;

    const bool eval_now = val_loader && ((tc.eval_every > 0 && step % tc.eval_every == 0) ||
                                         step == total_steps);
    if (eval_now) {
      double val = evaluate();
      m["val_loss"] = val;
      summary.final_val_loss = val;
    }
    if (root) {
      metrics << m.dump() << "\n";
      metrics.flush();
    }
    if (!quiet && (step % tc.log_every == 0 || step == total_steps || eval_now)) {
      std::string line = fmt::format(
          "step {:>6}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | MFU {:.1f}%",
          step, total_steps, fr.ce_loss, lr, grad_norm, tokens_per_s, 100 * mfu);
      if (balancing) {
        line += fmt::format(" | load err {:.3f}", balance.max_load_error);
        if (balance.skip_fraction >= 0)
          line += fmt::format(" | skip {:.1f}%", 100 * balance.skip_fraction);
      }
      if (eval_now) line += fmt::format(" | val loss {:.4f}", m["val_loss"].get<double>());
      if (show_bar) std::fprintf(stderr, "\r\x1b[K");
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    if (show_bar) progress.update(step, fmt::format("loss {:.3f}", fr.ce_loss));

    const bool final_step = step == total_steps || step == opt.stop_at_step;
    // A signal reaches the ranks at different steps: stop together, at the first step any
    // rank saw one.
    int sig = signals.received();
    if (world) {
      double s = sig;
      world->allreduce(&s, &s, 1, ReduceOp::max);
      sig = static_cast<int>(s);
    }
    // Memory at the last step, before its checkpoint (which gathers the sharded optimizer
    // state on rank 0: not training memory).
    if (final_step || sig) {
      training_rss = peak_rss_bytes();
      training_slabs = model.resident_slab_bytes();
    }
    if (final_step || sig || (tc.checkpoint_every > 0 && step % tc.checkpoint_every == 0)) save(step);
    if (sig) {
      std::fprintf(stderr, "received %s: checkpoint saved at step %lld, exiting\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM", static_cast<long long>(step));
      summary.interrupted = true;
      break;
    }
    if (final_step) break;
  }
  if (show_bar) progress.finish();
  summary.final_step = step;
  if (timed_seconds > 0) {
    summary.tokens_per_s = timed_tokens / timed_seconds;
    summary.mfu = summary.tokens_per_s * flops_per_token / (peak_gflops * 1e9);
  }
  const int64_t steps_run = step - start_step - breakdown_warmup;
  // Memory and communication, every rank's (collective).
  summary.optimizer_state_bytes = optimizers.state_bytes();
  std::vector<double> rss(static_cast<size_t>(ranks), static_cast<double>(training_rss));
  std::vector<double> slabs(static_cast<size_t>(ranks), static_cast<double>(training_slabs));
  if (world) {
    const double mine[2] = {rss[0], slabs[0]};
    std::vector<double> all(2 * static_cast<size_t>(ranks));
    world->allgather(mine, all.data(), 2);
    for (int r = 0; r < ranks; ++r) {
      rss[r] = all[2 * r];
      slabs[r] = all[2 * r + 1];
    }
  }
  for (double r : rss) summary.peak_rss_bytes = std::max(summary.peak_rss_bytes, int64_t(r));
  if (comm_stats.steps > 0) summary.grad_comm_exposed_s = comm_stats.exposed / comm_stats.steps;
  if (root && (!quiet || opt.op_breakdown)) {
    // " rank 0 560 MiB, rank 1 560 MiB" (or " 560 MiB" in one process)
    auto per_rank = [&](const std::vector<double>& bytes) {
      std::string out;
      for (size_t r = 0; r < bytes.size(); ++r)
        out += world ? fmt::format("{} rank {} {:.0f} MiB", r ? "," : "", r, bytes[r] / (1 << 20))
                     : fmt::format(" {:.0f} MiB", bytes[r] / (1 << 20));
      return out;
    };
    const std::string line = fmt::format(
        "memory per rank: optimizer state {:.1f} MiB{} | weight and gradient slabs{} | peak RSS "
        "before the final checkpoint{}",
        double(summary.optimizer_state_bytes) / (1 << 20),
        world ? (optimizers.zero1() ? " (ZeRO-1)" : " (replicated)") : "", per_rank(slabs),
        per_rank(rss));
    std::fprintf(stderr, "%s\n", line.c_str());
    if (comm_stats.steps > 0) std::fprintf(stderr, "%s\n", comm_stats.describe(model.slab_size()).c_str());
  }
  if (opt.op_breakdown && steps_run > 0 && root) {
    double total = 0;
    for (const auto& [op, s] : model.op_times().seconds()) total += s;
    std::fprintf(stderr, "\nper-operation time (mean per step over %lld steps):\n",
                 static_cast<long long>(steps_run));
    for (const auto& [op, s] : model.op_times().seconds())
      std::fprintf(stderr, "  %-34s %8.2f ms  %5.1f%%\n", op.c_str(), 1e3 * s / steps_run,
                   100 * s / total);
    std::fprintf(stderr, "  %-34s %8.2f ms\n", "total", 1e3 * total / steps_run);
  }
  return summary;
}

}  // namespace foundry
