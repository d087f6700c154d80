// ZeRO-1's layout and memory model: how the slab is cut into shards, which rank owns each
// Muon matrix, which expert ranges a rank stores under expert parallelism, and the memory
// per rank. Pure arithmetic, no MPI: `foundry model info --dp N` and the planner use it
// without starting any process. The optimizer itself is in optim/zero1.h.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/slab_range.h"
#include "model/expert_parallel.h"
#include "model/params.h"

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
SlabRange zero1_kept_range(const Zero1Layout& layout, int rank);
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

}  // namespace foundry
