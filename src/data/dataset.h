// A prepared dataset: a directory holding meta.json, tokenizer.model and token shards
// (train_00000.bin ..., val_00000.bin ...), written by `foundry data prepare`.
// meta.json is written last, so its presence marks a complete dataset.
// Layout and keys: docs/formats.md.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "data/shard.h"
#include "data/tokenizer.h"

namespace foundry::data {

inline constexpr uint32_t kDatasetFormatVersion = 1;
inline constexpr const char* kDatasetFormatName = "foundry-token-dataset";
inline constexpr const char* kMetaFileName = "meta.json";
inline constexpr const char* kTokenizerFileName = "tokenizer.model";

struct ShardInfo {
  std::string file;  // name relative to the dataset directory
  uint64_t tokens = 0;
  uint64_t checksum = 0;  // the shard's payload checksum
};

struct SplitInfo {
  uint64_t documents = 0;
  uint64_t tokens = 0;
  std::vector<ShardInfo> shards;
};

struct SourceInfo {
  std::string path;
  std::string format;  // "text" | "jsonl" | "json-array"
  uint64_t bytes = 0;
  uint64_t documents = 0;
};

// The contents of meta.json.
struct DatasetMeta {
  uint32_t format_version = kDatasetFormatVersion;
  uint32_t vocab_size = 0;
  uint32_t token_bytes = 2;
  uint64_t tokenizer_checksum = 0;
  std::string tokenizer_origin;  // "trained" or the path of the --tokenizer that was copied
  int32_t unk_id = -1, bos_id = -1, eos_id = -1;
  SplitInfo train, val;
  std::vector<SourceInfo> sources;
  nlohmann::json options = nlohmann::json::object();  // the prepare options, for the record

  nlohmann::json to_json() const;
  // Strict: unknown keys, wrong types and a foreign format are Errors naming `where`.
  static DatasetMeta from_json(const nlohmann::json& j, const std::string& where);
};

// One split of a dataset as one stream of tokens: its shards concatenated in order.
class TokenSplit {
 public:
  TokenSplit(std::string name, std::vector<TokenShard> shards, uint64_t documents);

  const std::string& name() const { return name_; }
  uint64_t token_count() const { return token_count_; }
  uint64_t document_count() const { return documents_; }
  const std::vector<TokenShard>& shards() const { return shards_; }
  // XXH3-64 over its shards' payload checksums in order: which tokens the split holds.
  uint64_t content_checksum() const;

  // Copies tokens [begin, begin + count) of the stream, across shard boundaries.
  void copy_tokens(uint64_t begin, uint64_t count, int32_t* out) const;

 private:
  std::string name_;
  std::vector<TokenShard> shards_;
  std::vector<uint64_t> shard_starts_;  // stream offset of each shard's first token
  uint64_t token_count_ = 0;
  uint64_t documents_ = 0;
};

// An opened dataset. Opening validates everything up front: meta.json, that tokenizer.model
// matches the checksum in meta.json, and every shard of both splits (see TokenShard), plus
// that each shard's token count and checksum agree with meta.json. A directory without
// meta.json is an Error telling the user to run `foundry data prepare`.
class Dataset {
 public:
  explicit Dataset(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const DatasetMeta& meta() const { return meta_; }
  uint32_t vocab_size() const { return meta_.vocab_size; }
  std::string tokenizer_path() const;
  Tokenizer load_tokenizer() const;

  const TokenSplit& train() const { return train_; }
  const TokenSplit& val() const { return val_; }
  // "train" or "val"; anything else is an Error.
  const TokenSplit& split(std::string_view name) const;

 private:
  std::string dir_;
  DatasetMeta meta_;
  TokenSplit train_, val_;
};

}  // namespace foundry::data
