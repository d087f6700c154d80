#include "optim/zero1.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <utility>

#include "base/error.h"
#include "comm/agree.h"
#include "optim/clip.h"
#include "optim/slab_chunks.h"
#include "optim/zero1_messages.h"

namespace foundry {

namespace {

// As in optim/muon.cpp: elementwise loops below this size run on one thread.
constexpr int64_t kParallelElements = 1 << 15;

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

}  // namespace

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
  check_same_on_every_rank(table);
  validate_options(adamw, muon);
  if (options.max_message_elements < 1 || options.max_message_elements > INT32_MAX)
    fail(fmt::format("ZeRO-1 max_message_elements = {} must lie in [1, 2^31 - 1]",
                     options.max_message_elements));
  layout_ = Zero1Layout(optimizer_tensors(table, adamw, muon.has_value()), table.total_elements(),
                        comm_.size());
  shard_ = layout_.shard(comm_.rank());
  reducer_.emplace(comm_, layout_.slab_elements(), layout_.shard_counts(),
                   GradientReducerOptions{options.bucket_elements, options.max_message_elements});
  plan_windows();
  plan_norm_chunks(table);
  plan_adamw_chunks(table);
  plan_muon(table);
  grad_shard_ = PageSlab<float>(static_cast<size_t>(shard_.size()));
}

