#include "optim/zero1.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <utility>

#include "base/error.h"
#include "optim/clip.h"
#include "optim/slab_chunks.h"

namespace foundry {

namespace {

// Message tags on the optimizer's own communicator. Between two ranks there is at most one
// message of each kind per step (a rank owns at most one split matrix and holds a piece of
// at most one other), so a tag per kind is enough to match them.
constexpr int kTagGradientPiece = 1;  // holder → owner: the clipped gradient of its piece
constexpr int kTagUpdatedPiece = 2;   // owner → holder: the updated parameters of the piece
constexpr int kTagStateGather = 3;    // rank r → rank 0: state for a checkpoint
constexpr int kTagStateLoad = 4;      // rank 0 → rank r: state from a checkpoint
constexpr int kTagSparseGather = 5;   // shard owner → rank r: the parameters r stores
constexpr int kTagReleasedGather = 6; // shard owner → root: root's released parameters

// As in optim/muon.cpp: elementwise loops below this size run on one thread.
constexpr int64_t kParallelElements = 1 << 15;

SlabRange intersect(SlabRange a, SlabRange b) {
  const int64_t begin = std::max(a.begin, b.begin);
  const int64_t end = std::min(a.end, b.end);
  return begin < end ? SlabRange{begin, end} : SlabRange{begin, begin};
}

// The weight-decay group of AdamW::decays.
bool adamw_decays(const ParamInfo& info, const AdamWOptions& o) {
  if (info.kind == ParamKind::embedding) return o.decay_embeddings;
  return info.weight_decay;
}

// A 64-bit fingerprint for comparing tables and options across ranks.
struct Fingerprint {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  void add(uint64_t x) {
    h ^= x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
  }
  void add(double x) { add(std::bit_cast<uint64_t>(x)); }
  void add(int64_t x) { add(static_cast<uint64_t>(x)); }
  void add(bool x) { add(uint64_t{x}); }
};

void append(std::vector<Request>& to, std::vector<Request> more) {
  for (Request& r : more) to.push_back(std::move(r));
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}

std::string format_elements(int64_t n) {
  const double x = static_cast<double>(n);
  if (x >= 1e9) return fmt::format("{:.2f}G", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.2f}M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.1f}k", x / 1e3);
  return fmt::format("{}", n);
}

}  // namespace

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
      r.dp, format_elements(r.slab_elements), format_elements(r.shard_elements), r.muon_matrices,
      r.split_matrices);
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

// ---- the optimizer ------------------------------------------------------------------------

namespace {

std::vector<SlabTensor> optimizer_tensors(const ParamTable& table, const AdamWOptions& adamw,
                                          bool muon_enabled) {
  std::vector<SlabTensor> tensors;
  for (const ParamInfo& p : table.params()) {
    SlabTensor t;
    t.offset = p.offset;
    t.numel = p.numel;
    t.muon = muon_enabled && muon_applies(p) && p.numel > 0;
    t.adamw = (!adamw.applies || adamw.applies(p)) && p.numel > 0;
    if (t.muon && t.adamw)
      fail(fmt::format("ZeRO-1: tensor '{}' would be updated by both AdamW and Muon", p.name),
           "set AdamWOptions::applies to exclude the Muon tensors (!muon_applies)");
    if (t.muon) {
      t.rows = p.shape[0];
      t.cols = p.shape[1];
    }
    tensors.push_back(t);
  }
  return tensors;
}

void validate_options(const AdamWOptions& a, const std::optional<MuonOptions>& m) {
  if (!(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1))
    fail(fmt::format("AdamW betas ({}, {}) must lie in [0, 1)", a.beta1, a.beta2),
         "set train.beta1 and train.beta2 below 1");
  if (!(a.eps >= 0) || !(a.weight_decay >= 0))
    fail(fmt::format("AdamW eps = {} and weight_decay = {} must be non-negative", a.eps,
                     a.weight_decay));
  if (!m) return;
  if (!(m->momentum >= 0 && m->momentum < 1))
    fail(fmt::format("Muon momentum {} must lie in [0, 1)", m->momentum),
         "0.95 is the usual value");
  if (m->ns_steps < 1 || m->ns_steps > 100)
    fail(fmt::format("Muon ns_steps = {} must lie in [1, 100]", m->ns_steps),
         "5 Newton–Schulz steps is the usual choice");
  if (!(m->weight_decay >= 0) || !std::isfinite(m->weight_decay))
    fail(fmt::format("Muon weight_decay = {} must be finite and non-negative", m->weight_decay));
  if (!(m->rms_scale > 0) || !std::isfinite(m->rms_scale))
    fail(fmt::format("Muon rms_scale = {} must be finite and positive", m->rms_scale),
         "0.2 matches the RMS of a typical AdamW update");
}

}  // namespace

