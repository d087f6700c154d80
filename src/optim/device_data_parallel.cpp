#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include "base/error.h"
#include "comm/comm.h"
#include "cuda/nccl.h"
#include "kernels/backend.h"
#include "model/backends.h"
#include "model/expert_parallel.h"
#include "model/model.h"
#include "optim/data_parallel_support.h"
#include "optim/device_optimizer.h"
#include "optim/grad_reduce.h"
#include "optim/zero1_layout.h"

namespace foundry {
namespace {

// The gradients' way through host memory, overlapped with backward where the model reports
// its finished gradients: each range reported final is queued for copying to the host behind
// the backward's work so far (Backend::CopyQueue), and the ranges that have landed go to the
// GradientReducer (the CPU's: the sums in rank order, in buckets started as they fill) at each
// report and, waiting for each in turn, when the step collects them: the last layers' buckets
// travel while the GPU computes the first layers' backward. Without the reports, the whole
// slab is copied and reduced at the step. The reducer's statistics count a bucket started
// while the step waits for a later copy as started during backward: the GPU is still
// computing backward then; what follows the last copy is the exposed part.
class HostStagedGradients {
 public:
  // shard_counts: empty for an all-reduce, else ZeRO-1's ranges' sizes (GradientReducer).
  HostStagedGradients(Backend& backend, const Communicator& comm, int64_t elements,
                      std::vector<int64_t> shard_counts, int64_t bucket_elements)
      : backend_(backend),
        elements_(elements),
        staging_(
            static_cast<float*>(backend.allocate_host(std::max<int64_t>(elements, 1) * kFloat)),
            HostRelease{&backend}),
        copies_(backend.copy_queue()),
        reducer_(comm, elements, std::move(shard_counts),
                 GradientReducerOptions{bucket_elements,
                                        GradientReducerOptions{}.max_message_elements}) {}

  float* host() { return staging_.get(); }

  // Before backward: `grads` is the device's gradient slab; `shard` (reduce-scatter) the host
  // buffer of this rank's sums.
  void begin(const float* grads, float* shard) {
    copies_->restart();
    queued_.clear();
    grads_ = grads;
    copied_from_ = elements_;
    reducer_.begin(staging_.get(), shard);
  }
  // Every gradient at offset >= `offset` is final in the work queued so far.
  void final_from(int64_t offset) {
    if (!reducer_.armed() || offset >= copied_from_) return;
    queued_.push_back({offset, copies_->queue(staging_.get() + offset, grads_ + offset,
                                              (copied_from_ - offset) * kFloat)});
    copied_from_ = offset;
    while (!queued_.empty() && copies_->landed(queued_.front().copy)) feed_front();
  }
  // The reduction of the whole slab of `grads` (device): on return the sums are in host()
  // (all-reduce) or `shard` (reduce-scatter).
  GradientReduceStats finish(const float* grads, float* shard) {
    if (!reducer_.armed()) {
      backend_.to_host(staging_.get(), grads, elements_ * kFloat);
      return reducer_.finish(staging_.get(), shard);
    }
    final_from(0);
    while (!queued_.empty()) {
      copies_->wait(queued_.front().copy);
      feed_front();
    }
    return reducer_.finish(staging_.get(), shard);
  }

 private:
  static constexpr int64_t kFloat = sizeof(float);
  struct HostRelease {
    Backend* backend;
    void operator()(float* p) const { backend->release_host(p); }
  };
  struct Queued {
    int64_t offset, copy;
  };
  void feed_front() {
    reducer_.final_from(queued_.front().offset);
    queued_.erase(queued_.begin());
  }

  Backend& backend_;
  int64_t elements_;
  std::unique_ptr<float, HostRelease> staging_;  // outlives the copies into it
  std::unique_ptr<Backend::CopyQueue> copies_;
  GradientReducer reducer_;
  const float* grads_ = nullptr;
  int64_t copied_from_ = 0;     // the lowest offset queued for copying this backward
  std::vector<Queued> queued_;  // copies not yet given to the reducer, in order
};

// Data parallel over ranks whose gradients live in GPU memory, every rank holding the whole
// state: each step averages the gradients over the ranks, then runs the local (device)
// optimizer on the average. Through host memory (HostStagedGradients: copied out during
// backward, summed over the MPI communicator in rank order, then scaled: ReplicatedOptimizer's
// arithmetic) where ranks share a GPU or the build has no NCCL, or with NCCL on the device
// buffers where every rank has a GPU of its own (ncclAvg scales each rank's gradient before
// the sum: other roundings than the host path's).
class GpuReplicatedOptimizer final : public DataParallelOptimizer {
 public:
  GpuReplicatedOptimizer(std::unique_ptr<DataParallelOptimizer> local, Backend& backend,
                         const Communicator& world, int64_t elements, GpuGradients how,
                         int64_t bucket_elements)
      : local_(std::move(local)),
        backend_(backend),
        elements_(elements),
        ranks_(world.size()),
        rank_(world.rank()) {
    if (how == GpuGradients::nccl) {
      nccl_ = open_nccl_group(world);
      buckets_.emplace(elements, bucket_elements, [this](float* grads, SlabRange r) {
        nccl_->allreduce_mean_beside(grads + r.begin, r.size());
      });
    } else {
      staged_.emplace(backend, world, elements, std::vector<int64_t>{}, bucket_elements);
    }
  }

