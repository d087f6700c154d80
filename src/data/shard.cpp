#include "data/shard.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "base/error.h"
#include "base/hash.h"

namespace foundry::data {

static_assert(std::endian::native == std::endian::little,
              "token shards store little-endian ids and are read in place");

namespace {

// Header field offsets; see docs/formats.md.
constexpr size_t kMagicAt = 0;
constexpr size_t kVersionAt = 8;
constexpr size_t kTokenBytesAt = 12;
constexpr size_t kTokenCountAt = 16;
constexpr size_t kVocabSizeAt = 24;
constexpr size_t kTokenizerChecksumAt = 32;
constexpr size_t kPayloadChecksumAt = 40;
constexpr size_t kHeaderChecksumAt = 56;

constexpr size_t kWriteBufferBytes = 1 << 20;

template <typename T>
void put(uint8_t* out, size_t at, T value) {
  std::memcpy(out + at, &value, sizeof(T));
}

template <typename T>
T get(const uint8_t* in, size_t at) {
  T value;
  std::memcpy(&value, in + at, sizeof(T));
  return value;
}

[[noreturn]] void fail_io(const std::string& action, const std::string& path) {
  const int err = errno;
  fail(fmt::format("cannot {} token shard '{}': {}", action, path, std::strerror(err)),
       io_error_hint(err, path, "check free space and permissions of the output directory"));
}

[[noreturn]] void fail_corrupt(const std::string& path, const std::string& problem) {
  fail(fmt::format("token shard '{}': {}", path, problem),
       "the dataset is damaged or incomplete; re-run foundry data prepare");
}

// The index of the first id >= vocab_size, or `count` if there is none. Blocks are checked
// with a branch-free maximum (which vectorizes); only a failing block is searched.
template <typename T>
uint64_t first_id_not_below(const uint8_t* tokens, uint64_t count, uint32_t vocab_size) {
  constexpr uint64_t kBlock = 4096;
  for (uint64_t begin = 0; begin < count; begin += kBlock) {
    const uint64_t end = std::min(count, begin + kBlock);
    T block_max = 0;
    for (uint64_t i = begin; i < end; ++i)
      block_max = std::max(block_max, get<T>(tokens, i * sizeof(T)));
    if (block_max < vocab_size) continue;
    for (uint64_t i = begin; i < end; ++i)
      if (get<T>(tokens, i * sizeof(T)) >= vocab_size) return i;
  }
  return count;
}

}  // namespace

uint32_t token_bytes_for_vocab(uint32_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

void encode_shard_header(const ShardHeader& h, uint8_t out[kShardHeaderBytes]) {
  std::memset(out, 0, kShardHeaderBytes);
  std::memcpy(out + kMagicAt, kShardMagic, sizeof(kShardMagic));
  put<uint32_t>(out, kVersionAt, h.format_version);
  put<uint32_t>(out, kTokenBytesAt, h.token_bytes);
  put<uint64_t>(out, kTokenCountAt, h.token_count);
  put<uint32_t>(out, kVocabSizeAt, h.vocab_size);
  put<uint64_t>(out, kTokenizerChecksumAt, h.tokenizer_checksum);
  put<uint64_t>(out, kPayloadChecksumAt, h.payload_checksum);
  put<uint64_t>(out, kHeaderChecksumAt, hash64(out, kHeaderChecksumAt));
}

// ---------------------------------------------------------------------------------------------
// Writer

TokenShardWriter::TokenShardWriter(std::string path, uint32_t vocab_size,
                                   uint64_t tokenizer_checksum)
    : path_(std::move(path)) {
  FOUNDRY_CHECK(vocab_size > 0);
  header_.token_bytes = token_bytes_for_vocab(vocab_size);
  header_.vocab_size = vocab_size;
  header_.tokenizer_checksum = tokenizer_checksum;
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) fail_io("create", path_);
  const uint8_t placeholder_header[kShardHeaderBytes] = {};  // rewritten by finish()
  if (std::fwrite(placeholder_header, 1, kShardHeaderBytes, file_) != kShardHeaderBytes) {
    int saved = errno;
    close_and_remove();
    errno = saved;
    fail_io("write", path_);
  }
  buffer_.reserve(kWriteBufferBytes);
}

TokenShardWriter::~TokenShardWriter() {
  if (file_) close_and_remove();
}

void TokenShardWriter::close_and_remove() {
  std::fclose(file_);
  file_ = nullptr;
  ::unlink(path_.c_str());
}

void TokenShardWriter::append(const int32_t* ids, size_t count) {
  FOUNDRY_CHECK(file_ != nullptr);
  const size_t width = header_.token_bytes;
  size_t done = 0;
  while (done < count) {
    size_t room = (kWriteBufferBytes - buffer_.size()) / width;
    if (room == 0) {
      flush_buffer();
      continue;
    }
    const size_t n = std::min(room, count - done);
    buffer_.resize(buffer_.size() + n * width);
    uint8_t* out = buffer_.data() + buffer_.size() - n * width;
    for (size_t i = 0; i < n; ++i) {
      const int32_t id = ids[done + i];
      FOUNDRY_CHECK(id >= 0 && static_cast<uint32_t>(id) < header_.vocab_size);
      if (width == 2) put<uint16_t>(out, i * 2, static_cast<uint16_t>(id));
      else put<uint32_t>(out, i * 4, static_cast<uint32_t>(id));
    }
    done += n;
  }
  header_.token_count += count;
}

void TokenShardWriter::flush_buffer() {
  if (buffer_.empty()) return;
  payload_hash_.update(buffer_.data(), buffer_.size());
  if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
    int saved = errno;
    close_and_remove();
    errno = saved;
    fail_io("write", path_);
  }
  buffer_.clear();
}

