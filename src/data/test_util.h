// Helpers shared by the data layer's tests: temporary directories (base/test_temp_dir.h), small
// files, and an assertion that a call fails with a message containing given fragments.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/rng.h"
#include "base/test_temp_dir.h"
#include "data/dataset.h"

namespace foundry::testing {

inline void write_file(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs `call`, which must throw foundry::Error whose message contains every fragment in
// `what`; returns the error (what + hint) for further checks.
inline foundry::Error expect_error(const std::function<void()>& call,
                                   std::initializer_list<std::string> what) {
  try {
    call();
  } catch (const foundry::Error& e) {
    const std::string message = e.what();
    for (const std::string& fragment : what)
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message \"" << message << "\" lacks \"" << fragment << "\"";
    return e;
  }
  ADD_FAILURE() << "expected a foundry::Error";
  return foundry::Error("no error");
}

inline bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

// Deterministic English-like sentences over a small alphabet (lowercase letters, space, '.'),
// so a tokenizer with a few hundred entries can cover them.
inline std::vector<std::string> generated_sentences(size_t count, uint64_t seed) {
  static const std::vector<std::string> words = {
      "the", "expert", "router", "sends", "each", "token", "to", "a", "small", "set", "of",
      "experts", "and", "model", "learns", "which", "one", "fits", "best", "when", "data",
      "flows", "through", "layers", "training", "runs", "on", "many", "cores", "with", "care"};
  Rng rng(seed);
  std::vector<std::string> sentences;
  for (size_t i = 0; i < count; ++i) {
    std::string s;
    const size_t length = 4 + rng.below(10);
    for (size_t w = 0; w < length; ++w) s += (w ? " " : "") + words[rng.below(words.size())];
    sentences.push_back(s + ".");
  }
  return sentences;
}

// Writes a dataset without a real tokenizer: token i of each split is i % vocab_size, so a
// token's value tells where it came from. tokenizer.model holds placeholder bytes (Dataset
// only checks their checksum).
inline data::DatasetMeta make_synthetic_dataset(const std::string& dir, uint64_t train_tokens,
                                                uint64_t val_tokens, uint64_t shard_tokens,
                                                uint32_t vocab_size = 65536) {
  const std::string tokenizer_bytes = "placeholder tokenizer model";
  write_file(dir + "/" + data::kTokenizerFileName, tokenizer_bytes);
  data::DatasetMeta meta;
  meta.vocab_size = vocab_size;
  meta.token_bytes = data::token_bytes_for_vocab(vocab_size);
  meta.tokenizer_checksum = hash64(tokenizer_bytes.data(), tokenizer_bytes.size());
  meta.tokenizer_origin = "trained";
  meta.unk_id = 0;
  meta.bos_id = 1;
  meta.eos_id = 2;
  auto write_split = [&](const std::string& name, uint64_t tokens, data::SplitInfo& info) {
    info.documents = 1;
    uint64_t next = 0;
    do {
      const std::string file = fmt::format("{}_{:05d}.bin", name, info.shards.size());
      data::TokenShardWriter writer(dir + "/" + file, vocab_size, meta.tokenizer_checksum);
      const uint64_t end = std::min(tokens, next + shard_tokens);
      for (; next < end; ++next) {
        const int32_t id = static_cast<int32_t>(next % vocab_size);
        writer.append(&id, 1);
      }
      const data::ShardHeader header = writer.finish();
      info.shards.push_back({file, header.token_count, header.payload_checksum});
      info.tokens += header.token_count;
    } while (next < tokens);
  };
  write_split("train", train_tokens, meta.train);
  write_split("val", val_tokens, meta.val);
  write_file(dir + "/" + data::kMetaFileName, meta.to_json().dump(2));
  return meta;
}

}  // namespace foundry::testing
