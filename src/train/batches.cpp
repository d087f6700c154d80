#include "train/batches.h"

#include "base/rng.h"

namespace foundry {

void synthetic_batch(int32_t* inputs, int32_t* targets, int64_t n, int64_t vocab, uint64_t seed,
                     int64_t batch) {
  uint64_t key = seed ^ (0x5851f42d4c957f2dULL * static_cast<uint64_t>(batch + 1));
  Rng rng(Rng::splitmix64(key));
  for (int64_t i = 0; i < n; ++i) {
    inputs[i] = static_cast<int32_t>(rng.below(vocab));
    targets[i] = static_cast<int32_t>(rng.below(vocab));
  }
}

namespace {
int group_count(int ranks, const ContextParallel* cp) { return cp ? ranks / cp->size() : ranks; }
int group_index(int rank, const ContextParallel* cp) { return cp ? rank / cp->size() : rank; }
}  // namespace

TrainBatches::TrainBatches(data::BatchLoader* loader, int64_t batch, int64_t seq, int rank,
                           int ranks, int64_t vocab, uint64_t seed, const ContextParallel* cp)
    : loader_(loader),
      cp_(cp),
      seq_(seq),
      local_batch_(batch / group_count(ranks, cp)),
      offset_(group_index(rank, cp) * local_batch_ * seq),
      vocab_(vocab),
      seed_(seed),
      inputs_(static_cast<size_t>(batch * seq)),
      targets_(static_cast<size_t>(batch * seq)) {
  if (!cp_) return;
  local_inputs_.resize(static_cast<size_t>(local_batch_ * local_seq()));
  local_targets_.resize(local_inputs_.size());
}

int64_t TrainBatches::next() {
  for (;;) {
    ++batch_;
    if (loader_)
      loader_->next(inputs_.data(), targets_.data());
    else if (!skipped_.count(batch_))  // a synthetic batch is a function of its number
      synthetic_batch(inputs_.data(), targets_.data(), static_cast<int64_t>(inputs_.size()),
                      vocab_, seed_, batch_);
    if (skipped_.count(batch_)) continue;
    if (cp_) {
      cp_->take_local(inputs_.data() + offset_, local_inputs_.data(), local_batch_, seq_, 1);
      cp_->take_local(targets_.data() + offset_, local_targets_.data(), local_batch_, seq_, 1);
    }
    return batch_;
  }
}

}  // namespace foundry
