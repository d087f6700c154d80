// ZeRO-1: the optimizer state sharded over the data-parallel ranks, with distributed Muon.
// The design, the memory formulas and measured numbers are in docs/zero1.md.
//
// Every rank holds the full fp32 parameter slab and computes a full gradient slab for its
// own micro-batch. The slab (E = ParamTable::total_elements() elements, alignment padding
// included) is cut into dp contiguous shards of B = ceil(E/dp) elements, rank r owning
// [r·B, min((r+1)·B, E)) (the last shards may be shorter or empty). One step:
//
//   1. reduce-scatter the gradient slabs (sum), so rank r gets its shard of the sum, and
//      scale it by 1/dp: the gradient is the average of the ranks' gradients;
//   2. the global gradient norm from the shards' sums of squares (each in double over fixed
//      chunks, then added in rank order on every rank); clip by it as optim/clip.h does;
//   3. AdamW on the shard's elements of AdamW tensors, with moments for those elements only;
//   4. Muon for every matrix whose first element lies in the shard (its owner): a matrix
//      inside the shard is updated locally; a matrix split across a shard boundary is
//      assembled at its owner from the pieces of the other ranks holding it (point to
//      point), orthogonalized there with the owner's momentum for the whole matrix, and the
//      updated pieces are sent back to their holders;
//   5. all-gather the shards of the updated parameter slab, so every rank has all of it.
//
// Matching the single-process step: on one rank every operation is the single-process one
// (optim/adamw.h, optim/muon.h, optim/clip.h) in the same order, and the result is bitwise
// identical. On several ranks the gradient sum and the norm are added in another order, so
// results agree to float rounding (about 1e-6 relative), not bitwise.
//
// Determinism: the same layout, inputs and thread count give bitwise identical results on
// every run, and every rank ends a step with the same parameter slab. No atomics; reductions
// run in a fixed order (MPI's reduce-scatter for a fixed rank count and message size, then
// our own ordered sums).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/page_slab.h"
#include "base/timer.h"
#include "comm/comm.h"
#include "model/params.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/grad_reduce.h"
#include "optim/muon.h"
#include "optim/zero1_layout.h"

namespace foundry {

// ---- the optimizer ------------------------------------------------------------------------

struct Zero1Options {
  // Longest run of elements a single collective or message carries: the slab is
  // reduce-scattered and all-gathered in windows of this many elements, and checkpoint
  // state moves in messages of at most this many (MPI counts are int). A smaller window
  // also bounds the scratch MPI's reduce-scatter allocates (up to the whole message), at
  // the cost of one collective, with its full latency, per window (docs/zero1.md).
  int64_t max_message_elements = int64_t{1} << 30;
  // Final gradient elements that start a non-blocking reduce-scatter during backward (when
  // the caller arms it with begin_backward; optim/grad_reduce.h).
  int64_t bucket_elements = GradientReducerOptions{}.bucket_elements;
};

class Zero1Optimizer {
 public:
  // Collective over `dp` (which it duplicates, so its messages never meet the caller's).
  // AdamW updates the tensors adamw.applies selects (all when unset); Muon, when given,
  // updates those muon_applies() selects. A tensor selected by both is an error (set
  // adamw.applies to exclude the Muon tensors, as the trainer does). Every rank must pass
  // the same table and options: a mismatch is an error on every rank naming the first rank
  // that differs.
  Zero1Optimizer(const ParamTable& table, const AdamWOptions& adamw,
                 const std::optional<MuonOptions>& muon, const Communicator& dp,
                 const Zero1Options& options = {});

  // One optimizer step, collective. `params` is the full parameter slab, identical on every
  // rank on entry; `grads` this rank's full gradient slab (the gradient of its local mean
  // loss; read only). The global gradient is the average over ranks; it is clipped to
  // `max_grad_norm` (0 = off) and the step applied; on return `params` holds the updated
  // slab on every rank. Returns the global gradient norm before clipping. When that norm is
  // not finite, or `veto` (optim/clip.h; called on every rank with that norm, after the
  // norm's all-reduce and before anything is written) says so, nothing is updated on any
  // rank (parameters and state stay as they were) and the caller decides. lr, step and
  // max_grad_norm must be the same on every rank (checked). `step` is 1-based, as in
  // AdamW::step.
  double step(float* params, const float* grads, double lr, int64_t step, double max_grad_norm,
              const UpdateVeto& veto = {});

