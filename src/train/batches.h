// The token batches of a training run: every rank reads the whole global batch (from the
// dataset's loader, or random tokens) and trains on its slice, so the data each rank sees
// depends only on the global batch and the rank count, not on how ranks read.
#pragma once
#include <cstdint>
#include <set>
#include <vector>

#include "data/loader.h"
#include "model/context_parallel.h"

namespace foundry {

// Uniformly random tokens in [0, vocab), a pure function of (seed, batch number): inputs
// and targets [n] each. Synthetic batches need no cursor to resume.
void synthetic_batch(int32_t* inputs, int32_t* targets, int64_t n, int64_t vocab, uint64_t seed,
                     int64_t batch);

class TrainBatches {
 public:
  // `loader` null: synthetic batches of `vocab` tokens from `seed`. The global batch is
  // [batch, seq]; rank `rank` of `ranks` trains on sequences [rank·batch/ranks, …) of it.
  // With context parallelism (`cp`, groups of C consecutive ranks) the ranks / C groups split
  // the sequences, and each rank trains on its two chunks of its group's sequences.
  TrainBatches(data::BatchLoader* loader, int64_t batch, int64_t seq, int rank, int ranks,
               int64_t vocab, uint64_t seed, const ContextParallel* cp = nullptr);

  // Reads the next global batch not in the skip set and returns its number. Batches are
  // numbered from 1 in data order; a skipped batch is read (the loader's cursor moves past
  // it) and dropped, so the batches after it are those a run without the skip would see.
  int64_t next();
  // The number of the last batch read (0 before the first): training resumes after it.
  int64_t batch() const { return batch_; }
  // Drops batch `number` when it comes (no effect once it has been read).
  void skip(int64_t number) { skipped_.insert(number); }
  void unskip(int64_t number) { skipped_.erase(number); }
  const std::set<int64_t>& skipped() const { return skipped_; }
  // Resume: batch `number` was the last one read (the loader, if any, is restored apart).
  void restart_after(int64_t number) { batch_ = number; }

  // This rank's rows of the last batch: [local_batch(), local_seq()] tokens each.
  const int32_t* local_inputs() const {
    return cp_ ? local_inputs_.data() : inputs_.data() + offset_;
  }
  const int32_t* local_targets() const {
    return cp_ ? local_targets_.data() : targets_.data() + offset_;
  }
  int64_t local_batch() const { return local_batch_; }
  // Rows per sequence on this rank: seq_len(), or its two chunks' with context parallelism.
  int64_t local_seq() const { return cp_ ? seq_ / cp_->size() : seq_; }
  int64_t seq_len() const { return seq_; }
  int64_t global_tokens() const { return static_cast<int64_t>(inputs_.size()); }

 private:
  data::BatchLoader* loader_;
  const ContextParallel* cp_;
  int64_t seq_, local_batch_, offset_, vocab_;
  uint64_t seed_;
  int64_t batch_ = 0;
  std::set<int64_t> skipped_;
  std::vector<int32_t> inputs_, targets_;              // [batch, seq]
  std::vector<int32_t> local_inputs_, local_targets_;  // context parallel: this rank's rows
};

}  // namespace foundry