Zero1Optimizer::Zero1Optimizer(const ParamTable& table, const AdamWOptions& adamw,
                               const std::optional<MuonOptions>& muon, const Communicator& dp,
                               const Zero1Options& options)
    : comm_(dp.dup()),
      layout_(std::vector<SlabTensor>{}, 0, 1),
      adamw_options_(adamw),
      muon_options_(muon),
      options_(options) {
  const int rank = comm_.rank(), size = comm_.size();

  // Every rank must build the same layout with the same options: compare fingerprints
  // before anything that could fail on one rank only.
  Fingerprint table_print, options_print;
  table_print.add(table.total_elements());
  for (const ParamInfo& p : table.params()) {
    table_print.add(p.offset);
    table_print.add(p.numel);
    table_print.add(muon.has_value() && muon_applies(p));
    table_print.add(!adamw.applies || adamw.applies(p));
    table_print.add(adamw_decays(p, adamw));
  }
  for (double x : {adamw.beta1, adamw.beta2, adamw.eps, adamw.weight_decay}) options_print.add(x);
  options_print.add(muon.has_value());
  if (muon) {
    for (double x : {muon->momentum, muon->weight_decay, muon->rms_scale}) options_print.add(x);
    options_print.add(muon->nesterov);
    options_print.add(int64_t{muon->ns_steps});
    options_print.add(muon->bf16_newton_schulz);
  }
  options_print.add(options.bucket_elements);  // the buckets decide the collectives' order
  const int64_t mine[4] = {table.total_elements(), static_cast<int64_t>(table_print.h),
                           static_cast<int64_t>(options_print.h), options.max_message_elements};
  std::vector<int64_t> all(4 * static_cast<size_t>(size));
  comm_.allgather(mine, all.data(), 4);
  for (int r = 1; r < size; ++r) {
    const int64_t* theirs = all.data() + 4 * r;
    if (theirs[0] != all[0] || theirs[1] != all[1])
      fail(fmt::format("ZeRO-1 on rank {} of {}: rank {} has a different parameter table than "
                       "rank 0 ({} vs {} slab elements, or other offsets or optimizer groups)",
                       rank, size, r, theirs[0], all[0]),
           "every data-parallel rank must build the same model config");
    if (theirs[2] != all[2] || theirs[3] != all[3])
      fail(fmt::format("ZeRO-1 on rank {} of {}: rank {} has different optimizer options than "
                       "rank 0",
                       rank, size, r),
           "every data-parallel rank must use the same train config");
  }

  validate_options(adamw, muon);
  if (options.max_message_elements < 1 || options.max_message_elements > INT32_MAX)
    fail(fmt::format("ZeRO-1 max_message_elements = {} must lie in [1, 2^31 - 1]",
                     options.max_message_elements));
  layout_ = Zero1Layout(optimizer_tensors(table, adamw, muon.has_value()),
                        table.total_elements(), size);
  shard_ = layout_.shard(rank);
  reducer_.emplace(comm_, layout_.slab_elements(), layout_.shard_counts(),
                   GradientReducerOptions{options.bucket_elements, options.max_message_elements});

  // Windows for the reduce-scatter and the all-gather.
  const int64_t E = layout_.slab_elements(), W = options.max_message_elements;
  for (int64_t begin = 0; begin < E; begin += W) {
    Window w;
    w.range = {begin, std::min(E, begin + W)};
    for (int r = 0; r < size; ++r) w.counts.push_back(intersect(w.range, layout_.shard(r)).size());
    windows_.push_back(std::move(w));
  }

  // Norm chunks: optim/clip.h's chunks, cut at the shard's ends. On one rank they are
  // exactly clip's, so the norm is too.
  for (const SlabChunk& c : slab_chunks(table, nullptr)) {
    const SlabRange part = intersect({c.offset, c.offset + c.size}, shard_);
    if (part.size() > 0) norm_chunks_.push_back({part.begin, part.size(), false});
  }

  // AdamW: the shard's part of every AdamW tensor, in slab order, with its moments packed.
  int64_t state = 0;
  for (size_t i = 0; i < table.params().size(); ++i) {
    const ParamInfo& p = table.params()[i];
    if (!layout_.tensors()[i].adamw) continue;
    const SlabRange part = intersect({p.offset, p.offset + p.numel}, shard_);
    const bool decay = adamw_decays(p, adamw);
    for (int64_t at = part.begin; at < part.end; at += kSlabChunkElements) {
      const int64_t n = std::min(kSlabChunkElements, part.end - at);
      adamw_chunks_.push_back({at, n, state, decay});
      state += n;
    }
  }
  exp_avg_.assign(state, 0.0f);
  exp_avg_sq_.assign(state, 0.0f);

  // Muon: the matrices this rank owns, their momentum packed whole.
  const std::vector<MuonPlacement>& matrices = layout_.muon_matrices();
  momentum_offset_.assign(matrices.size(), -1);
  muon_decays_.assign(matrices.size(), false);
  int64_t momentum = 0;
  for (size_t m : layout_.owned_matrices(rank)) {
    momentum_offset_[m] = momentum;
    momentum += matrices[m].numel;
    muon_decays_[m] = table.params()[matrices[m].tensor].weight_decay;
    if (!matrices[m].split()) muon_inside_.push_back(m);
  }
  momentum_.assign(momentum, 0.0f);
  owned_split_ = layout_.owned_split_matrix(rank);
  held_split_ = layout_.held_split_matrix(rank);
  if (owned_split_ >= 0) exchange_.assign(matrices[owned_split_].numel, 0.0f);
  grad_shard_.assign(shard_.size(), 0.0f);
}

