// Batches of next-token training examples from a dataset split, with a resumable cursor.
//
// A split is one stream of T tokens. It is cut into W = (T - 1) / seq_len windows of
// seq_len + 1 tokens; window w starts at token w * seq_len, so consecutive windows share one
// token and every token after the first is a target exactly once per epoch. A batch row is one
// window: inputs are its first seq_len tokens, targets its last seq_len (inputs shifted by one).
//
// Order: Shuffled visits the windows of each epoch in a permutation drawn from (seed, epoch)
// and reshuffles every epoch; Sequential visits them in stream order, wrapping at the end.
// Batches may span an epoch boundary. The loader's whole state is (epoch, position), so the
// cursor is small, and a loader restored from a cursor produces exactly the batches the
// original would have produced next, whatever batch size either uses.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "data/dataset.h"

namespace foundry::data {

enum class BatchOrder { Shuffled, Sequential };

class BatchLoader {
 public:
  // Training batches: the train split in shuffled order. `dataset` must outlive the loader.
  BatchLoader(const Dataset& dataset, int64_t batch_size, int64_t seq_len, uint64_t seed);
  // Any split in either order; `seed` only matters for Shuffled. `split` must outlive it.
  BatchLoader(const TokenSplit& split, int64_t batch_size, int64_t seq_len, uint64_t seed,
              BatchOrder order);
  // The windows of seq_len + 1 tokens (overlapping by one) that `tokens` tokens hold.
  static int64_t windows_in(uint64_t tokens, int64_t seq_len) {
    return tokens > uint64_t(seq_len) ? int64_t((tokens - 1) / uint64_t(seq_len)) : 0;
  }
  // Evaluation batches: the val split in order from its start; call reset() before each pass.
  static BatchLoader for_eval(const Dataset& dataset, int64_t batch_size, int64_t seq_len);

  // Fills inputs and targets, each [batch_size, seq_len] row-major, and advances.
  void next(int32_t* inputs, int32_t* targets);

  // Back to the first window of epoch 0.
  void reset();

  // The position as JSON: {"version", "split", "order", "seed", "seq_len", "windows",
  // "epoch", "position"} (docs/formats.md). restore() accepts only a cursor made for the
  // same split, order, seed, seq_len and window count, and fails naming the mismatch.
  nlohmann::json cursor() const;
  void restore(const nlohmann::json& cursor);

  int64_t batch_size() const { return batch_size_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t windows_per_epoch() const { return windows_; }
  // Batches needed to see every window once (the last one may wrap into the next epoch).
  int64_t batches_per_epoch() const { return (windows_ + batch_size_ - 1) / batch_size_; }
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }  // windows already taken in this epoch

 private:
  uint64_t window_at(int64_t position);  // the window index visited at `position`
  void build_permutation();

  const TokenSplit& split_;
  int64_t batch_size_, seq_len_;
  uint64_t seed_;
  BatchOrder order_;
  int64_t windows_ = 0;
  int64_t epoch_ = 0, position_ = 0;
  std::vector<uint32_t> permutation_;  // Shuffled only: the order for `permutation_epoch_`
  int64_t permutation_epoch_ = -1;
};

}  // namespace foundry::data