  void begin_backward(float* grads) override {
    if (staged_) staged_->begin(grads, nullptr);
    if (buckets_) buckets_->begin(grads);
  }
  void gradients_final(int64_t offset) override {
    if (staged_) staged_->final_from(offset);
    if (buckets_) buckets_->final_from(offset);
  }
  double step(float* params, float* grads, double lr, int64_t step, double max_norm,
              const UpdateVeto& veto) override {
    if (nccl_) {
      ScopedOpTimer t(op_times_, "comm: gradients over NCCL");
      if (buckets_->finish())
        nccl_->allreduce_mean(grads, elements_);
      else
        nccl_->join();
    } else {
      average_through_host(grads);
    }
    return local_->step(params, grads, lr, step, max_norm, veto);
  }
  const GradientReduceStats* last_reduce() const override {
    return staged_ ? &last_reduce_ : nullptr;
  }
  bool write_bf16_weights(bf16* mirror) override { return local_->write_bf16_weights(mirror); }

  int64_t state_bytes() const override { return local_->state_bytes(); }
  // Every rank holds everything: each saves an even share, and loads all.
  SlabRange parameters_to_save() const override {
    return even_share(local_->parameters_to_save().end, ranks_, rank_);
  }
  std::vector<StateRun> states_to_save_runs() override {
    return clip_runs(local_->states_to_save_runs(), parameters_to_save());
  }
  std::vector<StateRun> live_state_runs() override {
    return clip_runs(local_->live_state_runs(), parameters_to_save());
  }
  std::vector<StateRun> states_to_load_runs() override { return local_->states_to_load_runs(); }

  void shard_expert_storage(Model&, int) override {}
  std::string describe() const override {
    return local_->describe() + fmt::format(", replicated on {} ranks, gradients averaged {}",
                                            ranks_, nccl_ ? "over NCCL" : "through host memory");
  }
  const char* layout_name() const override {
    return nccl_ ? "replicated, NCCL" : "replicated, host-staged";
  }
  void set_op_times(OpTimes* times) override {
    op_times_ = times;
    local_->set_op_times(times);
  }
  void abort_collectives() override {
    if (nccl_) nccl_->abort();
  }

 private:
  void average_through_host(float* grads) {
    ScopedOpTimer t(op_times_, "comm: gradients through host memory");
    last_reduce_ = staged_->finish(grads, nullptr);
    average_over_ranks(staged_->host(), elements_, ranks_);
    backend_.from_host(grads, staged_->host(), elements_ * static_cast<int64_t>(sizeof(float)));
  }

  std::unique_ptr<DataParallelOptimizer> local_;
  Backend& backend_;
  int64_t elements_;
  std::optional<HostStagedGradients> staged_;  // through host memory
  GradientReduceStats last_reduce_;
  std::unique_ptr<gpu::NcclGroup> nccl_;  // over NCCL
  std::optional<NcclBuckets> buckets_;
  int ranks_, rank_;
  OpTimes* op_times_ = nullptr;
};

// ZeRO-1 over ranks whose slabs live in device memory. The state is sharded along
// Zero1Layout::state_range: the ZeRO-1 shards with each boundary moved to the end of the Muon
// matrix that crosses it, so a rank updates whole matrices from its own part of the gradient
// (the CPU's ZeRO-1 cuts at fixed shard sizes and exchanges the pieces of split matrices
// instead). A step: the gradients reduce-scattered to those ranges (and averaged); the local
// device optimizer on this rank's range, its sum of squares added over the ranks in rank
// order; the updated ranges all-gathered. With NCCL on the device buffers (a reduce to each
// range's rank, and a broadcast from it, each grouped into one launch) or through host memory
// over the MPI communicator (the CPU's reduce-scatter, summing in rank order).
class GpuShardedOptimizer final : public DataParallelOptimizer {
 public:
  GpuShardedOptimizer(const ParamTable& table, const OptimizerOptions& options, Backend& backend,
                      const Communicator& world, GpuGradients how,
                      std::unique_ptr<OptimizerKernels> kernels)
      : table_(table),
        muon_on_(options.muon.has_value()),
        backend_(backend),
        comm_(world.dup()),
        layout_(table, world.size(), options.muon.has_value()),
        elements_(table.total_elements()) {
    for (int r = 0; r < comm_.size(); ++r) {
      ranges_.push_back(layout_.state_range(r));
      counts_.push_back(ranges_.back().size());
    }
    mine_ = ranges_[static_cast<size_t>(comm_.rank())];
    local_ = make_device_optimizer(table, options, backend, std::move(kernels),
                                   {mine_, [this](double sum) { return sum_over_ranks(sum); }});
    if (how == GpuGradients::nccl) {
      nccl_ = open_nccl_group(comm_);
      buckets_.emplace(elements_, options.bucket_elements,
                       [this](float* grads, SlabRange r) { reduce_beside(grads, r); });
    } else {
      staged_.emplace(backend, comm_, elements_, counts_, options.bucket_elements);
      shard_.resize(static_cast<size_t>(mine_.size()));
    }
  }