int64_t Zero1Optimizer::allocated_bytes() const {
  const size_t floats = grad_shard_.size() + exp_avg_.size() + exp_avg_sq_.size() +
                        momentum_.size() + exchange_.size();
  return static_cast<int64_t>(sizeof(float) * floats);
}

void Zero1Optimizer::adamw_step(float* params, double lr, int64_t step) {
  const AdamWScalars s = adamw_scalars(adamw_options_, lr, step);  // AdamW's own arithmetic

  const int64_t n_chunks = static_cast<int64_t>(adamw_chunks_.size());
  const float* g = grad_shard_.data();
  const int64_t shard_begin = shard_.begin;
  float* m = exp_avg_.data();
  float* v = exp_avg_sq_.data();
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n_chunks; ++c) {
    const AdamWChunk& chunk = adamw_chunks_[c];
    adamw_chunk(params + chunk.offset, g + (chunk.offset - shard_begin), m + chunk.state_offset,
                v + chunk.state_offset, chunk.size, s, chunk.decay);
  }
}

void Zero1Optimizer::muon_matrix(size_t index, float* params, float* gu, double lr) {
  // The arithmetic of Muon::step (optim/muon.h), with the update computed in place of the
  // gradient: each element's gradient is read before its update is written.
  const MuonOptions& o = *muon_options_;
  const MuonPlacement& m = layout_.muon_matrices()[index];
  float* __restrict buf = momentum_.data() + momentum_offset_[index];
  const float mu = static_cast<float>(o.momentum);
  const bool nesterov = o.nesterov;
  const int64_t n = m.numel;
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gu[i];
    const float b = mu * buf[i] + g;
    buf[i] = b;
    gu[i] = nesterov ? g + mu * b : b;
  }

  newton_schulz_.run(gu, gu, m.rows, m.cols, o.ns_steps, o.bf16_newton_schulz);

  const float keep = muon_decays_[index] ? static_cast<float>(1.0 - lr * o.weight_decay) : 1.0f;
  const float step_size = static_cast<float>(
      lr * o.rms_scale * std::sqrt(static_cast<double>(std::max(m.rows, m.cols))));
  float* __restrict w = params + m.offset;
  const float* __restrict u = gu;
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) w[i] = w[i] * keep - step_size * u[i];
}

