#include "data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "data/test_util.h"

namespace foundry::data {
namespace {

using testing::expect_error;
using testing::make_synthetic_dataset;
using testing::TempDir;

struct Batch {
  std::vector<int32_t> inputs, targets;
  bool operator==(const Batch&) const = default;
};

Batch take(BatchLoader& loader) {
  Batch b;
  b.inputs.resize(static_cast<size_t>(loader.batch_size() * loader.seq_len()));
  b.targets.resize(b.inputs.size());
  loader.next(b.inputs.data(), b.targets.data());
  return b;
}

std::vector<Batch> take(BatchLoader& loader, int n) {
  std::vector<Batch> batches;
  for (int i = 0; i < n; ++i) batches.push_back(take(loader));
  return batches;
}

// Token i of a synthetic split is i, so a row's first input is its window's start token.
std::vector<int32_t> window_starts(const Batch& b, int64_t seq_len) {
  std::vector<int32_t> starts;
  for (size_t row = 0; row * seq_len < b.inputs.size(); ++row)
    starts.push_back(b.inputs[row * seq_len]);
  return starts;
}

class Loader : public ::testing::Test {
 protected:
  // 1601 train tokens in shards of 500: 100 windows of 16 + 1 tokens.
  void SetUp() override { make_synthetic_dataset(dir_.path(), 1601, 170, 500); }
  TempDir dir_;
};

TEST_F(Loader, TargetsAreInputsShiftedByOne) {
  Dataset dataset(dir_.path());
  BatchLoader loader(dataset, 4, 16, 1);
  EXPECT_EQ(loader.windows_per_epoch(), 100);
  for (const Batch& b : take(loader, 30)) {
    for (int row = 0; row < 4; ++row) {
      const int32_t* in = &b.inputs[row * 16];
      const int32_t* tg = &b.targets[row * 16];
      EXPECT_EQ(in[0] % 16, 0) << "windows start at multiples of seq_len";
      for (int t = 0; t < 16; ++t) {
        ASSERT_EQ(in[t], in[0] + t) << "a window is contiguous";
        ASSERT_EQ(tg[t], in[t] + 1) << "targets are the next tokens";
      }
    }
  }
}

TEST_F(Loader, EachEpochVisitsEveryWindowOnceInANewOrder) {
  Dataset dataset(dir_.path());
  BatchLoader loader(dataset, 5, 16, 7);
  std::vector<int32_t> epoch0, epoch1;
  for (const Batch& b : take(loader, 20))
    for (int32_t s : window_starts(b, 16)) epoch0.push_back(s);
  EXPECT_EQ(loader.epoch(), 1);
  EXPECT_EQ(loader.position(), 0);
  for (const Batch& b : take(loader, 20))
    for (int32_t s : window_starts(b, 16)) epoch1.push_back(s);
  std::vector<int32_t> all(100);
  for (int i = 0; i < 100; ++i) all[i] = i * 16;
  EXPECT_NE(epoch0, all) << "shuffled, not in stream order";
  EXPECT_NE(epoch0, epoch1) << "reshuffled every epoch";
  std::sort(epoch0.begin(), epoch0.end());
  std::sort(epoch1.begin(), epoch1.end());
  EXPECT_EQ(epoch0, all);
  EXPECT_EQ(epoch1, all);
}

TEST_F(Loader, SameSeedSameBatchesOtherSeedOtherBatches) {
  Dataset dataset(dir_.path());
  BatchLoader a(dataset, 4, 16, 123), b(dataset, 4, 16, 123), c(dataset, 4, 16, 124);
  const auto from_a = take(a, 40);  // crosses an epoch boundary
  EXPECT_EQ(from_a, take(b, 40));
  EXPECT_NE(from_a, take(c, 40));
}

TEST_F(Loader, RestoredCursorReproducesTheRun) {
  Dataset dataset(dir_.path());
  BatchLoader original(dataset, 8, 16, 5);
  take(original, 5);
  // Through text, as a checkpoint would store it.
  const nlohmann::json cursor = nlohmann::json::parse(original.cursor().dump());
  const auto expected = take(original, 15);  // crosses into epoch 1

  BatchLoader resumed(dataset, 8, 16, 5);
  resumed.restore(cursor);
  EXPECT_EQ(resumed.epoch(), 0);
  EXPECT_EQ(resumed.position(), 40);
  EXPECT_EQ(take(resumed, 15), expected);

  // The cursor counts windows, not batches: a different batch size continues the same stream.
  BatchLoader halves(dataset, 4, 16, 5);
  halves.restore(cursor);
  const auto half_batches = take(halves, 2);
  std::vector<int32_t> joined = half_batches[0].inputs;
  joined.insert(joined.end(), half_batches[1].inputs.begin(), half_batches[1].inputs.end());
  EXPECT_EQ(joined, expected[0].inputs);
}

TEST_F(Loader, CursorHasTheDocumentedKeys) {
  Dataset dataset(dir_.path());
  BatchLoader loader(dataset, 3, 16, 9);
  take(loader, 2);
  const nlohmann::json c = loader.cursor();
  EXPECT_EQ(c["version"], 1);
  EXPECT_EQ(c["split"], "train");
  EXPECT_EQ(c["order"], "shuffled");
  EXPECT_EQ(c["seed"], 9);
  EXPECT_EQ(c["seq_len"], 16);
  EXPECT_EQ(c["windows"], 100);
  EXPECT_EQ(c["epoch"], 0);
  EXPECT_EQ(c["position"], 6);
  EXPECT_EQ(c["tokens_xxh3"], hash64_hex(dataset.train().content_checksum()));
  EXPECT_EQ(c.size(), 9u);
}

TEST_F(Loader, RestoreRejectsAForeignCursor) {
  Dataset dataset(dir_.path());
  BatchLoader loader(dataset, 4, 16, 5);
  const nlohmann::json good = loader.cursor();
  auto expect_rejected = [&](const std::string& key, const nlohmann::json& value,
                             const std::string& fragment) {
    nlohmann::json c = good;
    c[key] = value;
    expect_error([&] { loader.restore(c); }, {"data cursor", fragment});
  };
  expect_rejected("seed", 6, "seed 6");
  expect_rejected("seq_len", 32, "seq_len 32");
  expect_rejected("windows", 99, "99 windows");
  expect_rejected("position", 100, "out of range");
  expect_rejected("position", -1, "out of range");
  expect_rejected("epoch", -1, "out of range");
  expect_rejected("split", "val", "'val' split");
  expect_rejected("order", "sequential", "sequential");
  expect_rejected("version", 2, "version 2");
  expect_rejected("extra", 1, "unknown key 'extra'");
  expect_rejected("position", "ten", "position");
  // Other tokens in as many windows: another dataset.
  expect_rejected("tokens_xxh3", "0123456789abcdef", "saved on other tokens");
  // A cursor from before the content checksum was kept still restores.
  nlohmann::json earlier = good;
  earlier.erase("tokens_xxh3");
  loader.restore(earlier);
  nlohmann::json missing = good;
  missing.erase("epoch");
  expect_error([&] { loader.restore(missing); }, {"missing key 'epoch'"});
  expect_error([&] { loader.restore(nlohmann::json::array()); }, {"data cursor"});
  // A rejected cursor leaves the loader where it was.
  EXPECT_EQ(loader.position(), 0);
}

TEST_F(Loader, EvalReadsValInOrderWrapsAndResets) {
  Dataset dataset(dir_.path());
  // 170 val tokens: 10 windows of 16 + 1.
  BatchLoader eval = BatchLoader::for_eval(dataset, 4, 16);
  EXPECT_EQ(eval.windows_per_epoch(), 10);
  EXPECT_EQ(eval.batches_per_epoch(), 3);
  const auto first = take(eval, 3);
  EXPECT_EQ(window_starts(first[0], 16), (std::vector<int32_t>{0, 16, 32, 48}));
  EXPECT_EQ(window_starts(first[2], 16), (std::vector<int32_t>{128, 144, 0, 16}));  // wraps
  EXPECT_EQ(first[0].targets[0], 1);
  eval.reset();
  EXPECT_EQ(take(eval, 3), first);
  EXPECT_EQ(eval.cursor()["order"], "sequential");
  EXPECT_EQ(eval.cursor()["split"], "val");
}

TEST_F(Loader, SplitShorterThanOneWindowIsAnError) {
  Dataset dataset(dir_.path());
  expect_error([&] { BatchLoader::for_eval(dataset, 1, 170); },
               {"'val' split", dir_.path(), "170 tokens", "seq_len + 1 = 171"});
  EXPECT_NO_THROW(BatchLoader::for_eval(dataset, 1, 169));
  expect_error([&] { BatchLoader(dataset, 0, 16, 1); }, {"batch size 0"});
}

}  // namespace
}  // namespace foundry::data
