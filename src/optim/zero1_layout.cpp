#include "optim/zero1_layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "base/error.h"
#include "base/format.h"
#include "optim/muon.h"

namespace foundry {

// ---- layout -------------------------------------------------------------------------------

std::vector<SlabTensor> slab_tensors(const ParamTable& table, bool muon_enabled) {
  std::vector<SlabTensor> tensors;
  for (const ParamInfo& p : table.params()) {
    SlabTensor t;
    t.offset = p.offset;
    t.numel = p.numel;
    t.muon = muon_enabled && muon_applies(p) && p.numel > 0;
    t.adamw = !t.muon;
    if (t.muon) {
      t.rows = p.shape[0];
      t.cols = p.shape[1];
    }
    tensors.push_back(t);
  }
  return tensors;
}

Zero1Layout::Zero1Layout(std::vector<SlabTensor> tensors, int64_t slab_elements, int dp)
    : tensors_(std::move(tensors)), slab_elements_(slab_elements), dp_(dp) {
  if (dp < 1) fail(fmt::format("ZeRO-1 needs at least 1 data-parallel rank, got {}", dp));
  if (slab_elements < 0) fail(fmt::format("ZeRO-1: negative slab size {}", slab_elements));
  shard_elements_ = (slab_elements + dp - 1) / dp;
  int64_t previous_end = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const SlabTensor& t = tensors_[i];
    if (t.numel < 0 || t.offset < previous_end || t.offset + t.numel > slab_elements)
      fail(fmt::format("ZeRO-1 layout: tensor {} at [{}, {}) overlaps the previous one or lies "
                       "outside the slab of {} elements",
                       i, t.offset, t.offset + t.numel, slab_elements));
    if (t.muon && t.adamw)
      fail(fmt::format("ZeRO-1 layout: tensor {} is updated by both AdamW and Muon", i));
    if (t.muon && (t.numel == 0 || t.rows * t.cols != t.numel))
      fail(fmt::format("ZeRO-1 layout: Muon tensor {} has shape {}×{} but {} elements", i, t.rows,
                       t.cols, t.numel));
    previous_end = t.offset + t.numel;
    if (t.muon) {
      MuonPlacement m;
      m.tensor = i;
      m.offset = t.offset;
      m.numel = t.numel;
      m.rows = t.rows;
      m.cols = t.cols;
      m.owner = rank_of(t.offset);
      m.last_rank = rank_of(t.offset + t.numel - 1);
      matrices_.push_back(m);
    }
  }
}

Zero1Layout::Zero1Layout(const ParamTable& table, int dp, bool muon_enabled)
    : Zero1Layout(slab_tensors(table, muon_enabled), table.total_elements(), dp) {}

SlabRange Zero1Layout::shard(int rank) const {
  FOUNDRY_CHECK(rank >= 0 && rank < dp_);
  const int64_t begin = std::min(slab_elements_, rank * shard_elements_);
  const int64_t end = std::min(slab_elements_, (rank + 1) * shard_elements_);
  return {begin, end};
}

int Zero1Layout::rank_of(int64_t element) const {
  FOUNDRY_CHECK(element >= 0 && element < slab_elements_);
  return static_cast<int>(element / shard_elements_);
}

std::vector<int64_t> Zero1Layout::shard_counts() const {
  std::vector<int64_t> counts(dp_);
  for (int r = 0; r < dp_; ++r) counts[r] = shard(r).size();
  return counts;
}

std::vector<size_t> Zero1Layout::owned_matrices(int rank) const {
  std::vector<size_t> owned;
  for (size_t i = 0; i < matrices_.size(); ++i)
    if (matrices_[i].owner == rank) owned.push_back(i);
  return owned;
}

int64_t Zero1Layout::owned_split_matrix(int rank) const {
  for (size_t i = 0; i < matrices_.size(); ++i)
    if (matrices_[i].owner == rank && matrices_[i].split()) return static_cast<int64_t>(i);
  return -1;
}

int64_t Zero1Layout::held_split_matrix(int rank) const {
  for (size_t i = 0; i < matrices_.size(); ++i)
    if (matrices_[i].owner < rank && rank <= matrices_[i].last_rank) return static_cast<int64_t>(i);
  return -1;
}

SlabRange Zero1Layout::piece(size_t m, int rank) const {
  const MuonPlacement& p = matrices_.at(m);
  return intersect({p.offset, p.offset + p.numel}, shard(rank));
}