void Zero1Optimizer::begin_backward(const float* grads) {
  reducer_->begin(const_cast<float*>(grads), grad_shard_.data());  // read only
}

double Zero1Optimizer::step(float* params, const float* grads, double lr, int64_t step,
                            double max_grad_norm) {
  const int rank = comm_.rank(), size = comm_.size();
  if (!params || !grads)
    fail(fmt::format("ZeRO-1 step on rank {} of {}: null parameter or gradient slab", rank,
                     size));

  // 1. The averaged gradient of this rank's shard.
  // The shard's gradient, addressed by slab offset (only offsets inside the shard).
  auto grad_at = [this](int64_t offset) { return grad_shard_.data() + (offset - shard_.begin); };
  // Reduce-scatter only reads the gradient slab.
  last_reduce_ = reducer_->finish(const_cast<float*>(grads), grad_shard_.data());
  ScopedOpTimer local_work(op_times_, "optimizer");
  const int64_t n_chunks = static_cast<int64_t>(norm_chunks_.size());
  if (size > 1) {
    const float inv_dp = static_cast<float>(1.0 / size);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n_chunks; ++c)
      scale_in_place(grad_at(norm_chunks_[c].offset), norm_chunks_[c].size, inv_dp);
  }

  // 2. The global norm: the shard's sum over fixed chunks in chunk order, then the shards'
  // sums in rank order on every rank (so every rank computes the same bits). The step's
  // arguments travel along, to check that every rank passed the same ones.
  std::vector<double> partial(n_chunks);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n_chunks; ++c)
    partial[c] = sum_of_squares(grad_at(norm_chunks_[c].offset), norm_chunks_[c].size);
  double shard_sum = 0;
  for (double s : partial) shard_sum += s;
  const double mine[4] = {shard_sum, lr, static_cast<double>(step), max_grad_norm};
  std::vector<double> all(4 * static_cast<size_t>(size));
  {
    ScopedOpTimer t(op_times_, "comm: norm and boundary exchange");
    comm_.allgather(mine, all.data(), 4);
  }
  double total = 0;
  for (int r = 0; r < size; ++r) {
    const double* theirs = all.data() + 4 * r;
    for (int k = 1; k < 4; ++k)
      if (std::bit_cast<uint64_t>(theirs[k]) != std::bit_cast<uint64_t>(all[k]))
        fail(fmt::format("ZeRO-1 step on rank {} of {}: rank {} passed lr {}, step {}, max grad "
                         "norm {}; rank 0 passed {}, {}, {}",
                         rank, size, r, theirs[1], theirs[2], theirs[3], all[1], all[2], all[3]),
             "every data-parallel rank must call step() with the same arguments");
    total += theirs[0];
  }
  if (step < 1) fail(fmt::format("ZeRO-1 step number {} must be >= 1 (steps are 1-based)", step));
  if (!(max_grad_norm >= 0))
    fail(fmt::format("gradient clip norm {} must be >= 0", max_grad_norm),
         "set train.grad_clip to 0 (off) or a positive norm");
  const double norm = std::sqrt(total);
  if (!std::isfinite(norm)) return norm;  // every rank sees the same norm: all skip
  if (max_grad_norm > 0 && norm > max_grad_norm) {
    const float factor = static_cast<float>(max_grad_norm / norm);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n_chunks; ++c)
      scale_in_place(grad_at(norm_chunks_[c].offset), norm_chunks_[c].size, factor);
  }

  // 3. Start the boundary exchange. Receives are posted before any send, and each rank
  // sends gradient pieces only to lower ranks (owners) and updated pieces only to higher
  // ranks (holders), so no wait can be part of a cycle (docs/zero1.md).
  const std::vector<MuonPlacement>& matrices = layout_.muon_matrices();
  std::vector<Request> gradient_receives, pending;
  if (owned_split_ >= 0) {
    const MuonPlacement& m = matrices[owned_split_];
    for (int h = m.owner + 1; h <= m.last_rank; ++h) {
      const SlabRange p = layout_.piece(owned_split_, h);
      if (p.size() == 0) continue;
      gradient_receives.push_back(
          comm_.irecv(exchange_.data() + (p.begin - m.offset), p.size(), h, kTagGradientPiece));
    }
  }
  if (held_split_ >= 0) {
    const MuonPlacement& m = matrices[held_split_];
    const SlabRange p = layout_.piece(held_split_, rank);
    pending.push_back(comm_.irecv(params + p.begin, p.size(), m.owner, kTagUpdatedPiece));
    pending.push_back(comm_.isend(grad_at(p.begin), p.size(), m.owner, kTagGradientPiece));
  }

  // 4. Local work while the pieces travel: AdamW on the shard, Muon on the matrices inside.
  adamw_step(params, lr, step);
  if (muon_options_)
    for (size_t m : muon_inside_) muon_matrix(m, params, grad_at(matrices[m].offset), lr);

  // 5. The owned split matrix: assemble, update, send the pieces back.
  if (owned_split_ >= 0) {
    const MuonPlacement& m = matrices[owned_split_];
    std::memcpy(exchange_.data(), grad_at(m.offset), sizeof(float) * (shard_.end - m.offset));
    {
      ScopedOpTimer t(op_times_, "comm: norm and boundary exchange");
      for (Request& r : gradient_receives) r.wait();
    }
    muon_matrix(owned_split_, params, exchange_.data(), lr);
    for (int h = m.owner + 1; h <= m.last_rank; ++h) {
      const SlabRange p = layout_.piece(owned_split_, h);
      if (p.size() == 0) continue;
      pending.push_back(comm_.isend(params + p.begin, p.size(), h, kTagUpdatedPiece));
    }
  }
  {
    ScopedOpTimer t(op_times_, "comm: norm and boundary exchange");
    for (Request& r : pending) r.wait();
  }

  // 6. Every rank gets every shard of the updated slab (or the parts it stores).
  ScopedOpTimer t(op_times_, "comm: weight all-gather");
  if (released_.empty()) {
    for (const Window& w : windows_) comm_.allgatherv_in_place(params + w.range.begin, w.counts);
    return norm;
  }
  std::vector<Request> requests;
  for (int q = 0; q < size; ++q)
    if (q != rank)
      append(requests, comm_.irecv_ranges(params, shard_parts(q, rank, true), q,
                                            kTagSparseGather));
  for (int r = 0; r < size; ++r)
    if (r != rank)
      append(requests, comm_.isend_ranges<float>(params, shard_parts(rank, r, true),
                                                   r, kTagSparseGather));
  for (Request& q : requests) q.wait();
  return norm;
}

