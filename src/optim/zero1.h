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

#include "base/timer.h"
#include "comm/comm.h"
#include "model/expert_parallel.h"
#include "model/params.h"
#include "optim/adamw.h"
#include "optim/grad_reduce.h"
#include "optim/muon.h"

namespace foundry {

// ---- the layout (pure arithmetic, no MPI) ------------------------------------------------

// A tensor as the ZeRO-1 layout sees it: where it lies and which optimizer updates it.
struct SlabTensor {
  int64_t offset = 0;          // elements into the slab
  int64_t numel = 0;
  int64_t rows = 0, cols = 0;  // the matrix shape (Muon tensors)
  bool muon = false;           // updated by Muon: needs the whole matrix
  bool adamw = false;          // updated by AdamW: elementwise, shards cut it anywhere
};

// The tensors of `table` with the optimizer assignment of a run: with Muon, Muon updates the
// tensors muon_applies() selects and AdamW the rest; without, AdamW updates everything.
std::vector<SlabTensor> slab_tensors(const ParamTable& table, bool muon_enabled);

struct SlabRange {
  int64_t begin = 0, end = 0;  // [begin, end) in slab elements
  int64_t size() const { return end - begin; }
  bool operator==(const SlabRange&) const = default;
};

// A Muon matrix and the ranks whose shards hold it.
struct MuonPlacement {
  size_t tensor = 0;     // index into the layout's tensors
  int64_t offset = 0, numel = 0, rows = 0, cols = 0;
  int owner = 0;         // the rank holding its first element: keeps its momentum, updates it
  int last_rank = 0;     // the rank holding its last element
  bool split() const { return last_rank > owner; }
};

// Where the shards cut the slab. At most one Muon matrix crosses each shard boundary (the
// tensors are disjoint and in slab order), so a rank owns at most one split matrix (the one
// crossing its end) and holds a piece of at most one split matrix it does not own (the one
// crossing its start); one matrix may span many shards, and a shard may lie entirely inside
// a matrix (holding no matrix start).
class Zero1Layout {
 public:
  // `tensors` in slab order, disjoint, inside [0, slab_elements); dp >= 1. Fails on a tensor
  // that both optimizers would update, or one out of range.
  Zero1Layout(std::vector<SlabTensor> tensors, int64_t slab_elements, int dp);
  Zero1Layout(const ParamTable& table, int dp, bool muon_enabled);

  int dp() const { return dp_; }
  int64_t slab_elements() const { return slab_elements_; }  // E
  int64_t shard_elements() const { return shard_elements_; }  // B = ceil(E / dp)
  bool muon_enabled() const { return !matrices_.empty(); }
  const std::vector<SlabTensor>& tensors() const { return tensors_; }
  const std::vector<MuonPlacement>& muon_matrices() const { return matrices_; }

  SlabRange shard(int rank) const;   // [min(r·B, E), min((r+1)·B, E))
  int rank_of(int64_t element) const;  // the rank whose shard holds the element
  // Element counts of every rank's shard, in rank order (the v-collectives' counts).
  std::vector<int64_t> shard_counts() const;

  // Indices into muon_matrices() of the matrices `rank` owns, in slab order: those inside
  // its shard, then at most one split one.
  std::vector<size_t> owned_matrices(int rank) const;
  // The split matrix `rank` owns, or -1; the split matrix it holds a piece of without
  // owning it, or -1 (indices into muon_matrices()).
  int64_t owned_split_matrix(int rank) const;
  int64_t held_split_matrix(int rank) const;
  // The part of matrix `m` that lies in `rank`'s shard (empty if none).
  SlabRange piece(size_t m, int rank) const;

  // Elements of AdamW tensors in the shard: AdamW keeps two moments for each.
  int64_t adamw_elements(int rank) const;
  // Elements of the Muon matrices the rank owns: Muon keeps one momentum for each.
  int64_t muon_elements(int rank) const;

  // The slab range whose optimizer state `rank` keeps: its shard, with the start moved past
  // a split matrix owned by an earlier rank and the end moved to the end of the split matrix
  // it owns. The ranges partition [0, E) in rank order (some may be empty); checkpoints
  // gather and scatter the state slabs along them.
  SlabRange state_range(int rank) const;

