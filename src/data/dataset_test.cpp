#include "data/dataset.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "base/hash.h"
#include "data/test_util.h"

namespace foundry::data {
namespace {

using testing::expect_error;
using testing::make_synthetic_dataset;
using testing::read_file;
using testing::TempDir;
using testing::write_file;

TEST(Dataset, OpensSplitsAsOneStreamAcrossShards) {
  TempDir dir;
  make_synthetic_dataset(dir.path(), 1000, 250, 300);
  Dataset dataset(dir.path());
  EXPECT_EQ(dataset.vocab_size(), 65536u);
  EXPECT_EQ(dataset.train().token_count(), 1000u);
  EXPECT_EQ(dataset.train().shards().size(), 4u);  // 300 + 300 + 300 + 100
  EXPECT_EQ(dataset.val().token_count(), 250u);
  EXPECT_EQ(&dataset.split("val"), &dataset.val());
  expect_error([&] { dataset.split("test"); }, {"unknown dataset split 'test'"});

  std::vector<int32_t> tokens(1000);
  dataset.train().copy_tokens(0, 1000, tokens.data());
  for (int32_t i = 0; i < 1000; ++i) ASSERT_EQ(tokens[i], i);
  std::vector<int32_t> across(50);  // spans shards 0 -> 1
  dataset.train().copy_tokens(280, 50, across.data());
  for (int32_t i = 0; i < 50; ++i) ASSERT_EQ(across[i], 280 + i);
  dataset.train().copy_tokens(899, 101, tokens.data());  // to the very end, shards 2 -> 3
  EXPECT_EQ(tokens[0], 899);
  EXPECT_EQ(tokens[100], 999);
}

TEST(Dataset, MetaJsonRoundTrips) {
  TempDir dir;
  DatasetMeta meta = make_synthetic_dataset(dir.path(), 100, 10, 64);
  meta.sources.push_back({"corpus/a.txt", "text", 1234, 7});
  meta.options = {{"seed", 3}};
  const DatasetMeta back = DatasetMeta::from_json(meta.to_json(), "meta.json");
  EXPECT_EQ(back.to_json(), meta.to_json());
  EXPECT_EQ(back.train.shards.size(), 2u);
  EXPECT_EQ(back.sources[0].documents, 7u);
}

TEST(Dataset, MetaJsonIsReadStrictly) {
  TempDir dir;
  const nlohmann::json good = make_synthetic_dataset(dir.path(), 100, 10, 64).to_json();
  nlohmann::json j = good;
  j["surprise"] = 1;
  expect_error([&] { DatasetMeta::from_json(j, "m.json"); }, {"m.json", "unknown key 'surprise'"});
  j = good;
  j.erase("vocab_size");
  expect_error([&] { DatasetMeta::from_json(j, "m.json"); },
               {"m.json", "missing key 'vocab_size'"});
  j = good;
  j["format_version"] = 99;
  expect_error([&] { DatasetMeta::from_json(j, "m.json"); }, {"m.json", "version 99"});
  j = good;
  j["splits"]["train"]["tokens"] = 5;
  expect_error([&] { DatasetMeta::from_json(j, "m.json"); }, {"m.json", "lists 5 tokens"});
  j = good;
  j["tokenizer"]["checksum"] = "xyz";
  expect_error([&] { DatasetMeta::from_json(j, "m.json"); }, {"m.json", "tokenizer.checksum"});
  j = good;
  j["format"] = "something-else";
  expect_error([&] { DatasetMeta::from_json(j, "m.json"); }, {"m.json", "something-else"});
}

TEST(Dataset, DirectoryWithoutMetaIsNotADataset) {
  TempDir dir;
  const Error e = expect_error([&] { Dataset d(dir.path()); },
                               {dir.path(), "not a prepared dataset"});
  EXPECT_TRUE(testing::contains(e.hint(), "foundry data prepare"));
  const Error missing = expect_error([&] { Dataset d(dir.file("nope")); }, {"does not exist"});
  EXPECT_TRUE(testing::contains(missing.hint(), "foundry data prepare"));
}

TEST(Dataset, ReplacedTokenizerIsDetected) {
  TempDir dir;
  make_synthetic_dataset(dir.path(), 100, 10, 64);
  write_file(dir.file(kTokenizerFileName), "another tokenizer");
  expect_error([&] { Dataset d(dir.path()); }, {dir.file(kTokenizerFileName), "checksum"});
  std::filesystem::remove(dir.file(kTokenizerFileName));
  expect_error([&] { Dataset d(dir.path()); }, {"has no tokenizer.model"});
}

TEST(Dataset, MissingOrForeignShardIsDetected) {
  TempDir dir;
  make_synthetic_dataset(dir.path(), 100, 10, 64);
  const std::string shard = dir.file("train_00001.bin");
  const std::string original = read_file(shard);

  std::filesystem::remove(shard);
  expect_error([&] { Dataset d(dir.path()); }, {"train_00001.bin", "missing"});

  // A valid shard written with a different tokenizer.
  {
    TokenShardWriter writer(shard, 65536, /*tokenizer_checksum=*/99);
    writer.append(std::vector<int32_t>(36, 5));
    writer.finish();
  }
  expect_error([&] { Dataset d(dir.path()); }, {shard, "tokenizer"});

  write_file(shard, original);
  EXPECT_NO_THROW(Dataset d(dir.path()));
  // A valid shard of this dataset's tokenizer, but not the one meta.json lists.
  const std::string first = read_file(dir.file("train_00000.bin"));
  write_file(shard, first);  // same tokenizer, different tokens and count
  expect_error([&] { Dataset d(dir.path()); }, {shard, "does not match meta.json"});

  // Corruption inside a shard surfaces with the shard's path.
  std::string corrupt = original;
  corrupt[corrupt.size() - 1] ^= 0x7f;
  write_file(shard, corrupt);
  expect_error([&] { Dataset d(dir.path()); }, {shard});
}

}  // namespace
}  // namespace foundry::data
