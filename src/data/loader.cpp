#include "data/loader.h"

#include <filesystem>
#include <limits>

#include "base/config_reader.h"
#include "base/error.h"
#include "base/hash.h"
#include "base/rng.h"

namespace foundry::data {

namespace {

constexpr int64_t kCursorVersion = 1;

const char* order_name(BatchOrder order) {
  return order == BatchOrder::Shuffled ? "shuffled" : "sequential";
}

std::string split_location(const TokenSplit& split) {
  if (split.shards().empty()) return fmt::format("'{}' split", split.name());
  return fmt::format("'{}' split of dataset '{}'", split.name(),
                     std::filesystem::path(split.shards().front().path()).parent_path().string());
}

}  // namespace

BatchLoader::BatchLoader(const Dataset& dataset, int64_t batch_size, int64_t seq_len, uint64_t seed)
    : BatchLoader(dataset.train(), batch_size, seq_len, seed, BatchOrder::Shuffled) {}

BatchLoader BatchLoader::for_eval(const Dataset& dataset, int64_t batch_size, int64_t seq_len) {
  return BatchLoader(dataset.val(), batch_size, seq_len, 0, BatchOrder::Sequential);
}

BatchLoader::BatchLoader(const TokenSplit& split, int64_t batch_size, int64_t seq_len,
                         uint64_t seed, BatchOrder order)
    : split_(split), batch_size_(batch_size), seq_len_(seq_len), seed_(seed), order_(order) {
  if (batch_size < 1 || seq_len < 1)
    fail(fmt::format("batch size {} and sequence length {} must both be at least 1", batch_size,
                     seq_len),
         "set train.batch_size and train.seq_len to positive values");
  const uint64_t tokens = split.token_count();
  if (tokens < static_cast<uint64_t>(seq_len) + 1)
    fail(
        fmt::format("the {} has {} tokens, fewer than seq_len + 1 = {}", split_location(split),
                    tokens, seq_len + 1),
        split.name() == "val"
            ? "use a shorter seq_len, or prepare the data with more text or a larger --val-fraction"
            : "use a shorter seq_len, or prepare the data with more text");
  windows_ = windows_in(tokens, seq_len);
  if (order_ == BatchOrder::Shuffled &&
      static_cast<uint64_t>(windows_) > std::numeric_limits<uint32_t>::max())
    fail(fmt::format("the {} has {} windows of {} tokens, more than the shuffler supports (2^32)",
                     split_location(split), windows_, seq_len + 1),
         "use a longer seq_len");
}

void BatchLoader::build_permutation() {
  // Fisher-Yates with a generator seeded from (seed, epoch): any epoch's order can be rebuilt
  // from the cursor alone.
  uint64_t mix = seed_;
  Rng rng(Rng::splitmix64(mix) ^ static_cast<uint64_t>(epoch_));
  permutation_.resize(static_cast<size_t>(windows_));
  for (size_t i = 0; i < permutation_.size(); ++i) permutation_[i] = static_cast<uint32_t>(i);
  for (size_t i = permutation_.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(rng.below(i));
    std::swap(permutation_[i - 1], permutation_[j]);
  }
  permutation_epoch_ = epoch_;
}

uint64_t BatchLoader::window_at(int64_t position) {
  if (order_ == BatchOrder::Sequential) return static_cast<uint64_t>(position);
  if (permutation_epoch_ != epoch_) build_permutation();
  return permutation_[static_cast<size_t>(position)];
}

void BatchLoader::next(int32_t* inputs, int32_t* targets) {
  const uint64_t len = static_cast<uint64_t>(seq_len_);
  for (int64_t row = 0; row < batch_size_; ++row) {
    const uint64_t start = window_at(position_) * len;
    split_.copy_tokens(start, len, inputs + row * seq_len_);
    split_.copy_tokens(start + 1, len, targets + row * seq_len_);
    if (++position_ == windows_) {
      position_ = 0;
      ++epoch_;
    }
  }
}

void BatchLoader::reset() {
  epoch_ = 0;
  position_ = 0;
}

nlohmann::json BatchLoader::cursor() const {
  return {{"version", kCursorVersion},
          {"split", split_.name()},
          {"order", order_name(order_)},
          {"seed", seed_},
          {"seq_len", seq_len_},
          {"windows", windows_},
          {"epoch", epoch_},
          {"position", position_},
          {"tokens_xxh3", hash64_hex(split_.content_checksum())}};
}

void BatchLoader::restore(const nlohmann::json& cursor) {
  const std::string where = "data cursor";
  const char* hint = "resume with the same dataset, data seed and seq_len as the saved run";
  ConfigReader reader(cursor, where);
  auto require = [&](const char* key) {
    if (!cursor.is_object() || !cursor.contains(key))
      fail(fmt::format("{}: missing key '{}'", where, key), hint);
  };
  for (const char* key :
       {"version", "split", "order", "seed", "seq_len", "windows", "epoch", "position"})
    require(key);
  int64_t version = 0, seq_len = 0, windows = 0, epoch = 0, position = 0;
  uint64_t seed = 0;
  std::string split, order;
  reader.get("version", version);
  reader.get("split", split);
  reader.get("order", order);
  reader.get("seed", seed);
  reader.get("seq_len", seq_len);
  reader.get("windows", windows);
  reader.get("epoch", epoch);
  reader.get("position", position);
  std::string tokens;  // the split's content checksum (absent in cursors of earlier versions)
  reader.get("tokens_xxh3", tokens);
  reader.finish();

  if (version != kCursorVersion)
    fail(fmt::format("{}: version {} is not supported (expected {})", where, version,
                     kCursorVersion),
         hint);
  if (split != split_.name())
    fail(fmt::format("{}: saved for the '{}' split, this loader reads '{}'", where, split,
                     split_.name()),
         hint);
  if (order != order_name(order_))
    fail(fmt::format("{}: saved for {} order, this loader is {}", where, order, order_name(order_)),
         hint);
  if (order_ == BatchOrder::Shuffled && seed != seed_)
    fail(fmt::format("{}: saved with seed {}, this loader uses seed {}", where, seed, seed_), hint);
  if (seq_len != seq_len_)
    fail(fmt::format("{}: saved with seq_len {}, this loader uses {}", where, seq_len, seq_len_),
         hint);
  if (windows != windows_)
    fail(fmt::format("{}: saved for {} windows, the {} has {} (the dataset changed)", where,
                     windows, split_location(split_), windows_),
         hint);
  if (!tokens.empty() && tokens != hash64_hex(split_.content_checksum()))
    fail(fmt::format("{}: saved on other tokens than the {} holds (XXH3-64 {} against {}, a "
                     "checksum of its shards' checksums): the run was trained on another "
                     "dataset, or on these tokens cut into shards of another size",
                     where, split_location(split_), tokens, hash64_hex(split_.content_checksum())),
         "resume on the dataset the run was trained on (data.dir; a re-prepared one needs the "
         "same --shard-tokens), or train on this one in a new run directory");
  if (epoch < 0 || position < 0 || position >= windows_)
    fail(fmt::format("{}: epoch {} / position {} is out of range (position must be in [0, {}))",
                     where, epoch, position, windows_),
         hint);
  epoch_ = epoch;
  position_ = position;
}

}  // namespace foundry::data