  // Overlap (optional): begin_backward(grads) before the backward pass and
  // gradients_final(o) from the model's hook (Model::set_gradients_final_hook) reduce-scatter
  // the gradients in buckets while backward runs; step() then only finishes the rest. The
  // result is the same as without (bitwise at 2 ranks; see optim/grad_reduce.h). `grads`
  // must be the slab later passed to step().
  void begin_backward(const float* grads);
  void gradients_final(int64_t offset) { reducer_->final_from(offset); }
  // The gradient reduction of the last step: what ran during backward, what was exposed.
  const GradientReduceStats& last_reduce() const { return last_reduce_; }

  // Ranks that do not store every parameter (expert parallel, Model::shard_expert_storage):
  // released[r] lists the slab ranges rank r does not store (sorted, disjoint; the same list
  // on every rank; each rank's own shard must be stored). The weight all-gather then sends
  // every rank only the parts of each shard it stores, in one message per pair of ranks, and
  // never writes a rank's released ranges. Empty lists (the default): the plain all-gather.
  using Ranges = SlabRanges;
  void set_released_ranges(std::vector<Ranges> released);
  // Gradient ranges each rank never writes (the other EP ranks' experts), per rank: the
  // reduce-scatter neither sends nor reads them (GradientReducer::set_zero_ranges).
  void set_zero_gradient_ranges(std::vector<Ranges> zero) {
    reducer_->set_zero_ranges(std::move(zero));
  }
  // Collective: rank `root` receives from the shards' owners every parameter of its released
  // ranges (a checkpoint written by root needs them all); no-op without released ranges.
  void gather_released(float* params, int root);

  // The state slabs a checkpoint holds: AdamW::state_names(), then Muon::state_names() when
  // Muon is on; each the size and layout of the single-process optimizers' slabs.
  std::vector<std::string> state_names() const;
  // Collective: the state slab `name` in full (E floats) on rank 0, exactly as the
  // single-process optimizers lay it out (zero where the optimizer keeps nothing); an empty
  // vector on the other ranks.
  std::vector<float> gather_state(std::string_view name) const;
  // Collective: rank 0's `full_slab` (E floats) becomes the state `name`; every rank keeps
  // its part (sent from rank 0, so the other ranks may pass an empty span: what they pass is
  // not read). A checkpoint written at any dp loads at any other.
  void load_state(std::string_view name, std::span<const float> full_slab);
  void reset();  // zeroes every state

  // The runs of state `name` this rank keeps, in slab coordinates, pointing into its own
  // buffers: AdamW moments for the shard's AdamW elements, Muon momentum for the owned
  // matrices whole. Over the ranks every element the optimizer keeps is in exactly one run,
  // so a sharded checkpoint saves and loads them in place (no gather, no scatter).
  struct StateRun {
    int64_t begin = 0, end = 0;
    float* data = nullptr;
  };
  std::vector<StateRun> state_runs(std::string_view name);

  // Times the step's phases into `times` (null: not timed): "comm: gradient reduce-scatter"
  // (with overlap: the exposed part; the starting and polling during backward is "comm:
  // gradient buckets in backward"), "comm: norm and boundary exchange", "comm: weight
  // all-gather", and the local update as "optimizer" (its time includes the nested
  // communication waits of the step's middle).
  void set_op_times(OpTimes* times) {
    op_times_ = times;
    reducer_->set_op_times(times);
  }

