#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "base/error.h"
#include "base/format.h"
#include "comm/comm.h"
#include "model/expert_parallel.h"
#include "model/model.h"
#include "optim/clip.h"
#include "optim/data_parallel_support.h"
#include "optim/zero1.h"

namespace foundry {

std::string describe_optimizer_split(const ParamTable& table, bool muon_on) {
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
  if (muon_on)
    return fmt::format("muon ({} tensors, {} params) + adamw (rest: {} tensors, {} params)",
                       muon_tensors, format_count(muon_params), adam_tensors,
                       format_count(adam_params));
  return fmt::format("adamw (all {} tensors, {} params)", adam_tensors, format_count(adam_params));
}

// Rank r's share of n elements in an even split over `ranks` (ZeRO-1's shard formula).
SlabRange even_share(int64_t n, int ranks, int r) {
  const int64_t b = (n + ranks - 1) / ranks;
  return {std::min(n, r * b), std::min(n, (r + 1) * b)};
}

// The parts of `runs` inside `share`.
std::vector<StateRun> clip_runs(const std::vector<StateRun>& runs, SlabRange share) {
  std::vector<StateRun> clipped;
  for (const StateRun& r : runs) {
    const int64_t b = std::max(r.begin, share.begin), e = std::min(r.end, share.end);
    if (b < e) clipped.push_back({r.state, b, e, r.data + (b - r.begin), r.on_device});
  }
  return clipped;
}

// The summed gradient x [n] of `ranks` ranks, divided by them in place (in float, as every
// replicated layout does, so that they agree bit for bit).
void average_over_ranks(float* x, int64_t n, int ranks) {
  const float inv_ranks = static_cast<float>(1.0 / ranks);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] *= inv_ranks;
}

// Adjacent runs of one state whose values are adjacent too become one run (ZeRO-1 keeps its
// AdamW moments in fixed-size chunks: a checkpoint wants them as few, long pieces).
std::vector<StateRun> merge_runs(std::vector<StateRun> runs) {
  std::vector<StateRun> merged;
  for (StateRun& r : runs) {
    if (!merged.empty()) {
      StateRun& last = merged.back();
      if (last.state == r.state && last.end == r.begin && last.on_device == r.on_device &&
          last.data + (last.end - last.begin) == r.data) {
        last.end = r.end;
        continue;
      }
    }
    merged.push_back(std::move(r));
  }
  return merged;
}

namespace {

// One process: AdamW, plus Muon when configured, on whole slabs.
class LocalOptimizer final : public DataParallelOptimizer {
 public:
  LocalOptimizer(const ParamTable& table, const OptimizerOptions& options)
      : table_(table), adam_applies_(options.adamw.applies), adam_(table, options.adamw) {
    if (options.muon) muon_.emplace(table, *options.muon);
  }

  void begin_backward(float*) override {}
  void gradients_final(int64_t) override {}
  double step(float* params, float* grads, double lr, int64_t step, double max_norm,
              const UpdateVeto& veto) override {
    ScopedOpTimer t(op_times_, "optimizer");
    return clip_and_update(params, grads, lr, step, max_norm, veto);
  }
  const GradientReduceStats* last_reduce() const override { return nullptr; }
  bool write_bf16_weights(bf16* mirror) override {
    weights_bf16_ = mirror;
    return true;
  }

  // The state its tensors use: AdamW's two moments of the tensors it updates, Muon's momentum
  // of its matrices (the slabs' pages elsewhere are never written, and take no memory).
  int64_t state_bytes() const override {
    int64_t n = 0;
    for (const ParamInfo& p : table_.params())
      if (muon_ && muon_applies(p))
        n += p.numel * static_cast<int64_t>(Muon::state_names().size());
      else if (adam_.updates(p))
        n += p.numel * static_cast<int64_t>(AdamW::state_names().size());
    return n * static_cast<int64_t>(sizeof(float));
  }
  SlabRange parameters_to_save() const override { return {0, table_.total_elements()}; }
  // Each tensor's state in the slabs of the optimizer that updates it.
  std::vector<StateRun> states_to_save_runs() override {
    std::vector<StateRun> runs;
    for (const ParamInfo& p : table_.params()) {
      const bool muon = muon_ && muon_applies(p);
      if (!muon && adam_applies_ && !adam_applies_(p)) continue;
      for (const std::string& name : muon ? Muon::state_names() : AdamW::state_names()) {
        std::span<float> slab = muon ? muon_->state(name) : adam_.state(name);
        runs.push_back({name, p.offset, p.offset + p.numel, slab.data() + p.offset});
      }
    }
    return runs;
  }
  std::vector<StateRun> states_to_load_runs() override { return states_to_save_runs(); }

  void shard_expert_storage(Model&, int) override {}
  std::string describe() const override {
    return describe_optimizer_split(table_, muon_.has_value());
  }
  const char* layout_name() const override { return "single process"; }
  void set_op_times(OpTimes* times) override { op_times_ = times; }

  // Clip, then both optimizers on the whole slab (shared with the replicated layout). The
  // clip factor and the bf16 copy ride along the updates' own passes: the gradients are
  // left unscaled.
  double clip_and_update(float* params, float* grads, double lr, int64_t step, double max_norm,
                         const UpdateVeto& veto) {
    check_max_norm(max_norm);  // before any work
    const double norm = grad_norm(grads, table_);
    if ((veto && veto(norm)) || !std::isfinite(norm)) return norm;
    const StepFusion fusion{clip_factor(norm, max_norm), weights_bf16_};
    adam_.step(params, grads, lr, step, fusion);
    if (muon_) muon_->step(params, grads, lr, step, fusion);
    return norm;
  }
  OpTimes* op_times() const { return op_times_; }

