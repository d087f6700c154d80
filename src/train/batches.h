// The token batches of a training run: every rank reads the whole global batch (from the
// dataset's loader, or random tokens) and trains on its slice, so the data each rank sees
// depends only on the global batch and the rank count, not on how ranks read.
#pragma once
#include <cstdint>
#include <vector>

#include "data/loader.h"

namespace foundry {

// Uniformly random tokens in [0, vocab), a pure function of (seed, step): inputs and
// targets [n] each. Synthetic batches need no cursor to resume.
void synthetic_batch(int32_t* inputs, int32_t* targets, int64_t n, int64_t vocab, uint64_t seed,
                     int64_t step);

class TrainBatches {
 public:
  // `loader` null: synthetic batches of `vocab` tokens from `seed`. The global batch is
  // [batch, seq]; rank `rank` of `ranks` trains on sequences [rank·batch/ranks, …) of it.
  TrainBatches(data::BatchLoader* loader, int64_t batch, int64_t seq, int rank, int ranks,
               int64_t vocab, uint64_t seed);

  // Reads the global batch of training step `step` (1-based).
  void next(int64_t step);
  // This rank's slice of the last batch: [local_batch(), seq] tokens each.
  const int32_t* local_inputs() const { return inputs_.data() + offset_; }
  const int32_t* local_targets() const { return targets_.data() + offset_; }
  int64_t local_batch() const { return local_batch_; }
  int64_t seq_len() const { return seq_; }
  int64_t global_tokens() const { return static_cast<int64_t>(inputs_.size()); }

 private:
  data::BatchLoader* loader_;
  int64_t seq_, local_batch_, offset_, vocab_;
  uint64_t seed_;
  std::vector<int32_t> inputs_, targets_;  // [batch, seq]
};

}  // namespace foundry