  void begin_backward(float* grads) override {
    if (staged_) staged_->begin(grads, shard_.data());
    if (buckets_) buckets_->begin(grads);
  }
  void gradients_final(int64_t offset) override {
    if (staged_) staged_->final_from(offset);
    if (buckets_) buckets_->final_from(offset);
  }
  double step(float* params, float* grads, double lr, int64_t step, double max_norm,
              const UpdateVeto& veto) override {
    reduce_scatter_gradients(grads);
    // Every rank sees the same norm and the veto is the caller's agreed decision: a skipped
    // update is skipped on every rank, and nothing needs gathering.
    bool vetoed = false;
    const double norm = local_->step(params, grads, lr, step, max_norm, [&](double n) {
      vetoed = veto && veto(n);
      return vetoed;
    });
    if (vetoed || !std::isfinite(norm)) return norm;
    all_gather_weights(params);
    return norm;
  }
  const GradientReduceStats* last_reduce() const override {
    return staged_ ? &last_reduce_ : nullptr;
  }
  // The bf16 copies of the other ranks' ranges are not gathered: the caller refreshes the
  // whole copy after the step (Model::sync_weights).
  bool write_bf16_weights(bf16*) override { return false; }

  int64_t state_bytes() const override { return local_->state_bytes(); }
  SlabRange parameters_to_save() const override { return mine_; }
  std::vector<StateRun> states_to_save_runs() override { return local_->states_to_save_runs(); }
  std::vector<StateRun> states_to_load_runs() override { return local_->states_to_load_runs(); }
  std::vector<StateRun> live_state_runs() override { return local_->live_state_runs(); }

  // A rank stores its own experts, the dense tensors and its state range, whose parameters it
  // updates and whose gradients the reduction writes in place: the other ranks' experts
  // outside that range are handed back (their gradients read as zeros, this rank's share of
  // the sums; the all-gather's writes there are lost).
  void shard_expert_storage(Model& model, int ep_size) override {
    const SlabHoles holes = device_expert_holes(table_, model.config().n_experts, ep_size,
                                                comm_.size(), comm_.rank(), muon_on_, false);
    if (!holes.empty()) model.shard_expert_storage(holes.params, holes.gradients);
  }
  std::string describe() const override {
    return describe_optimizer_split(table_, muon_on_) +
           fmt::format(" on the GPU, ZeRO-1 over {} ranks, gradients reduce-scattered {}",
                       comm_.size(), nccl_ ? "over NCCL" : "through host memory");
  }
  const char* layout_name() const override {
    return nccl_ ? "ZeRO-1, NCCL" : "ZeRO-1, host-staged";
  }
  void set_op_times(OpTimes* times) override {
    op_times_ = times;
    local_->set_op_times(times);
  }
  void abort_collectives() override {
    if (nccl_) nccl_->abort();
  }

 private:
  // The ranks' partial sums of squares, added in rank order (the same bits on every rank).
  double sum_over_ranks(double partial) const {
    std::vector<double> all(static_cast<size_t>(comm_.size()));
    comm_.allgather(&partial, all.data(), 1);
    double total = 0;
    for (double s : all) total += s;
    return total;
  }

  // A bucket of the gradients reduced over NCCL beside backward, each rank's part to it.
  void reduce_beside(float* grads, SlabRange bucket) {
    std::vector<SlabRange> parts;
    for (const SlabRange& r : ranges_) parts.push_back(intersect(r, bucket));
    nccl_->reduce_mean_to_ranges_beside(grads, parts);
  }