int64_t Zero1Layout::adamw_elements(int rank) const {
  const SlabRange s = shard(rank);
  int64_t n = 0;
  for (const SlabTensor& t : tensors_)
    if (t.adamw) n += intersect({t.offset, t.offset + t.numel}, s).size();
  return n;
}

int64_t Zero1Layout::muon_elements(int rank) const {
  int64_t n = 0;
  for (const MuonPlacement& m : matrices_)
    if (m.owner == rank) n += m.numel;
  return n;
}

SlabRange Zero1Layout::state_range(int rank) const {
  // cut(r): where rank r's range starts: its shard's start, or past the split matrix that
  // crosses it (owned by an earlier rank, which keeps that matrix's state).
  auto cut = [this](int r) {
    if (r >= dp_) return slab_elements_;
    const int64_t held = held_split_matrix(r);
    if (held < 0) return shard(r).begin;
    const MuonPlacement& m = matrices_[held];
    return m.offset + m.numel;
  };
  FOUNDRY_CHECK(rank >= 0 && rank < dp_);
  return {cut(rank), std::max(cut(rank), cut(rank + 1))};
}

// ---- memory -------------------------------------------------------------------------------

Zero1RankMemory zero1_rank_memory(const Zero1Layout& layout, int rank) {
  constexpr int64_t kFloat = sizeof(float);
  Zero1RankMemory mem;
  mem.rank = rank;
  mem.shard_elements = layout.shard(rank).size();
  mem.grad_shard_bytes = kFloat * mem.shard_elements;
  mem.adamw_state_bytes = 2 * kFloat * layout.adamw_elements(rank);
  mem.muon_momentum_bytes = kFloat * layout.muon_elements(rank);
  const int64_t split = layout.owned_split_matrix(rank);
  if (split >= 0) mem.exchange_bytes = kFloat * layout.muon_matrices()[split].numel;
  int64_t largest = 0, largest_gram = 0;
  for (size_t m : layout.owned_matrices(rank)) {
    const MuonPlacement& p = layout.muon_matrices()[m];
    const int64_t r = std::min(p.rows, p.cols);
    largest = std::max(largest, p.numel);
    largest_gram = std::max(largest_gram, r * r);
  }
  mem.newton_schulz_bytes = kFloat * (largest + 2 * largest_gram);
  return mem;
}

double Zero1MemoryReport::ratio_to_gather() const {
  return gather_peak_bytes > 0
             ? static_cast<double>(peak.total_bytes()) / static_cast<double>(gather_peak_bytes)
             : 0.0;
}

double Zero1MemoryReport::gather_buffer_share() const {
  return gather_peak_bytes > 0
             ? static_cast<double>(gather_buffer_bytes) / static_cast<double>(gather_peak_bytes)
             : 0.0;
}

Zero1MemoryReport zero1_memory(const Zero1Layout& layout) {
  Zero1MemoryReport report;
  report.dp = layout.dp();
  report.slab_elements = layout.slab_elements();
  report.shard_elements = layout.shard_elements();
  report.muon_matrices = static_cast<int64_t>(layout.muon_matrices().size());
  for (const MuonPlacement& m : layout.muon_matrices()) report.split_matrices += m.split();
  report.gather_buffer_bytes = int64_t{sizeof(float)} * layout.slab_elements();
  report.replicated_bytes = 2 * int64_t{sizeof(float)} * layout.slab_elements();
  for (int r = 0; r < layout.dp(); ++r) {
    const Zero1RankMemory mem = zero1_rank_memory(layout, r);
    if (r == 0 || mem.total_bytes() > report.peak.total_bytes()) report.peak = mem;
    // Gathering everything replaces the exchange buffer with the full-slab one.
    const int64_t gather = mem.total_bytes() - mem.exchange_bytes + report.gather_buffer_bytes;
    report.gather_peak_bytes = std::max(report.gather_peak_bytes, gather);
  }
  return report;
}

Zero1MemoryReport zero1_memory(const ParamTable& table, int dp, bool muon_enabled) {
  return zero1_memory(Zero1Layout(table, dp, muon_enabled));
}

