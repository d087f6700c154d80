#include "optim/grad_reduce.h"

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include "base/error.h"

namespace foundry {

GradientReducer::GradientReducer(const Communicator& comm, int64_t slab_elements,
                                 std::vector<int64_t> shard_counts,
                                 const GradientReducerOptions& options)
    : comm_(comm.dup()), slab_elements_(slab_elements), shard_counts_(std::move(shard_counts)),
      options_(options) {
  if (slab_elements < 0) fail(fmt::format("gradient reducer: slab of {} elements", slab_elements));
  if (options.bucket_elements < 0)
    fail(fmt::format("gradient bucket of {} elements must be >= 0", options.bucket_elements),
         "set train.grad_bucket_mib to 0 (one collective per report) or a positive size");
  if (options.max_message_elements < 1 || options.max_message_elements > INT32_MAX)
    fail(fmt::format("gradient reducer: max_message_elements = {} must lie in [1, 2^31 - 1]",
                     options.max_message_elements));
  if (!shard_counts_.empty()) {
    if (static_cast<int>(shard_counts_.size()) != comm_.size())
      fail(fmt::format("gradient reducer: {} shard counts for {} ranks", shard_counts_.size(),
                       comm_.size()));
    int64_t at = 0;
    for (int64_t c : shard_counts_) {
      if (c < 0) fail("gradient reducer: negative shard count");
      shard_begin_.push_back(at);
      at += c;
    }
    if (at != slab_elements)
      fail(fmt::format("gradient reducer: shards cover {} of {} slab elements", at,
                       slab_elements));
  }
}

const char* GradientReducer::exposed_op_name() const {
  return reduce_scatter() ? "comm: gradient reduce-scatter" : "comm: gradient all-reduce";
}

void GradientReducer::begin(float* grads, float* shard) {
  if (armed_) fail("gradient reducer: begin() twice without finish()");
  if (!grads || (reduce_scatter() && !shard && shard_counts_[comm_.rank()] > 0))
    fail("gradient reducer: null gradient or shard buffer");
  armed_ = true;
  grads_ = grads;
  shard_ = shard;
  reported_ = slab_elements_;
  started_ = slab_elements_;
  stats_ = {};
}

GradientReducer::Scratch GradientReducer::take_scratch(int64_t elements) {
  Scratch s;
  // The largest free buffer; grown when too small.
  auto largest = std::max_element(
      free_scratch_.begin(), free_scratch_.end(),
      [](const Scratch& x, const Scratch& y) { return x.capacity < y.capacity; });
  if (largest != free_scratch_.end()) {
    s = std::move(*largest);
    free_scratch_.erase(largest);
  }
  if (s.capacity < elements) {
    s.data.reset(new float[static_cast<size_t>(elements)]);
    s.capacity = elements;
  }
  return s;
}

void GradientReducer::give_back(Scratch& s) {
  if (s.data) free_scratch_.push_back(std::move(s));
  s = Scratch{};
}

void GradientReducer::set_zero_ranges(std::vector<Ranges> zero) {
  if (!reduce_scatter() && !zero.empty())
    fail("gradient reducer: zero ranges need the reduce-scatter (ZeRO-1)");
  if (!zero.empty() && static_cast<int>(zero.size()) != comm_.size())
    fail(fmt::format("gradient reducer: zero ranges for {} ranks, expected {}", zero.size(),
                     comm_.size()));
  bool any = false;
  for (const Ranges& r : zero) any = any || !r.empty();
  zero_ = any ? std::move(zero) : std::vector<Ranges>{};
}

GradientReducer::Ranges GradientReducer::contributed(int rank, int64_t begin, int64_t end) const {
  Ranges parts;
  int64_t at = begin;
  if (!zero_.empty()) {
    for (const auto& [b, e] : zero_[rank]) {
      if (e <= at) continue;
      if (b >= end) break;
      if (b > at) parts.push_back({at - begin, b - begin});
      at = std::max(at, e);
    }
  }
  if (at < end) parts.push_back({at - begin, end - begin});
  return parts;
}

bool GradientReducer::received(Bucket& b, int rank, float* target, const Ranges& parts) {
  if (!b.receiving) {
    b.receive = comm_.irecv_ranges(target, parts, rank, b.tag);
    b.receiving = true;
  }
  for (Request& r : b.receive)
    if (!r.done() && !r.test()) return false;
  b.receiving = false;
  return true;
}

void GradientReducer::start(int64_t begin, int64_t end) {
  const int me = comm_.rank(), p = comm_.size();
  for (int64_t lo = begin; lo < end; lo += options_.max_message_elements) {
    const int64_t hi = std::min(end, lo + options_.max_message_elements);
    const size_t index = buckets_.size();
    // Tags: 2·index (contributions) and 2·index + 1 (summed pieces), below 32768.
    if (index >= 16384)
      fail(fmt::format("gradient reducer: more than 16384 buckets in one step (buckets of {} "
                       "elements)",
                       options_.bucket_elements),
           "raise train.grad_bucket_mib");
    Bucket b;
    b.tag = static_cast<int>(2 * index);  // the same bucket has the same index on every rank
    b.piece_begin.resize(p);
    b.piece_size.resize(p);
    for (int q = 0; q < p; ++q) {
      int64_t a, z;
      if (reduce_scatter()) {  // the part of ZeRO-1 shard q in the bucket
        a = std::clamp(shard_begin_[q], lo, hi);
        z = std::clamp(shard_begin_[q] + shard_counts_[q], lo, hi);
      } else {  // equal parts
        const int64_t n = hi - lo;
        a = lo + n * q / p;
        z = lo + n * (q + 1) / p;
      }
      b.piece_begin[q] = a;
      b.piece_size[q] = z - a;
      if (q != me && z > a)
        for (Request& r : comm_.isend_ranges<float>(grads_ + a, contributed(me, a, z), q, b.tag))
          b.sends.push_back(std::move(r));
    }
    const int64_t n = b.piece_size[me];
    if (n > 0 && p > 1) {
      b.incoming = take_scratch(n);
      if (!reduce_scatter() && me > 0) b.sum = take_scratch(n);  // ranks before this one
    }
    ++stats_.collectives;
    buckets_.push_back(std::move(b));
  }
}

namespace {

// acc[0, m) += x[0, m)
void add_into(float* acc, const float* x, int64_t m) {
#pragma omp parallel for simd schedule(static) if (m > (int64_t{1} << 16))
  for (int64_t i = 0; i < m; ++i) acc[i] += x[i];
}

}  // namespace

bool GradientReducer::advance(Bucket& b) {
  if (b.complete) return true;
  // 1. Reduce: g_0 + g_1 + … + g_{p−1}, added in rank order (the same order on every rank).
  if (!(reduce_scatter() ? sum_into_shard(b) : sum_in_place(b))) return false;
  if (!contributions_sent(b)) return false;
  // 2. All-reduce: the summed pieces to everyone.
  if (!reduce_scatter() && !sums_shared(b)) return false;
  b.complete = true;
  return true;
}

// Into the shard. The first contribution is copied; with zero ranges every element starts at
// +0 and each rank's contributed parts are added.
bool GradientReducer::sum_into_shard(Bucket& b) {
  const int me = comm_.rank(), p = comm_.size();
  const int64_t n = b.piece_size[me], base = b.piece_begin[me];
  const float* mine = grads_ + base;  // this rank's piece of the slab (its own contribution)
  float* acc = shard_ + (base - shard_begin_[me]);
  while (n > 0 && b.next_rank < p) {
    const int q = b.next_rank;
    const Ranges parts = contributed(q, base, base + n);
    const float* src = mine;
    if (q != me) {
      if (!received(b, q, b.incoming.data.get(), parts)) return false;
      src = b.incoming.data.get();
    }
    const bool copy = q == 0 && zero_.empty();
    if (q == 0 && !copy) std::fill(acc, acc + n, 0.0f);
    for (const auto& [lo, hi] : parts) {
      if (copy)
        std::copy(src + lo, src + hi, acc + lo);
      else
        add_into(acc + lo, src + lo, hi - lo);
    }
    ++b.next_rank;
  }
  return true;
}

// In place in the slab's piece: the ranks before this one are summed in a scratch (the first
// received straight into it), this rank's contribution is added to that where it lies, then
// the later ranks' are added there.
bool GradientReducer::sum_in_place(Bucket& b) {
  const int me = comm_.rank(), p = comm_.size();
  const int64_t n = b.piece_size[me];
  float* mine = grads_ + b.piece_begin[me];
  float* partial = b.sum.data.get();
  const Ranges whole = {{0, n}};
  while (n > 0 && b.next_rank < p) {
    const int q = b.next_rank;
    if (q == me) {
      if (me > 0) add_into(mine, partial, n);  // partial + mine: one rounding, either order
    } else {
      if (!received(b, q, q == 0 ? partial : b.incoming.data.get(), whole)) return false;
      if (q > 0) add_into(q < me ? partial : mine, b.incoming.data.get(), n);
    }
    ++b.next_rank;
  }
  return true;
}

// Every contribution of this rank must be out before an all-reduce overwrites its pieces with
// the sums.
bool GradientReducer::contributions_sent(Bucket& b) {
  if (b.reduced) return true;
  for (Request& s : b.sends)
    if (!s.done() && !s.test()) return false;
  b.reduced = true;
  give_back(b.incoming);
  return true;
}

// Sends this rank's summed piece to everyone and receives theirs in place.
bool GradientReducer::sums_shared(Bucket& b) {
  const int me = comm_.rank(), p = comm_.size();
  const int64_t n = b.piece_size[me];
  if (!b.gathering) {
    b.gathering = true;
    give_back(b.sum);
    for (int q = 0; q < p; ++q) {
      if (q == me) continue;
      if (b.piece_size[q] > 0)
        b.gather.push_back(comm_.irecv(grads_ + b.piece_begin[q],
                                       static_cast<size_t>(b.piece_size[q]), q, b.tag + 1));
      if (n > 0)
        b.gather.push_back(
            comm_.isend(grads_ + b.piece_begin[me], static_cast<size_t>(n), q, b.tag + 1));
    }
  }
  for (Request& r : b.gather)
    if (!r.done() && !r.test()) return false;
  return true;
}

void GradientReducer::poll() {
  // Every open bucket: a later one's messages need not wait for an earlier one's.
  bool all_before_complete = true;
  for (size_t i = first_open_; i < buckets_.size(); ++i) {
    const bool complete = advance(buckets_[i]);
    if (complete && all_before_complete) first_open_ = i + 1;
    all_before_complete &= complete;
  }
}

void GradientReducer::final_from(int64_t offset) {
  if (!armed_) return;
  const double t0 = now_seconds();
  if (offset < 0 || offset > reported_)
    fail(fmt::format("gradient reducer: final offset {} after {} (offsets must decrease within "
                     "[0, {}])",
                     offset, reported_, slab_elements_));
  reported_ = offset;
  // A full bucket starts; so does the rest once everything is final.
  const int64_t pending = started_ - reported_;
  if (pending >= std::max<int64_t>(options_.bucket_elements, 1) || (offset == 0 && pending > 0)) {
    start(reported_, started_);
    stats_.started_in_backward = stats_.collectives;
    stats_.elements_in_backward += started_ - reported_;
    started_ = reported_;
  }
  poll();
  const double dt = now_seconds() - t0;
  stats_.in_backward_seconds += dt;
  if (op_times_) op_times_->add("comm: gradient buckets in backward", dt);
}

GradientReduceStats GradientReducer::finish(float* grads, float* shard) {
  ScopedOpTimer timer(op_times_, exposed_op_name());
  const double t0 = now_seconds();
  if (!armed_) {
    begin(grads, shard);
  } else if (grads != grads_ || shard != shard_) {
    fail("gradient reducer: finish() got other buffers than begin()");
  }
  if (started_ > 0) start(0, started_);
  while (first_open_ < buckets_.size()) poll();
  buckets_.clear();
  first_open_ = 0;
  armed_ = false;
  stats_.exposed_seconds = now_seconds() - t0;
  return stats_;
}

}  // namespace foundry