void Zero1Optimizer::set_released_ranges(std::vector<Ranges> released) {
  const int rank = comm_.rank(), size = comm_.size();
  if (!released.empty() && static_cast<int>(released.size()) != size)
    fail(fmt::format("ZeRO-1 on rank {}: released ranges for {} ranks, expected {}", rank,
                     released.size(), size));
  for (int r = 0; r < static_cast<int>(released.size()); ++r) {
    const SlabRange s = layout_.shard(r);
    int64_t last = 0;
    for (const auto& [b, e] : released[r]) {
      if (b < last || e < b || e > layout_.slab_elements())
        fail(fmt::format("ZeRO-1: rank {}'s released ranges are not sorted, disjoint slab "
                         "ranges",
                         r));
      if (b < s.end && e > s.begin)
        fail(fmt::format("ZeRO-1: rank {} releases [{}, {}), which overlaps its shard [{}, {})",
                         r, b, e, s.begin, s.end),
             "a rank must store the shard it updates");
      last = e;
    }
  }
  bool any = false;
  for (const Ranges& r : released) any = any || !r.empty();
  released_ = any ? std::move(released) : std::vector<Ranges>{};
}

Zero1Optimizer::Ranges Zero1Optimizer::shard_parts(int q, int r, bool outside) const {
  const SlabRange s = layout_.shard(q);
  Ranges parts;
  int64_t at = s.begin;
  for (const auto& [b, e] : released_[r]) {
    const int64_t lo = std::max(b, s.begin), hi = std::min(e, s.end);
    if (hi <= lo) continue;
    if (outside && lo > at) parts.push_back({at, lo});
    if (!outside) parts.push_back({lo, hi});
    at = hi;
  }
  if (outside && at < s.end) parts.push_back({at, s.end});
  return parts;
}

