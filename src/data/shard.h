// Token shards: a 64-byte header followed by raw little-endian token ids.
// The byte layout is documented in docs/formats.md; this file is its reference
// implementation. Readers map the file and validate everything once on open, so code that
// holds a TokenShard can index it without further checks.
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "base/hash.h"
#include "base/io.h"

namespace foundry::data {

inline constexpr char kShardMagic[8] = {'F', 'D', 'R', 'Y', 'T', 'O', 'K', '\0'};
inline constexpr uint32_t kShardFormatVersion = 1;
inline constexpr size_t kShardHeaderBytes = 64;

// The decoded header. `payload_checksum` is XXH3-64 of the token bytes after the header.
struct ShardHeader {
  uint32_t format_version = kShardFormatVersion;
  uint32_t token_bytes = 2;  // 2 (uint16 ids) or 4 (uint32 ids)
  uint64_t token_count = 0;
  uint32_t vocab_size = 0;
  uint64_t tokenizer_checksum = 0;  // XXH3-64 of the tokenizer.model bytes
  uint64_t payload_checksum = 0;
};

// 2 when every id of a vocabulary this size fits in 16 bits, else 4.
uint32_t token_bytes_for_vocab(uint32_t vocab_size);

// Streams tokens into a shard file. The header is written by finish(); until then the file
// starts with zeros, so an interrupted write is rejected by readers as "not a token shard".
// Destroying an unfinished writer deletes the file.
class TokenShardWriter {
 public:
  TokenShardWriter(std::string path, uint32_t vocab_size, uint64_t tokenizer_checksum);
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  // Appends ids; each must be in [0, vocab_size) (an internal check: ids come from the
  // tokenizer that defines the vocabulary).
  void append(const int32_t* ids, size_t count);
  void append(const std::vector<int32_t>& ids) { append(ids.data(), ids.size()); }

  // Writes the header, flushes and fsyncs, and closes the file. Returns the final header.
  ShardHeader finish();

  uint64_t token_count() const { return header_.token_count; }
  const std::string& path() const { return path_; }

 private:
  void flush_buffer();
  void close_and_remove();

  std::string path_;
  std::FILE* file_ = nullptr;
  ShardHeader header_;
  StreamingHash64 payload_hash_;  // over the token bytes
  std::vector<uint8_t> buffer_;
};

// A validated, memory-mapped shard. Opening checks, in order: the magic, that the header is
// complete, the format version, the header checksum, the token width and vocabulary size,
// that the file size matches the token count (truncation or trailing data), when
// `expected_tokenizer_checksum` is given that the shard was made with that tokenizer, the
// payload checksum, and that every id is below the vocabulary size. Every error names the
// shard path; an id error also gives its position and value.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path,
                      std::optional<uint64_t> expected_tokenizer_checksum = std::nullopt);

  const std::string& path() const { return file_.path(); }
  const ShardHeader& header() const { return header_; }
  uint64_t token_count() const { return header_.token_count; }
  uint32_t vocab_size() const { return header_.vocab_size; }

  int32_t token(uint64_t index) const;
  // Copies tokens [begin, begin + count) as int32; the range must lie inside the shard.
  void copy_tokens(uint64_t begin, uint64_t count, int32_t* out) const;

 private:
  MappedFile file_;
  ShardHeader header_;
  const uint8_t* tokens_ = nullptr;
};

// Encodes / decodes the 64-byte header (exposed for tests and tools).
void encode_shard_header(const ShardHeader& header, uint8_t out[kShardHeaderBytes]);

}  // namespace foundry::data