// Every rank must build the same layout with the same options: fingerprints compared before
// anything that could fail on one rank only.
void Zero1Optimizer::check_same_on_every_rank(const ParamTable& table) const {
  const AdamWOptions& adamw = adamw_options_;
  const std::optional<MuonOptions>& muon = muon_options_;
  const int rank = comm_.rank(), size = comm_.size();
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
  options_print.add(options_.bucket_elements);  // the buckets decide the collectives' order
  const int64_t mine[4] = {table.total_elements(), static_cast<int64_t>(table_print.h),
                           static_cast<int64_t>(options_print.h), options_.max_message_elements};
  std::vector<int64_t> all;
  for (int r : ranks_differing_from_root(comm_, mine, &all)) {
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
}

// Windows for the reduce-scatter and the all-gather.
void Zero1Optimizer::plan_windows() {
  const int64_t E = layout_.slab_elements(), W = options_.max_message_elements;
  for (int64_t begin = 0; begin < E; begin += W) {
    Window w;
    w.range = {begin, std::min(E, begin + W)};
    for (int r = 0; r < comm_.size(); ++r)
      w.counts.push_back(intersect(w.range, layout_.shard(r)).size());
    windows_.push_back(std::move(w));
  }
}

// Norm chunks: optim/clip.h's chunks, cut at the shard's ends. On one rank they are exactly
// clip's, so the norm is too.
void Zero1Optimizer::plan_norm_chunks(const ParamTable& table) {
  for (const SlabChunk& c : slab_chunks(table, nullptr)) {
    const SlabRange part = intersect({c.offset, c.offset + c.size}, shard_);
    if (part.size() > 0) norm_chunks_.push_back({part.begin, part.size(), false});
  }
}

// AdamW: the shard's part of every AdamW tensor, in slab order, with its moments packed.
void Zero1Optimizer::plan_adamw_chunks(const ParamTable& table) {
  int64_t state = 0;
  for (size_t i = 0; i < table.params().size(); ++i) {
    const ParamInfo& p = table.params()[i];
    if (!layout_.tensors()[i].adamw) continue;
    const SlabRange part = intersect({p.offset, p.offset + p.numel}, shard_);
    const bool decay = adamw_decays(p, adamw_options_);
    for (int64_t at = part.begin; at < part.end; at += kSlabChunkElements) {
      const int64_t n = std::min(kSlabChunkElements, part.end - at);
      adamw_chunks_.push_back({at, n, state, decay});
      state += n;
    }
  }
  exp_avg_ = PageSlab<float>(static_cast<size_t>(state));
  exp_avg_sq_ = PageSlab<float>(static_cast<size_t>(state));
}

// Muon: the matrices this rank owns, their momentum packed whole.
void Zero1Optimizer::plan_muon(const ParamTable& table) {
  const int rank = comm_.rank();
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
  momentum_ = PageSlab<float>(static_cast<size_t>(momentum));
  owned_split_ = layout_.owned_split_matrix(rank);
  held_split_ = layout_.held_split_matrix(rank);
  if (owned_split_ >= 0)
    exchange_ = PageSlab<float>(static_cast<size_t>(matrices[owned_split_].numel));
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
  const int64_t n = m.numel;
  // The gradient is already clipped (clip_shard_gradient scales the shard).
  muon_momentum(gu, momentum_.data() + momentum_offset_[index], gu, n,
                static_cast<float>(o.momentum), o.nesterov, 1.0f);

  newton_schulz_.run(gu, gu, m.rows, m.cols, o.ns_steps, o.bf16_newton_schulz);

  const float keep = muon_decays_[index] ? static_cast<float>(1.0 - lr * o.weight_decay) : 1.0f;
  const float step_size = static_cast<float>(
      lr * o.rms_scale * std::sqrt(static_cast<double>(std::max(m.rows, m.cols))));
  muon_apply(params + m.offset, gu, n, keep, step_size, nullptr);
}

void Zero1Optimizer::begin_backward(const float* grads) {
  reducer_->begin(const_cast<float*>(grads), grad_shard_.data());  // read only
}

double Zero1Optimizer::step(float* params, const float* grads, double lr, int64_t step,
                            double max_grad_norm, const UpdateVeto& veto) {
  if (!params || !grads)
    fail(fmt::format("ZeRO-1 step on rank {} of {}: null parameter or gradient slab", comm_.rank(),
                     comm_.size()));
  // Reduce-scatter only reads the gradient slab.
  last_reduce_ = reducer_->finish(const_cast<float*>(grads), grad_shard_.data());
  ScopedOpTimer local_work(op_times_, "optimizer");
  average_shard_gradient();
  const double norm = clip_shard_gradient(lr, step, max_grad_norm);
  // Every rank sees the same norm (and the veto is the caller's agreed decision): all skip.
  if ((veto && veto(norm)) || !std::isfinite(norm)) return norm;
  BoundaryExchange exchange = start_boundary_exchange(params);
  // Local work while the pieces travel: AdamW on the shard, Muon on the matrices inside.
  adamw_step(params, lr, step);
  if (muon_options_)
    for (size_t m : muon_inside_)
      muon_matrix(m, params, shard_gradient(layout_.muon_matrices()[m].offset), lr);
  finish_boundary_exchange(params, lr, exchange);
  all_gather_weights(params);
  return norm;
}

// The reduce-scatter summed the ranks' gradients of this shard: their mean.
void Zero1Optimizer::average_shard_gradient() {
  if (comm_.size() == 1) return;
  const float inv_dp = static_cast<float>(1.0 / comm_.size());
  const int64_t n_chunks = static_cast<int64_t>(norm_chunks_.size());
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n_chunks; ++c)
    scale_in_place(shard_gradient(norm_chunks_[c].offset), norm_chunks_[c].size, inv_dp);
}

// The global norm: the shard's sum over fixed chunks in chunk order, then the shards' sums in
// rank order on every rank (so every rank computes the same bits), and the clip. The step's
// arguments travel along, to check that every rank passed the same ones.
double Zero1Optimizer::clip_shard_gradient(double lr, int64_t step, double max_grad_norm) {
  const int rank = comm_.rank(), size = comm_.size();
  const int64_t n_chunks = static_cast<int64_t>(norm_chunks_.size());
  std::vector<double> partial(n_chunks);
  chunk_sums_of_squares(
      norm_chunks_, [&](int64_t offset) { return shard_gradient(offset); }, partial.data());
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
  if (std::isfinite(norm) && max_grad_norm > 0 && norm > max_grad_norm) {
    const float factor = static_cast<float>(max_grad_norm / norm);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n_chunks; ++c)
      scale_in_place(shard_gradient(norm_chunks_[c].offset), norm_chunks_[c].size, factor);
  }
  return norm;
}