ShardHeader TokenShardWriter::finish() {
  FOUNDRY_CHECK(file_ != nullptr);
  flush_buffer();
  header_.payload_checksum = payload_hash_.digest();
  uint8_t bytes[kShardHeaderBytes];
  encode_shard_header(header_, bytes);
  bool ok = std::fseek(file_, 0, SEEK_SET) == 0 &&
            std::fwrite(bytes, 1, kShardHeaderBytes, file_) == kShardHeaderBytes &&
            std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  if (!ok) {
    int saved = errno;
    close_and_remove();
    errno = saved;
    fail_io("finish", path_);
  }
  if (std::fclose(file_) != 0) {
    file_ = nullptr;
    ::unlink(path_.c_str());
    fail_io("close", path_);
  }
  file_ = nullptr;
  return header_;
}

// ---------------------------------------------------------------------------------------------
// Reader

TokenShard::TokenShard(const std::string& path, std::optional<uint64_t> expected_tokenizer_checksum)
    : file_(path) {
  const uint8_t* bytes = file_.data();
  const size_t size = file_.size();
  if (size < sizeof(kShardMagic))
    fail_corrupt(path, fmt::format("truncated: the file has {} bytes but a shard header needs {}",
                                   size, kShardHeaderBytes));
  if (std::memcmp(bytes + kMagicAt, kShardMagic, sizeof(kShardMagic)) != 0)
    fail(fmt::format("'{}' is not a Foundry token shard (bad magic)", path),
         "token shards are written by foundry data prepare; an interrupted write also leaves "
         "this state, so re-run it");
  if (size < kShardHeaderBytes)
    fail_corrupt(path, fmt::format("truncated: the file has {} bytes but a shard header needs {}",
                                   size, kShardHeaderBytes));

  header_.format_version = get<uint32_t>(bytes, kVersionAt);
  if (header_.format_version != kShardFormatVersion)
    fail(fmt::format("token shard '{}' has format version {}, this build reads version {}", path,
                     header_.format_version, kShardFormatVersion),
         "prepare the dataset again with this version of foundry");
  if (get<uint64_t>(bytes, kHeaderChecksumAt) != hash64(bytes, kHeaderChecksumAt))
    fail_corrupt(path, "the header checksum does not match (corrupt header)");

  header_.token_bytes = get<uint32_t>(bytes, kTokenBytesAt);
  header_.token_count = get<uint64_t>(bytes, kTokenCountAt);
  header_.vocab_size = get<uint32_t>(bytes, kVocabSizeAt);
  header_.tokenizer_checksum = get<uint64_t>(bytes, kTokenizerChecksumAt);
  header_.payload_checksum = get<uint64_t>(bytes, kPayloadChecksumAt);
  if (header_.token_bytes != 2 && header_.token_bytes != 4)
    fail_corrupt(path, fmt::format("token width {} bytes is not 2 or 4", header_.token_bytes));
  if (header_.vocab_size == 0 || header_.vocab_size > static_cast<uint32_t>(INT32_MAX) ||
      (header_.token_bytes == 2 && header_.vocab_size > 65536))
    fail_corrupt(path, fmt::format("vocabulary size {} does not fit {}-byte tokens",
                                   header_.vocab_size, header_.token_bytes));

  const uint64_t payload_bytes = size - kShardHeaderBytes;
  const uint64_t available_tokens = payload_bytes / header_.token_bytes;
  if (header_.token_count > available_tokens || payload_bytes % header_.token_bytes != 0)
    fail_corrupt(path, fmt::format("truncated: the header says {} tokens ({} bytes) but the file "
                                   "holds {} bytes after the header",
                                   header_.token_count,
                                   header_.token_count * header_.token_bytes, payload_bytes));
  if (header_.token_count < available_tokens)
    fail_corrupt(path, fmt::format("the header says {} tokens but the file holds {} "
                                   "(unexpected trailing data)",
                                   header_.token_count, available_tokens));

  if (expected_tokenizer_checksum && *expected_tokenizer_checksum != header_.tokenizer_checksum)
    fail(fmt::format(
             "token shard '{}' was made with tokenizer {} but the dataset's tokenizer is {}", path,
             hash64_hex(header_.tokenizer_checksum), hash64_hex(*expected_tokenizer_checksum)),
         "the shard belongs to a different dataset; re-run foundry data prepare");

  tokens_ = bytes + kShardHeaderBytes;
  if (hash64(tokens_, payload_bytes) != header_.payload_checksum)
    fail_corrupt(path, "the token data checksum does not match (corrupt data)");

  // One pass over the ids: everything downstream may index embeddings with them unchecked.
  const uint64_t bad =
      header_.token_bytes == 2
          ? first_id_not_below<uint16_t>(tokens_, header_.token_count, header_.vocab_size)
          : first_id_not_below<uint32_t>(tokens_, header_.token_count, header_.vocab_size);
  if (bad < header_.token_count)
    fail_corrupt(path, fmt::format("token {} at position {} is not below the vocabulary size {}",
                                   static_cast<uint32_t>(token(bad)), bad, header_.vocab_size));
}

int32_t TokenShard::token(uint64_t index) const {
  if (header_.token_bytes == 2) return get<uint16_t>(tokens_, index * 2);
  return static_cast<int32_t>(get<uint32_t>(tokens_, index * 4));
}

void TokenShard::copy_tokens(uint64_t begin, uint64_t count, int32_t* out) const {
  FOUNDRY_CHECK(begin <= header_.token_count && count <= header_.token_count - begin);
  if (header_.token_bytes == 4) {
    std::memcpy(out, tokens_ + begin * 4, count * 4);
    return;
  }
  for (uint64_t i = 0; i < count; ++i) out[i] = get<uint16_t>(tokens_, (begin + i) * 2);
}

}  // namespace foundry::data
