#include "data/shard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "base/hash.h"
#include "data/test_util.h"

namespace foundry::data {
namespace {

using testing::expect_error;
using testing::read_file;
using testing::TempDir;
using testing::write_file;

constexpr uint64_t kTokenizerChecksum = 0x0123456789abcdefULL;

std::vector<int32_t> pattern_ids(size_t count, uint32_t vocab) {
  std::vector<int32_t> ids(count);
  for (size_t i = 0; i < count; ++i) ids[i] = static_cast<int32_t>((i * 7919) % vocab);
  return ids;
}

// Builds shard bytes by hand: a header with correct checksums around any payload.
std::string craft_shard(const std::vector<uint16_t>& ids, uint32_t vocab, uint32_t version = 1) {
  std::string payload(ids.size() * 2, '\0');
  std::memcpy(payload.data(), ids.data(), payload.size());
  ShardHeader h;
  h.format_version = version;
  h.token_bytes = 2;
  h.token_count = ids.size();
  h.vocab_size = vocab;
  h.tokenizer_checksum = kTokenizerChecksum;
  h.payload_checksum = hash64(payload.data(), payload.size());
  uint8_t header[kShardHeaderBytes];
  encode_shard_header(h, header);
  return std::string(reinterpret_cast<char*>(header), kShardHeaderBytes) + payload;
}

std::string write_pattern_shard(const std::string& path, size_t count, uint32_t vocab) {
  TokenShardWriter writer(path, vocab, kTokenizerChecksum);
  const auto ids = pattern_ids(count, vocab);
  // Uneven appends, one larger than the writer's buffer.
  writer.append(ids.data(), std::min<size_t>(count, 3));
  if (count > 3) writer.append(ids.data() + 3, count - 3);
  writer.finish();
  return path;
}

TEST(TokenShard, RoundTripTwoByteTokens) {
  TempDir dir;
  const size_t count = 700'000;  // > 1 MiB of payload: crosses the writer's buffer
  write_pattern_shard(dir.file("a.bin"), count, 300);
  TokenShard shard(dir.file("a.bin"), kTokenizerChecksum);
  EXPECT_EQ(shard.header().token_bytes, 2u);
  EXPECT_EQ(shard.token_count(), count);
  EXPECT_EQ(shard.vocab_size(), 300u);
  EXPECT_EQ(shard.header().tokenizer_checksum, kTokenizerChecksum);
  EXPECT_EQ(std::filesystem::file_size(dir.file("a.bin")), kShardHeaderBytes + 2 * count);
  const auto expected = pattern_ids(count, 300);
  std::vector<int32_t> got(count);
  shard.copy_tokens(0, count, got.data());
  EXPECT_EQ(got, expected);
  EXPECT_EQ(shard.token(12345), expected[12345]);
  std::vector<int32_t> middle(10);
  shard.copy_tokens(500, 10, middle.data());
  EXPECT_TRUE(std::equal(middle.begin(), middle.end(), expected.begin() + 500));
}

TEST(TokenShard, RoundTripFourByteTokens) {
  TempDir dir;
  const uint32_t vocab = 70'000;  // does not fit 16 bits
  write_pattern_shard(dir.file("b.bin"), 1000, vocab);
  TokenShard shard(dir.file("b.bin"));
  EXPECT_EQ(shard.header().token_bytes, 4u);
  std::vector<int32_t> got(1000);
  shard.copy_tokens(0, 1000, got.data());
  EXPECT_EQ(got, pattern_ids(1000, vocab));
  EXPECT_EQ(token_bytes_for_vocab(65536), 2u);
  EXPECT_EQ(token_bytes_for_vocab(65537), 4u);
}

TEST(TokenShard, EmptyShardIsValid) {
  TempDir dir;
  TokenShardWriter writer(dir.file("e.bin"), 300, kTokenizerChecksum);
  writer.finish();
  TokenShard shard(dir.file("e.bin"));
  EXPECT_EQ(shard.token_count(), 0u);
}

TEST(TokenShardWriter, AbandonedWriterRemovesItsFile) {
  TempDir dir;
  {
    TokenShardWriter writer(dir.file("x.bin"), 300, kTokenizerChecksum);
    writer.append(pattern_ids(10, 300));
    EXPECT_TRUE(std::filesystem::exists(dir.file("x.bin")));
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.bin")));
}

TEST(TokenShardWriter, RejectsIdsOutsideTheVocabulary) {
  TempDir dir;
  TokenShardWriter writer(dir.file("x.bin"), 300, kTokenizerChecksum);
  expect_error([&] { writer.append(std::vector<int32_t>{1, 300}); }, {"internal check"});
  expect_error([&] { writer.append(std::vector<int32_t>{-1}); }, {"internal check"});
}

TEST(TokenShard, BadMagicNamesThePath) {
  TempDir dir;
  const std::string path = write_pattern_shard(dir.file("m.bin"), 100, 300);
  std::string bytes = read_file(path);
  bytes[0] = 'X';
  write_file(path, bytes);
  expect_error([&] { TokenShard s(path); }, {path, "bad magic"});
  // So is a file that is not a shard at all, or an unfinished one (zeros where the header goes).
  write_file(path, "hello, this is some text and not a shard at all............................");
  expect_error([&] { TokenShard s(path); }, {path, "bad magic"});
  write_file(path, std::string(200, '\0'));
  expect_error([&] { TokenShard s(path); }, {path, "bad magic"});
}

TEST(TokenShard, TruncatedFileNamesThePath) {
  TempDir dir;
  const std::string path = write_pattern_shard(dir.file("t.bin"), 100, 300);
  const std::string bytes = read_file(path);
  write_file(path, bytes.substr(0, bytes.size() - 2));  // one token short
  expect_error([&] { TokenShard s(path); }, {path, "truncated", "100 tokens"});
  write_file(path, bytes.substr(0, bytes.size() - 1));  // half a token short
  expect_error([&] { TokenShard s(path); }, {path, "truncated"});
  write_file(path, bytes.substr(0, 40));  // inside the header
  expect_error([&] { TokenShard s(path); }, {path, "truncated"});
  write_file(path, bytes.substr(0, 3));
  expect_error([&] { TokenShard s(path); }, {path, "truncated"});
  write_file(path, bytes + "zz");  // extra bytes are damage too
  expect_error([&] { TokenShard s(path); }, {path, "trailing"});
}

TEST(TokenShard, UnsupportedVersionNamesThePath) {
  TempDir dir;
  const std::string path = dir.file("v.bin");
  write_file(path, craft_shard({1, 2, 3}, 300, /*version=*/2));
  expect_error([&] { TokenShard s(path); }, {path, "format version 2"});
}

TEST(TokenShard, CorruptHeaderOrPayloadIsDetected) {
  TempDir dir;
  const std::string path = write_pattern_shard(dir.file("c.bin"), 100, 300);
  const std::string bytes = read_file(path);
  std::string bad_header = bytes;
  bad_header[24] ^= 1;  // vocab size
  write_file(path, bad_header);
  expect_error([&] { TokenShard s(path); }, {path, "header checksum"});
  std::string bad_payload = bytes;
  bad_payload[kShardHeaderBytes + 10] ^= 1;
  write_file(path, bad_payload);
  expect_error([&] { TokenShard s(path); }, {path, "token data checksum"});
}

TEST(TokenShard, IdNotBelowVocabularyNamesPathPositionAndId) {
  TempDir dir;
  const std::string path = dir.file("i.bin");
  write_file(path, craft_shard({5, 6, 7, 8, 9, 300, 10}, 300));
  expect_error([&] { TokenShard s(path); },
               {path, "token 300 at position 5", "vocabulary size 300"});
  write_file(path, craft_shard({5, 6, 65535}, 300));
  expect_error([&] { TokenShard s(path); }, {path, "token 65535 at position 2"});
  write_file(path, craft_shard({5, 6, 299}, 300));
  EXPECT_NO_THROW(TokenShard s(path));
}

TEST(TokenShard, TokenizerChecksumMismatchNamesThePath) {
  TempDir dir;
  const std::string path = write_pattern_shard(dir.file("k.bin"), 100, 300);
  EXPECT_NO_THROW(TokenShard s(path, kTokenizerChecksum));
  expect_error([&] { TokenShard s(path, 42); },
               {path, hash64_hex(kTokenizerChecksum), hash64_hex(42), "tokenizer"});
}

TEST(TokenShard, MissingFileNamesThePath) {
  TempDir dir;
  expect_error([&] { TokenShard s(dir.file("nope.bin")); }, {dir.file("nope.bin")});
}

}  // namespace
}  // namespace foundry::data