  // On return this rank's range of `grads` holds the ranks' average there (the rest of the
  // slab is left as it was or overwritten, and is not read again).
  void reduce_scatter_gradients(float* grads) {
    if (nccl_) {
      ScopedOpTimer t(op_times_, "comm: gradient reduce-scatter over NCCL");
      if (buckets_->finish())
        nccl_->reduce_mean_to_ranges(grads, ranges_);
      else
        nccl_->join();
      return;
    }
    ScopedOpTimer t(op_times_, "comm: gradient reduce-scatter through host memory");
    last_reduce_ = staged_->finish(grads, shard_.data());
    average_over_ranks(shard_.data(), mine_.size(), comm_.size());
    if (mine_.size() > 0)
      backend_.from_host(grads + mine_.begin, shard_.data(),
                         mine_.size() * static_cast<int64_t>(sizeof(float)));
  }

  // Every rank's updated range to every rank.
  void all_gather_weights(float* params) {
    if (nccl_) {
      ScopedOpTimer t(op_times_, "comm: weight all-gather over NCCL");
      nccl_->broadcast_ranges(params, ranges_);
      return;
    }
    ScopedOpTimer t(op_times_, "comm: weight all-gather through host memory");
    const int64_t bytes = static_cast<int64_t>(sizeof(float));
    float* staging = staged_->host();  // the gradients' staging, free after the reduction
    if (mine_.size() > 0)
      backend_.to_host(staging + mine_.begin, params + mine_.begin, mine_.size() * bytes);
    // MPI counts are ints: windows of the slab, each rank's part of each window.
    constexpr int64_t kWindow = int64_t{1} << 30;
    for (int64_t at = 0; at < elements_; at += kWindow) {
      const SlabRange window{at, std::min(elements_, at + kWindow)};
      std::vector<int64_t> counts;
      for (const SlabRange& r : ranges_) counts.push_back(intersect(r, window).size());
      comm_.allgatherv_in_place(staging + at, counts);
    }
    backend_.from_host(params, staging, elements_ * bytes);
  }

  const ParamTable& table_;
  bool muon_on_;
  Backend& backend_;
  Communicator comm_;
  Zero1Layout layout_;
  int64_t elements_;
  std::vector<SlabRange> ranges_;  // every rank's state range, in rank order
  std::vector<int64_t> counts_;
  SlabRange mine_;
  std::unique_ptr<DataParallelOptimizer> local_;
  std::unique_ptr<gpu::NcclGroup> nccl_;  // over NCCL
  std::optional<NcclBuckets> buckets_;
  std::optional<HostStagedGradients> staged_;  // through host memory
  std::vector<float> shard_;
  GradientReduceStats last_reduce_;
  OpTimes* op_times_ = nullptr;
};

}  // namespace

SlabHoles device_expert_holes(const ParamTable& table, int64_t n_experts, int ep, int world,
                              int rank, bool muon, bool bf16) {
  if (ep <= 1 || n_experts % ep != 0 || world % ep != 0) return {};
  const auto unowned = unowned_expert_ranges_by_rank(table, ExpertSharding(n_experts, ep), world);
  const SlabRanges& theirs = unowned.at(static_cast<size_t>(rank));
  const SlabRanges released = subtract(theirs, Zero1Layout(table, world, muon).state_range(rank));
  return {released, released, bf16 ? theirs : SlabRanges{}};
}

GpuGradients gpu_gradients_path(const std::vector<std::array<int64_t, 2>>& rank_gpus,
                                bool nccl_everywhere) {
  for (size_t a = 0; a < rank_gpus.size(); ++a)
    for (size_t b = 0; b < a; ++b)
      if (rank_gpus[a] == rank_gpus[b]) return GpuGradients::host;  // two ranks on one GPU
  return nccl_everywhere ? GpuGradients::nccl : GpuGradients::host;
}

std::unique_ptr<DataParallelOptimizer> make_device_data_parallel_optimizer(
    const ParamTable& table, const OptimizerOptions& options, Backend& backend,
    const Communicator& world, GpuGradients how,
    const std::function<std::unique_ptr<OptimizerKernels>()>& kernels) {
  if (options.zero1)
    return std::make_unique<GpuShardedOptimizer>(table, options, backend, world, how, kernels());
  return std::make_unique<GpuReplicatedOptimizer>(
      make_device_optimizer(table, options, backend, kernels()), backend, world,
      table.total_elements(), how, options.bucket_elements);
}

}  // namespace foundry
