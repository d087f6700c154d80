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

void GradientReducer::reduce_range(int64_t begin, int64_t end, bool nonblocking) {
  const int me = comm_.rank();
  for (int64_t b = begin; b < end; b += options_.max_message_elements) {
    const int64_t e = std::min(end, b + options_.max_message_elements);
    ++stats_.collectives;
    if (!reduce_scatter()) {
      if (nonblocking)
        in_flight_.push_back(comm_.iallreduce(grads_ + b, grads_ + b, static_cast<size_t>(e - b)));
      else
        comm_.allreduce(grads_ + b, grads_ + b, static_cast<size_t>(e - b));
      continue;
    }
    if (nonblocking) {
      start_bucket(b, e);
      continue;
    }
    std::vector<int64_t> counts(shard_counts_.size());
    for (size_t r = 0; r < counts.size(); ++r) {
      const int64_t lo = std::max(b, shard_begin_[r]);
      const int64_t hi = std::min(e, shard_begin_[r] + shard_counts_[r]);
      counts[r] = std::max<int64_t>(0, hi - lo);
    }
    float* recv = counts[me] > 0 ? shard_ + (std::max(b, shard_begin_[me]) - shard_begin_[me])
                                 : shard_;
    comm_.reduce_scatterv(grads_ + b, recv, counts);
  }
}

void GradientReducer::start_bucket(int64_t begin, int64_t end) {
  const int me = comm_.rank(), p = comm_.size();
  const size_t index = buckets_.size();
  if (index >= 32768)
    fail(fmt::format("gradient reducer: more than 32768 buckets in one step (bucket of {} "
                     "elements)",
                     options_.bucket_elements),
         "raise train.grad_bucket_mib");
  Bucket b;
  b.tag = static_cast<int>(index);  // the same bucket has the same index on every rank
  for (int q = 0; q < p; ++q) {
    const int64_t lo = std::max(begin, shard_begin_[q]);
    const int64_t hi = std::min(end, shard_begin_[q] + shard_counts_[q]);
    if (hi <= lo) continue;
    if (q == me) {
      b.piece_begin = lo;
      b.piece_size = hi - lo;
    } else {
      b.sends.push_back(comm_.isend(grads_ + lo, static_cast<size_t>(hi - lo), q, b.tag));
    }
  }
  if (b.piece_size > 0 && p > 1) {
    if (index < spare_scratch_.size()) b.scratch = std::move(spare_scratch_[index]);
    b.scratch.resize(static_cast<size_t>(b.piece_size));
  }
  buckets_.push_back(std::move(b));
}

bool GradientReducer::advance(Bucket& b) {
  const int me = comm_.rank(), p = comm_.size();
  float* acc = shard_ + (b.piece_begin - shard_begin_[me]);
  const int64_t n = b.piece_size;
  while (n > 0 && b.next_rank < p) {
    const int q = b.next_rank;
    const float* src = grads_ + b.piece_begin;
    if (q != me) {
      if (!b.receiving) {
        b.receive = comm_.irecv(b.scratch.data(), static_cast<size_t>(n), q, b.tag);
        b.receiving = true;
      }
      if (!b.receive.test()) return false;
      b.receiving = false;
      src = b.scratch.data();
    }
    // Rank order: acc = g_0, then acc += g_1, g_2, … (the same order on every rank).
    if (q == 0) {
      std::copy(src, src + n, acc);
    } else {
#pragma omp parallel for simd schedule(static) if (n > (int64_t{1} << 16))
      for (int64_t i = 0; i < n; ++i) acc[i] += src[i];
    }
    ++b.next_rank;
  }
  for (Request& s : b.sends)
    if (!s.done() && !s.test()) return false;
  return true;
}

void GradientReducer::poll() {
  // Testing the oldest request drives Open MPI's progress engine for all of them.
  while (first_pending_ < in_flight_.size() && in_flight_[first_pending_].test()) ++first_pending_;
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
    reduce_range(reported_, started_, /*nonblocking=*/true);
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
    reduce_range(0, slab_elements_, /*nonblocking=*/false);
  } else {
    if (grads != grads_ || shard != shard_)
      fail("gradient reducer: finish() got other buffers than begin()");
    if (started_ > 0) reduce_range(0, started_, /*nonblocking=*/true);
    for (size_t i = first_pending_; i < in_flight_.size(); ++i) in_flight_[i].wait();
    while (first_open_ < buckets_.size()) poll();
  }
  in_flight_.clear();
  first_pending_ = 0;
  spare_scratch_.resize(std::max(spare_scratch_.size(), buckets_.size()));
  for (size_t i = 0; i < buckets_.size(); ++i) spare_scratch_[i] = std::move(buckets_[i].scratch);
  buckets_.clear();
  first_open_ = 0;
  armed_ = false;
  stats_.exposed_seconds = now_seconds() - t0;
  return stats_;
}

}  // namespace foundry