void Zero1Optimizer::gather_released(float* params, int root) {
  if (released_.empty()) return;
  const int rank = comm_.rank(), size = comm_.size();
  std::vector<Request> requests;
  if (rank == root) {
    for (int q = 0; q < size; ++q)
      if (q != root)
        append(requests, comm_.irecv_ranges(params, shard_parts(q, root, false), q,
                                              kTagReleasedGather));
  } else {
    append(requests, comm_.isend_ranges<float>(params, shard_parts(rank, root, false),
                                                 root, kTagReleasedGather));
  }
  for (Request& q : requests) q.wait();
}

// ---- expert storage -----------------------------------------------------------------------

std::pair<int64_t, int64_t> zero1_kept_range(const Zero1Layout& layout, int rank) {
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

// ---- checkpoint state ---------------------------------------------------------------------

std::vector<std::string> Zero1Optimizer::state_names() const {
  std::vector<std::string> names = AdamW::state_names();
  if (muon_options_)
    for (const std::string& n : Muon::state_names()) names.push_back(n);
  return names;
}

void Zero1Optimizer::check_state_name(std::string_view name) const {
  for (const std::string& n : state_names())
    if (n == name) return;
  fail(fmt::format("ZeRO-1 on rank {} of {}: no optimizer state named '{}'", comm_.rank(),
                   comm_.size(), name),
       fmt::format("the states are {}", fmt::join(state_names(), ", ")));
}

void Zero1Optimizer::export_state(std::string_view name, float* range_values) const {
  const SlabRange range = layout_.state_range(comm_.rank());
  if (name == "exp_avg" || name == "exp_avg_sq") {
    const std::vector<float>& moment = name == "exp_avg" ? exp_avg_ : exp_avg_sq_;
    for (const AdamWChunk& c : adamw_chunks_) {
      FOUNDRY_CHECK(c.offset >= range.begin && c.offset + c.size <= range.end);
      std::memcpy(range_values + (c.offset - range.begin), moment.data() + c.state_offset,
                  sizeof(float) * c.size);
    }
    return;
  }
  const std::vector<MuonPlacement>& matrices = layout_.muon_matrices();
  for (size_t m = 0; m < matrices.size(); ++m) {
    if (momentum_offset_[m] < 0) continue;
    FOUNDRY_CHECK(matrices[m].offset >= range.begin &&
                  matrices[m].offset + matrices[m].numel <= range.end);
    std::memcpy(range_values + (matrices[m].offset - range.begin),
                momentum_.data() + momentum_offset_[m], sizeof(float) * matrices[m].numel);
  }
}

void Zero1Optimizer::import_state(std::string_view name, const float* range_values) {
  const SlabRange range = layout_.state_range(comm_.rank());
  if (name == "exp_avg" || name == "exp_avg_sq") {
    std::vector<float>& moment = name == "exp_avg" ? exp_avg_ : exp_avg_sq_;
    for (const AdamWChunk& c : adamw_chunks_)
      std::memcpy(moment.data() + c.state_offset, range_values + (c.offset - range.begin),
                  sizeof(float) * c.size);
    return;
  }
  const std::vector<MuonPlacement>& matrices = layout_.muon_matrices();
  for (size_t m = 0; m < matrices.size(); ++m) {
    if (momentum_offset_[m] < 0) continue;
    std::memcpy(momentum_.data() + momentum_offset_[m],
                range_values + (matrices[m].offset - range.begin),
                sizeof(float) * matrices[m].numel);
  }
}

std::vector<float> Zero1Optimizer::gather_state(std::string_view name) const {
  check_state_name(name);
  const int rank = comm_.rank(), size = comm_.size();
  const int64_t W = options_.max_message_elements;
  const SlabRange mine = layout_.state_range(rank);
  if (rank != 0) {
    // Only rank 0 receives, and it has posted every receive: blocking sends cannot wait on
    // each other.
    std::vector<float> values(mine.size(), 0.0f);
    export_state(name, values.data());
    for (int64_t at = 0; at < mine.size(); at += W)
      comm_.send(values.data() + at, std::min(W, mine.size() - at), 0, kTagStateGather);
    return {};
  }
  std::vector<float> full(layout_.slab_elements(), 0.0f);
  std::vector<Request> receives;
  for (int r = 1; r < size; ++r) {
    const SlabRange theirs = layout_.state_range(r);
    for (int64_t at = 0; at < theirs.size(); at += W)
      receives.push_back(comm_.irecv(full.data() + theirs.begin + at,
                                     std::min(W, theirs.size() - at), r, kTagStateGather));
  }
  export_state(name, full.data() + mine.begin);
  for (Request& r : receives) r.wait();
  return full;
}

void Zero1Optimizer::load_state(std::string_view name, std::span<const float> full_slab) {
  check_state_name(name);
  const int rank = comm_.rank(), size = comm_.size();
  const int64_t W = options_.max_message_elements;
  // Rank 0 decides whether the slab fits, for everyone: a rank failing alone would leave
  // the others waiting for its messages.
  int64_t given = rank == 0 ? static_cast<int64_t>(full_slab.size()) : 0;
  comm_.broadcast(&given, 1, 0);
  if (given != layout_.slab_elements())
    fail(fmt::format("ZeRO-1 load_state('{}') on rank {} of {}: rank 0 passed {} elements, the "
                     "state slab has {}",
                     name, rank, size, given, layout_.slab_elements()),
         "the checkpoint's state was written for another parameter table (model config)");
  const SlabRange mine = layout_.state_range(rank);
  if (rank != 0) {
    std::vector<float> values(mine.size());
    std::vector<Request> receives;
    for (int64_t at = 0; at < mine.size(); at += W)
      receives.push_back(
          comm_.irecv(values.data() + at, std::min(W, mine.size() - at), 0, kTagStateLoad));
    for (Request& r : receives) r.wait();
    import_state(name, values.data());
    return;
  }
  std::vector<Request> sends;
  for (int r = 1; r < size; ++r) {
    const SlabRange theirs = layout_.state_range(r);
    for (int64_t at = 0; at < theirs.size(); at += W)
      sends.push_back(comm_.isend(full_slab.data() + theirs.begin + at,
                                  std::min(W, theirs.size() - at), r, kTagStateLoad));
  }
  import_state(name, full_slab.data() + mine.begin);
  for (Request& r : sends) r.wait();
}

void Zero1Optimizer::reset() {
  std::fill(exp_avg_.begin(), exp_avg_.end(), 0.0f);
  std::fill(exp_avg_sq_.begin(), exp_avg_sq_.end(), 0.0f);
  std::fill(momentum_.begin(), momentum_.end(), 0.0f);
}

}  // namespace foundry