// Receives are posted before any send, and each rank sends gradient pieces only to lower
// ranks (owners) and updated pieces only to higher ranks (holders), so no wait can be part
// of a cycle (docs/zero1.md).
Zero1Optimizer::BoundaryExchange Zero1Optimizer::start_boundary_exchange(float* params) {
  const std::vector<MuonPlacement>& matrices = layout_.muon_matrices();
  BoundaryExchange exchange;
  if (owned_split_ >= 0) {
    const MuonPlacement& m = matrices[owned_split_];
    for (int h = m.owner + 1; h <= m.last_rank; ++h) {
      const SlabRange p = layout_.piece(owned_split_, h);
      if (p.size() == 0) continue;
      exchange.gradient_receives.push_back(
          comm_.irecv(exchange_.data() + (p.begin - m.offset), p.size(), h, kTagGradientPiece));
    }
  }
  if (held_split_ >= 0) {
    const MuonPlacement& m = matrices[held_split_];
    const SlabRange p = layout_.piece(held_split_, comm_.rank());
    exchange.pending.push_back(comm_.irecv(params + p.begin, p.size(), m.owner, kTagUpdatedPiece));
    exchange.pending.push_back(
        comm_.isend(shard_gradient(p.begin), p.size(), m.owner, kTagGradientPiece));
  }
  return exchange;
}

// The owned split matrix: assemble its gradient, update it, send the pieces back; then wait
// for this rank's own piece of the matrix it holds.
void Zero1Optimizer::finish_boundary_exchange(float* params, double lr,
                                              BoundaryExchange& exchange) {
  if (owned_split_ >= 0) {
    const MuonPlacement& m = layout_.muon_matrices()[owned_split_];
    std::memcpy(exchange_.data(), shard_gradient(m.offset),
                sizeof(float) * (shard_.end - m.offset));
    {
      ScopedOpTimer t(op_times_, "comm: norm and boundary exchange");
      for (Request& r : exchange.gradient_receives) r.wait();
    }
    muon_matrix(owned_split_, params, exchange_.data(), lr);
    for (int h = m.owner + 1; h <= m.last_rank; ++h) {
      const SlabRange p = layout_.piece(owned_split_, h);
      if (p.size() == 0) continue;
      exchange.pending.push_back(comm_.isend(params + p.begin, p.size(), h, kTagUpdatedPiece));
    }
  }
  ScopedOpTimer t(op_times_, "comm: norm and boundary exchange");
  for (Request& r : exchange.pending) r.wait();
}

// Every rank gets every shard of the updated slab (or the parts it stores).
void Zero1Optimizer::all_gather_weights(float* params) {
  const int rank = comm_.rank(), size = comm_.size();
  ScopedOpTimer t(op_times_, "comm: weight all-gather");
  if (released_.empty()) {
    for (const Window& w : windows_) comm_.allgatherv_in_place(params + w.range.begin, w.counts);
    return;
  }
  std::vector<Request> requests;
  for (int q = 0; q < size; ++q)
    if (q != rank)
      append_requests(requests,
                      comm_.irecv_ranges(params, shard_parts(q, rank, true), q, kTagSparseGather));
  for (int r = 0; r < size; ++r)
    if (r != rank)
      append_requests(requests, comm_.isend_ranges<float>(params, shard_parts(rank, r, true), r,
                                                          kTagSparseGather));
  for (Request& q : requests) q.wait();
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
        fail(
            fmt::format("ZeRO-1: rank {}'s released ranges are not sorted, disjoint slab "
                        "ranges",
                        r));
      if (b < s.end && e > s.begin)
        fail(fmt::format("ZeRO-1: rank {} releases [{}, {}), which overlaps its shard [{}, {})", r,
                         b, e, s.begin, s.end),
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

}  // namespace foundry
