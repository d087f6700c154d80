#include "data/dataset.h"

#include <algorithm>
#include <filesystem>

#include "base/config_reader.h"
#include "base/error.h"
#include "base/hash.h"
#include "base/io.h"

namespace foundry::data {

namespace {

// The hint of a wrong type or value in meta.json: it is written by prepare, not by hand.
constexpr char kDamagedMetaHint[] = "meta.json is damaged; re-run foundry data prepare";

std::string join_path(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

uint64_t parse_checksum(const std::string& hex, const std::string& where, const std::string& key) {
  const bool valid = hex.size() == 16 && std::all_of(hex.begin(), hex.end(), [](char c) {
                       return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                     });
  if (!valid)
    fail(fmt::format("{}: '{}' = \"{}\" is not a checksum (16 lowercase hex digits)", where, key,
                     hex),
         "meta.json is damaged; re-run foundry data prepare");
  return std::stoull(hex, nullptr, 16);
}

// Reads a key that must be present (ConfigReader::get leaves defaults for absent keys).
template <typename T>
T required(ConfigReader& reader, const nlohmann::json& obj, const std::string& prefix,
           const std::string& key) {
  if (!obj.is_object() || !obj.contains(key))
    fail(fmt::format("{}: missing key '{}{}'", reader.where(), prefix, key),
         "meta.json is damaged or was not written by foundry data prepare; re-run it");
  T value{};
  reader.get(key, value);
  return value;
}

nlohmann::json split_to_json(const SplitInfo& split) {
  nlohmann::json shards = nlohmann::json::array();
  for (const ShardInfo& s : split.shards)
    shards.push_back(
        {{"file", s.file}, {"tokens", s.tokens}, {"checksum", hash64_hex(s.checksum)}});
  return {{"documents", split.documents}, {"tokens", split.tokens}, {"shards", shards}};
}

SplitInfo split_from_json(const nlohmann::json& j, const std::string& where,
                          const std::string& name) {
  const std::string prefix = "splits." + name + ".";
  ConfigReader reader(j, where, prefix, kDamagedMetaHint);
  SplitInfo split;
  split.documents = required<uint64_t>(reader, j, prefix, "documents");
  split.tokens = required<uint64_t>(reader, j, prefix, "tokens");
  const nlohmann::json& shards = reader.child("shards");
  if (!shards.is_array())
    fail(fmt::format("{}: '{}shards' must be an array", where, prefix),
         "meta.json is damaged; re-run foundry data prepare");
  uint64_t total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string shard_prefix = fmt::format("{}shards[{}].", prefix, i);
    ConfigReader shard_reader(shards[i], where, shard_prefix, kDamagedMetaHint);
    ShardInfo shard;
    shard.file = required<std::string>(shard_reader, shards[i], shard_prefix, "file");
    shard.tokens = required<uint64_t>(shard_reader, shards[i], shard_prefix, "tokens");
    shard.checksum = parse_checksum(
        required<std::string>(shard_reader, shards[i], shard_prefix, "checksum"), where,
        shard_prefix + "checksum");
    shard_reader.finish();
    if (shard.file.empty() || shard.file.find('/') != std::string::npos)
      fail(fmt::format("{}: '{}file' = \"{}\" must be a plain file name", where, shard_prefix,
                       shard.file),
           "shards live in the dataset directory; meta.json is damaged, re-run foundry data "
           "prepare");
    total += shard.tokens;
    split.shards.push_back(std::move(shard));
  }
  reader.finish();
  if (total != split.tokens)
    fail(fmt::format("{}: split '{}' lists {} tokens but its shards hold {}", where, name,
                     split.tokens, total),
         "meta.json is damaged; re-run foundry data prepare");
  return split;
}

// Reads meta.json and checks tokenizer.model against it.
DatasetMeta load_meta(const std::string& dir) {
  const std::string meta_path = join_path(dir, kMetaFileName);
  if (!path_exists(meta_path)) {
    if (!path_exists(dir))
      fail(fmt::format("dataset directory '{}' does not exist", dir),
           "run foundry data prepare --input <text> --out <dir> first");
    fail(fmt::format("'{}' is not a prepared dataset (it has no {})", dir, kMetaFileName),
         "run foundry data prepare --input <text> --out <dir> first; a prepare that failed or "
         "was interrupted leaves no meta.json");
  }
  DatasetMeta meta = DatasetMeta::from_json(load_json_file(meta_path), meta_path);

  const std::string tokenizer_path = join_path(dir, kTokenizerFileName);
  if (!path_exists(tokenizer_path))
    fail(fmt::format("dataset '{}' has no {}", dir, kTokenizerFileName),
         "the dataset is incomplete; re-run foundry data prepare");
  const std::string model_bytes = read_text_file(tokenizer_path);
  const uint64_t checksum = hash64(model_bytes.data(), model_bytes.size());
  if (checksum != meta.tokenizer_checksum)
    fail(fmt::format("'{}' has checksum {} but {} expects {}", tokenizer_path, hash64_hex(checksum),
                     meta_path, hash64_hex(meta.tokenizer_checksum)),
         "the tokenizer was replaced after the data was prepared; restore it or re-run "
         "foundry data prepare");
  return meta;
}

TokenSplit open_split(const std::string& dir, const DatasetMeta& meta, const std::string& name) {
  const SplitInfo& info = name == "train" ? meta.train : meta.val;
  std::vector<TokenShard> shards;
  shards.reserve(info.shards.size());
  for (const ShardInfo& s : info.shards) {
    const std::string path = join_path(dir, s.file);
    if (!path_exists(path))
      fail(fmt::format("dataset '{}' lists shard '{}' but the file is missing", dir, s.file),
           "the dataset is incomplete; re-run foundry data prepare");
    TokenShard shard(path, meta.tokenizer_checksum);
    if (shard.token_count() != s.tokens || shard.header().payload_checksum != s.checksum ||
        shard.vocab_size() != meta.vocab_size)
      fail(fmt::format("token shard '{}' (tokens {}, checksum {}, vocab {}) does not match {} "
                       "(tokens {}, checksum {}, vocab {})",
                       path, shard.token_count(), hash64_hex(shard.header().payload_checksum),
                       shard.vocab_size(), kMetaFileName, s.tokens, hash64_hex(s.checksum),
                       meta.vocab_size),
           "the shard was replaced after the data was prepared; re-run foundry data prepare");
    shards.push_back(std::move(shard));
  }
  return TokenSplit(name, std::move(shards), info.documents);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// meta.json

nlohmann::json DatasetMeta::to_json() const {
  nlohmann::json sources_json = nlohmann::json::array();
  for (const SourceInfo& s : sources)
    sources_json.push_back(
        {{"path", s.path}, {"format", s.format}, {"bytes", s.bytes}, {"documents", s.documents}});
  return {
      {"format", kDatasetFormatName},
      {"format_version", format_version},
      {"vocab_size", vocab_size},
      {"token_bytes", token_bytes},
      {"document_separator", "eos"},
      {"tokenizer",
       {{"file", kTokenizerFileName},
        {"type", "sentencepiece"},
        {"checksum", hash64_hex(tokenizer_checksum)},
        {"origin", tokenizer_origin},
        {"unk_id", unk_id},
        {"bos_id", bos_id},
        {"eos_id", eos_id}}},
      {"splits", {{"train", split_to_json(train)}, {"val", split_to_json(val)}}},
      {"sources", sources_json},
      {"options", options},
  };
}

DatasetMeta DatasetMeta::from_json(const nlohmann::json& j, const std::string& where) {
  ConfigReader reader(j, where, "", kDamagedMetaHint);
  const std::string format = required<std::string>(reader, j, "", "format");
  if (format != kDatasetFormatName)
    fail(fmt::format("{}: 'format' is \"{}\", expected \"{}\"", where, format, kDatasetFormatName),
         "this file is not the meta.json of a prepared dataset");
  DatasetMeta meta;
  meta.format_version = required<uint32_t>(reader, j, "", "format_version");
  if (meta.format_version != kDatasetFormatVersion)
    fail(fmt::format("{}: dataset format version {} is not supported (this build reads {})", where,
                     meta.format_version, kDatasetFormatVersion),
         "prepare the dataset again with this version of foundry");
  meta.vocab_size = required<uint32_t>(reader, j, "", "vocab_size");
  meta.token_bytes = required<uint32_t>(reader, j, "", "token_bytes");
  if (meta.vocab_size == 0 || meta.token_bytes != token_bytes_for_vocab(meta.vocab_size))
    fail(fmt::format("{}: vocab_size {} and token_bytes {} do not go together", where,
                     meta.vocab_size, meta.token_bytes),
         "meta.json is damaged; re-run foundry data prepare");
  const std::string separator = required<std::string>(reader, j, "", "document_separator");
  if (separator != "eos")
    fail(fmt::format("{}: 'document_separator' = \"{}\" is not supported (expected \"eos\")",
                     where, separator),
         "meta.json is damaged or was not written by foundry data prepare; re-run it");

  const nlohmann::json& tok = reader.child("tokenizer");
  ConfigReader tok_reader(tok, where, "tokenizer.", kDamagedMetaHint);
  const std::string file = required<std::string>(tok_reader, tok, "tokenizer.", "file");
  if (file != kTokenizerFileName)
    fail(fmt::format("{}: 'tokenizer.file' = \"{}\", expected \"{}\"", where, file,
                     kTokenizerFileName),
         "meta.json is damaged or was not written by foundry data prepare; re-run it");
  required<std::string>(tok_reader, tok, "tokenizer.", "type");
  meta.tokenizer_checksum =
      parse_checksum(required<std::string>(tok_reader, tok, "tokenizer.", "checksum"), where,
                     "tokenizer.checksum");
  meta.tokenizer_origin = required<std::string>(tok_reader, tok, "tokenizer.", "origin");
  meta.unk_id = required<int32_t>(tok_reader, tok, "tokenizer.", "unk_id");
  meta.bos_id = required<int32_t>(tok_reader, tok, "tokenizer.", "bos_id");
  meta.eos_id = required<int32_t>(tok_reader, tok, "tokenizer.", "eos_id");
  tok_reader.finish();

  const nlohmann::json& splits = reader.child("splits");
  ConfigReader splits_reader(splits, where, "splits.", kDamagedMetaHint);
  meta.train = split_from_json(splits_reader.child("train"), where, "train");
  meta.val = split_from_json(splits_reader.child("val"), where, "val");
  splits_reader.finish();

  const nlohmann::json& sources = reader.child("sources");
  if (!sources.is_array())
    fail(fmt::format("{}: 'sources' must be an array", where),
         "meta.json is damaged; re-run foundry data prepare");
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::string prefix = fmt::format("sources[{}].", i);
    ConfigReader source_reader(sources[i], where, prefix, kDamagedMetaHint);
    SourceInfo s;
    s.path = required<std::string>(source_reader, sources[i], prefix, "path");
    s.format = required<std::string>(source_reader, sources[i], prefix, "format");
    s.bytes = required<uint64_t>(source_reader, sources[i], prefix, "bytes");
    s.documents = required<uint64_t>(source_reader, sources[i], prefix, "documents");
    source_reader.finish();
    meta.sources.push_back(std::move(s));
  }
  meta.options = reader.child("options");
  reader.finish();
  return meta;
}

// ---------------------------------------------------------------------------------------------
// TokenSplit

TokenSplit::TokenSplit(std::string name, std::vector<TokenShard> shards, uint64_t documents)
    : name_(std::move(name)), shards_(std::move(shards)), documents_(documents) {
  for (const TokenShard& shard : shards_) {
    shard_starts_.push_back(token_count_);
    token_count_ += shard.token_count();
  }
}

uint64_t TokenSplit::content_checksum() const {
  std::vector<uint64_t> sums;
  for (const TokenShard& shard : shards_) sums.push_back(shard.header().payload_checksum);
  return hash64(sums.data(), sums.size() * sizeof(uint64_t));
}

void TokenSplit::copy_tokens(uint64_t begin, uint64_t count, int32_t* out) const {
  FOUNDRY_CHECK(begin <= token_count_ && count <= token_count_ - begin);
  // The last shard starting at or before `begin`.
  size_t shard = static_cast<size_t>(
      std::upper_bound(shard_starts_.begin(), shard_starts_.end(), begin) - shard_starts_.begin());
  shard = shard == 0 ? 0 : shard - 1;
  while (count > 0) {
    const uint64_t offset = begin - shard_starts_[shard];
    const uint64_t n = std::min(count, shards_[shard].token_count() - offset);
    shards_[shard].copy_tokens(offset, n, out);
    out += n;
    begin += n;
    count -= n;
    ++shard;
  }
}

// ---------------------------------------------------------------------------------------------
// Dataset

Dataset::Dataset(const std::string& dir)
    : dir_(dir),
      meta_(load_meta(dir)),
      train_(open_split(dir, meta_, "train")),
      val_(open_split(dir, meta_, "val")) {}

std::string Dataset::tokenizer_path() const { return join_path(dir_, kTokenizerFileName); }

Tokenizer Dataset::load_tokenizer() const { return Tokenizer::load(tokenizer_path()); }

const TokenSplit& Dataset::split(std::string_view name) const {
  if (name == "train") return train_;
  if (name == "val") return val_;
  fail(fmt::format("unknown dataset split '{}'", name), "use \"train\" or \"val\"");
}

}  // namespace foundry::data