 private:
  std::vector<SlabTensor> tensors_;
  std::vector<MuonPlacement> matrices_;
  int64_t slab_elements_ = 0;
  int64_t shard_elements_ = 0;
  int dp_ = 1;
};

// Expert storage under expert parallelism (Model::shard_expert_storage): what each rank of
// the ZeRO-1 layout keeps besides the dense tensors and its own experts (its shard, extended
// over the split Muon matrix it owns, whose whole parameters it updates), and, from every
// rank's unowned expert ranges (unowned_expert_ranges_by_rank), the ranges it releases.
using SlabRanges = std::vector<std::pair<int64_t, int64_t>>;
std::pair<int64_t, int64_t> zero1_kept_range(const Zero1Layout& layout, int rank);
std::vector<SlabRanges> zero1_released_ranges(const Zero1Layout& layout,
                                              const std::vector<SlabRanges>& unowned_by_rank);

// What a rank stores of the fp32 weight and gradient slabs (elements) with expert storage
// sharded over EP groups of `sharding.ep_size()` ranks, for `foundry model info --dp N
// --ep P`: the rank storing the most, against the whole slab.
struct ExpertStorageReport {
  int ep = 1;
  int rank = 0;                  // the rank storing the most weights
  int64_t slab_elements = 0;     // the whole slab (what every rank stores without EP)
  int64_t weight_elements = 0;   // its stored fp32 weights (the bf16 copies: gradient_elements)
  int64_t gradient_elements = 0; // its stored fp32 gradients (its experts and the dense tensors)
};
ExpertStorageReport expert_storage(const ParamTable& table, const Zero1Layout& layout,
                                   const ExpertSharding& sharding);
// Two lines for a report (with the bf16 copies when `bf16`).
std::string format_expert_storage(const ExpertStorageReport& report, bool bf16);

// ---- memory per rank (pure arithmetic, no MPI) --------------------------------------------

// Optimizer memory of one rank in bytes, besides the replicated fp32 parameter and
// gradient slabs (4·E bytes each) that data parallelism keeps on every rank anyway.
struct Zero1RankMemory {
  int rank = 0;
  int64_t shard_elements = 0;
  int64_t grad_shard_bytes = 0;     // the reduce-scattered gradient shard: 4·shard
  int64_t adamw_state_bytes = 0;    // exp_avg + exp_avg_sq: 8·(AdamW elements of the shard)
  int64_t muon_momentum_bytes = 0;  // 4·(elements of the matrices the rank owns)
  int64_t exchange_bytes = 0;       // 4·numel of the owned split matrix (assembly buffer)
  // Newton–Schulz scratch for the largest owned matrix (fp32): an iterate of numel floats
  // and two r×r Gram matrices, r = min(rows, cols). bf16 Newton–Schulz adds 2·(numel + 2r²).
  int64_t newton_schulz_bytes = 0;
  int64_t total_bytes() const {
    return grad_shard_bytes + adamw_state_bytes + muon_momentum_bytes + exchange_bytes +
           newton_schulz_bytes;
  }
};

Zero1RankMemory zero1_rank_memory(const Zero1Layout& layout, int rank);

// The per-rank peak of ZeRO-1 with boundary exchange, next to the gather-everything
// alternative: a distributed Muon that all-gathers the whole reduced gradient slab so every
// rank sees whole matrices needs a full-slab buffer of 4·E bytes on every rank (it holds the
// gradients of all Muon matrices, then their updated parameters) in place of the exchange
// buffer; everything else is the same.
struct Zero1MemoryReport {
  int dp = 1;
  int64_t slab_elements = 0;
  int64_t shard_elements = 0;
  int64_t muon_matrices = 0;
  int64_t split_matrices = 0;
  Zero1RankMemory peak;              // the rank with the largest total (the lowest such rank)
  int64_t gather_buffer_bytes = 0;   // 4·E
  int64_t gather_peak_bytes = 0;     // max over ranks of total - exchange + gather buffer
  int64_t replicated_bytes = 0;      // 8·E: fp32 parameters + gradients, on every rank
  // peak.total_bytes() / gather_peak_bytes, and the share of the gather-everything peak
  // taken by its full-slab buffer.
  double ratio_to_gather() const;
  double gather_buffer_share() const;
};

Zero1MemoryReport zero1_memory(const Zero1Layout& layout);
// From the table alone, for `foundry model info --dp N` (nothing is allocated).
Zero1MemoryReport zero1_memory(const ParamTable& table, int dp, bool muon_enabled);
// A few lines for a report: per-rank components and the comparison, sizes in MiB/GiB.
std::string format_zero1_memory(const Zero1MemoryReport& report);

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
  // not finite nothing is updated on any rank (parameters and state stay as they were) and
  // the caller decides (the trainer stops). lr, step and max_grad_norm must be the same on
  // every rank (checked). `step` is 1-based, as in AdamW::step.
  double step(float* params, const float* grads, double lr, int64_t step, double max_grad_norm);

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
  void set_zero_gradient_ranges(std::vector<Ranges> zero) { reducer_->set_zero_ranges(std::move(zero)); }
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
  std::vector<SlabChunk> norm_chunks_;    // tensor elements of the shard, for norm and clip
  std::vector<AdamWChunk> adamw_chunks_;
  std::vector<size_t> muon_inside_;       // owned matrices inside the shard
  int64_t owned_split_ = -1;              // the owned split matrix, or -1
  int64_t held_split_ = -1;               // the split matrix held without owning it, or -1
  std::vector<int64_t> momentum_offset_;  // per muon_matrices() index: into momentum_, or -1
  std::vector<bool> muon_decays_;         // per muon_matrices() index
  std::vector<float> grad_shard_;         // the averaged, clipped gradient of the shard
  std::vector<float> exp_avg_, exp_avg_sq_;  // AdamW moments of the shard's AdamW elements
  std::vector<float> momentum_;           // Muon momentum of the owned matrices, whole
  std::vector<float> exchange_;           // the owned split matrix's gradient, assembled
  NewtonSchulz newton_schulz_;
  OpTimes* op_times_ = nullptr;
};

}  // namespace foundry