std::string format_zero1_memory(const Zero1MemoryReport& r) {
  const Zero1RankMemory& p = r.peak;
  std::string out = fmt::format(
      "ZeRO-1 over {} ranks: slab {} elements, shards of {}; {} Muon matrices, {} split across "
      "shard boundaries\n",
      r.dp, format_count(double(r.slab_elements)), format_count(double(r.shard_elements)),
      r.muon_matrices, r.split_matrices);
  out += fmt::format("optimizer memory per rank (largest: rank {}): {}\n", p.rank,
                     format_bytes(static_cast<double>(p.total_bytes())));
  out += fmt::format(
      "  gradient shard {}, AdamW moments {}, Muon momentum {}, split-matrix exchange {}, "
      "Newton-Schulz scratch {}\n",
      format_bytes(static_cast<double>(p.grad_shard_bytes)),
      format_bytes(static_cast<double>(p.adamw_state_bytes)),
      format_bytes(static_cast<double>(p.muon_momentum_bytes)),
      format_bytes(static_cast<double>(p.exchange_bytes)),
      format_bytes(static_cast<double>(p.newton_schulz_bytes)));
  out += fmt::format(
      "Muon gathering the whole slab instead: {} per rank (its full-slab buffer {} is {:.1f}% of "
      "that); boundary exchange needs {:.3f}x of it\n",
      format_bytes(static_cast<double>(r.gather_peak_bytes)),
      format_bytes(static_cast<double>(r.gather_buffer_bytes)), 100.0 * r.gather_buffer_share(),
      r.ratio_to_gather());
  out += fmt::format("replicated on every rank: fp32 parameters + gradients {}\n",
                     format_bytes(static_cast<double>(r.replicated_bytes)));
  return out;
}

// ---- expert storage -----------------------------------------------------------------------

SlabRange zero1_kept_range(const Zero1Layout& layout, int rank) {
  const SlabRange shard = layout.shard(rank), state = layout.state_range(rank);
  if (state.size() == 0) return {shard.begin, shard.end};
  return {std::min(shard.begin, state.begin), std::max(shard.end, state.end)};
}

std::vector<SlabRanges> zero1_released_ranges(const Zero1Layout& layout,
                                              const std::vector<SlabRanges>& unowned_by_rank) {
  std::vector<SlabRanges> released(layout.dp());
  for (int r = 0; r < layout.dp(); ++r) {
    const auto [kb, ke] = zero1_kept_range(layout, r);
    for (auto [b, e] : unowned_by_rank.at(r)) {
      if (kb < e && ke > b) {  // the kept range cuts it
        if (kb > b) released[r].push_back({b, kb});
        b = std::max(b, ke);
      }
      if (b < e) released[r].push_back({b, e});
    }
  }
  return released;
}

ExpertStorageReport expert_storage(const ParamTable& table, const Zero1Layout& layout,
                                   const ExpertSharding& sharding) {
  auto total = [](const SlabRanges& ranges) {
    int64_t n = 0;
    for (const auto& [b, e] : ranges) n += e - b;
    return n;
  };
  ExpertStorageReport r;
  r.ep = sharding.ep_size();
  r.slab_elements = table.total_elements();
  const auto unowned = unowned_expert_ranges_by_rank(table, sharding, layout.dp());
  const auto released = zero1_released_ranges(layout, unowned);
  r.weight_elements = -1;
  for (int q = 0; q < layout.dp(); ++q) {
    const int64_t weights = r.slab_elements - total(released[q]);
    if (weights > r.weight_elements) {
      r.rank = q;
      r.weight_elements = weights;
      r.gradient_elements = r.slab_elements - total(unowned[q]);
    }
  }
  return r;
}

std::string format_expert_storage(const ExpertStorageReport& r, bool bf16) {
  const double E = static_cast<double>(r.slab_elements);
  const double w = static_cast<double>(r.weight_elements);
  const double g = static_cast<double>(r.gradient_elements);
  std::string out = fmt::format(
      "expert parallel {} (each rank stores its own experts; largest: rank {}):\n"
      "  fp32 weights {} of {} ({:.1f}%), fp32 gradients {} ({:.1f}%)",
      r.ep, r.rank, format_bytes(4 * w), format_bytes(4 * E), 100 * w / E, format_bytes(4 * g),
      100 * g / E);
  if (bf16) out += fmt::format(", bf16 copies {}", format_bytes(2 * g));
  return out + "\n";
}

}  // namespace foundry