 private:
  const ParamTable& table_;
  std::function<bool(const ParamInfo&)> adam_applies_;  // unset: every tensor
  AdamW adam_;
  std::optional<Muon> muon_;
  OpTimes* op_times_ = nullptr;
  bf16* weights_bf16_ = nullptr;
};

// Data parallel with the state replicated: every rank gets the summed gradient (a direct
// all-reduce, overlapped with backward when armed), averages it and runs the single-process
// step on identical inputs.
class ReplicatedOptimizer final : public DataParallelOptimizer {
 public:
  ReplicatedOptimizer(const ParamTable& table, const OptimizerOptions& options,
                      const Communicator& world)
      : local_(table, options),
        reducer_(world, table.total_elements(), std::vector<int64_t>{},
                 GradientReducerOptions{.bucket_elements = options.bucket_elements}),
        ranks_(world.size()),
        rank_(world.rank()) {}

  void begin_backward(float* grads) override { reducer_.begin(grads, nullptr); }
  void gradients_final(int64_t offset) override { reducer_.final_from(offset); }
  double step(float* params, float* grads, double lr, int64_t step, double max_norm,
              const UpdateVeto& veto) override {
    last_reduce_ = reducer_.finish(grads, nullptr);
    ScopedOpTimer t(local_.op_times(), "optimizer");
    average_over_ranks(grads, reducer_.slab_elements(), ranks_);
    return local_.clip_and_update(params, grads, lr, step, max_norm, veto);
  }
  const GradientReduceStats* last_reduce() const override { return &last_reduce_; }
  bool write_bf16_weights(bf16* mirror) override { return local_.write_bf16_weights(mirror); }

  int64_t state_bytes() const override { return local_.state_bytes(); }
  // Every rank holds everything: each saves an even share, and loads all.
  SlabRange parameters_to_save() const override {
    return even_share(local_.parameters_to_save().end, ranks_, rank_);
  }
  std::vector<StateRun> states_to_save_runs() override {
    return clip_runs(local_.states_to_save_runs(), parameters_to_save());
  }
  std::vector<StateRun> states_to_load_runs() override { return local_.states_to_load_runs(); }

  // Every rank updates every parameter, so every rank keeps them all.
  void shard_expert_storage(Model&, int) override {}
  std::string describe() const override {
    return local_.describe() +
           fmt::format(", replicated on {} ranks (train.zero1 = false)", ranks_);
  }
  const char* layout_name() const override { return "replicated"; }
  void set_op_times(OpTimes* times) override {
    local_.set_op_times(times);
    reducer_.set_op_times(times);
  }

 private:
  LocalOptimizer local_;
  GradientReducer reducer_;
  GradientReduceStats last_reduce_;
  int ranks_, rank_;
};

// Data parallel with the state sharded (optim/zero1.h).
class ShardedOptimizer final : public DataParallelOptimizer {
 public:
  ShardedOptimizer(const ParamTable& table, const OptimizerOptions& options,
                   const Communicator& world)
      : table_(table),
        muon_on_(options.muon.has_value()),
        zero1_(table, options.adamw, options.muon, world,
               Zero1Options{.bucket_elements = options.bucket_elements}) {}

  void begin_backward(float* grads) override { zero1_.begin_backward(grads); }
  void gradients_final(int64_t offset) override { zero1_.gradients_final(offset); }
  double step(float* params, float* grads, double lr, int64_t step, double max_norm,
              const UpdateVeto& veto) override {
    return zero1_.step(params, grads, lr, step, max_norm, veto);
  }
  const GradientReduceStats* last_reduce() const override { return &zero1_.last_reduce(); }

  int64_t state_bytes() const override { return zero1_.allocated_bytes(); }
  SlabRange parameters_to_save() const override {
    const SlabRange s = zero1_.layout().shard(zero1_.rank());
    return {s.begin, s.end};
  }
  std::vector<StateRun> states_to_save_runs() override {
    std::vector<StateRun> runs;
    for (const std::string& name : zero1_.state_names())
      for (const auto& r : zero1_.state_runs(name)) runs.push_back({name, r.begin, r.end, r.data});
    return merge_runs(std::move(runs));
  }
  std::vector<StateRun> states_to_load_runs() override { return states_to_save_runs(); }

  void shard_expert_storage(Model& model, int ep_size) override {
    if (ep_size <= 1) return;
    auto unowned = unowned_expert_ranges_by_rank(
        table_, ExpertSharding(model.config().n_experts, ep_size), zero1_.dp());
    auto released = zero1_released_ranges(zero1_.layout(), unowned);
    model.shard_expert_storage(released[static_cast<size_t>(zero1_.rank())]);
    zero1_.set_released_ranges(std::move(released));
    zero1_.set_zero_gradient_ranges(std::move(unowned));
  }
  std::string describe() const override {
    return describe_optimizer_split(table_, muon_on_) +
           fmt::format(", ZeRO-1 over {} ranks", zero1_.dp());
  }
  const char* layout_name() const override { return "ZeRO-1"; }
  void set_op_times(OpTimes* times) override { zero1_.set_op_times(times); }

 private:
  const ParamTable& table_;
  bool muon_on_;
  Zero1Optimizer zero1_;
};

}  // namespace

std::unique_ptr<DataParallelOptimizer> make_optimizer(const ParamTable& table,
                                                      const OptimizerOptions& options,
                                                      const Communicator* world) {
  if (!world || world->size() == 1) return std::make_unique<LocalOptimizer>(table, options);
  if (options.zero1) return std::make_unique<ShardedOptimizer>(table, options, *world);
  return std::make_unique<ReplicatedOptimizer>(table, options, *world);
}

}  // namespace foundry