  const Zero1Layout& layout() const { return layout_; }
  int rank() const { return comm_.rank(); }
  int dp() const { return comm_.size(); }
  // The formula (zero1_rank_memory) for this rank, and the bytes of the buffers this object
  // actually holds (everything but the Newton–Schulz scratch, which lives in NewtonSchulz).
  Zero1RankMemory memory() const { return zero1_rank_memory(layout_, comm_.rank()); }
  int64_t allocated_bytes() const;

 private:
  // A run of AdamW elements of the shard: slab offset, length, the offset of its moments in
  // the shard's moment buffers, weight-decay group.
  struct AdamWChunk {
    int64_t offset = 0, size = 0, state_offset = 0;
    bool decay = false;
  };
  // A window of the slab for one reduce-scatter / all-gather call, with every rank's count.
  struct Window {
    SlabRange range;
    std::vector<int64_t> counts;
  };

  // The constructor's steps: every rank's table and options the same (collective), then the
  // collectives' windows, the norm's chunks, the AdamW chunks with their moments, the owned
  // Muon matrices with their momentum.
  void check_same_on_every_rank(const ParamTable& table) const;
  void plan_windows();
  void plan_norm_chunks(const ParamTable& table);
  void plan_adamw_chunks(const ParamTable& table);
  void plan_muon(const ParamTable& table);

  // The phases of step(), in order.
  struct BoundaryExchange {  // the split matrices' pieces in flight
    std::vector<Request> gradient_receives, pending;
  };
  void average_shard_gradient();
  double clip_shard_gradient(double lr, int64_t step, double max_grad_norm);  // the global norm
  BoundaryExchange start_boundary_exchange(float* params);
  void finish_boundary_exchange(float* params, double lr, BoundaryExchange& exchange);
  void all_gather_weights(float* params);
  // The averaged gradient of the shard at slab offset `offset` (inside the shard).
  float* shard_gradient(int64_t offset) { return grad_shard_.data() + (offset - shard_.begin); }

  void adamw_step(float* params, double lr, int64_t step);
  // The Muon update of the whole matrix muon_matrices()[index], which this rank owns: `gu`
  // holds its gradient and is overwritten with the orthogonalized update.
  void muon_matrix(size_t index, float* params, float* gu, double lr);
  void check_state_name(std::string_view name) const;
  // Copies this rank's part of state `name` to/from `range_values` (laid out like the
  // slab over state_range(rank)).
  void export_state(std::string_view name, float* range_values) const;
  void import_state(std::string_view name, const float* range_values);

  Communicator comm_;
  Zero1Layout layout_;
  AdamWOptions adamw_options_;
  std::optional<MuonOptions> muon_options_;
  Zero1Options options_;
  SlabRange shard_;
  std::optional<GradientReducer> reducer_;  // set once the layout is known
  GradientReduceStats last_reduce_;
  std::vector<Window> windows_;
  std::vector<Ranges> released_;  // per rank; empty: every rank stores everything
  // The parts of shard `q` outside rank r's released ranges (`outside`) or inside them.
  Ranges shard_parts(int q, int r, bool outside) const;
  std::vector<SlabChunk> norm_chunks_;  // tensor elements of the shard, for norm and clip
  std::vector<AdamWChunk> adamw_chunks_;
  std::vector<size_t> muon_inside_;       // owned matrices inside the shard
  int64_t owned_split_ = -1;              // the owned split matrix, or -1
  int64_t held_split_ = -1;               // the split matrix held without owning it, or -1
  std::vector<int64_t> momentum_offset_;  // per muon_matrices() index: into momentum_, or -1
  std::vector<bool> muon_decays_;         // per muon_matrices() index
  PageSlab<float> grad_shard_;            // the averaged, clipped gradient of the shard
  PageSlab<float> exp_avg_, exp_avg_sq_;  // AdamW moments of the shard's AdamW elements
  PageSlab<float> momentum_;              // Muon momentum of the owned matrices, whole
  PageSlab<float> exchange_;              // the owned split matrix's gradient, assembled
  NewtonSchulz newton_schulz_;
  OpTimes* op_times_ = nullptr;
};

}  // namespace foundry
