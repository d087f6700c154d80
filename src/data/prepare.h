// `foundry data prepare`: raw text in, a prepared dataset directory out.
//
// 1. Read every input once: count documents, and keep a bounded sample of lines for the
//    tokenizer (the first max_sentences lines, then a reservoir sample with a fixed seed).
// 2. Train a BPE tokenizer on the sample, or load the given --tokenizer.
// 3. Read the inputs again and encode each document followed by the EOS id. Whole documents
//    go to the val split, chosen by seed: exactly round(val_fraction * documents) of them,
//    at least one when there are two or more documents and val_fraction > 0, never all.
//    Tokens are written to shards of at most shard_tokens tokens.
// Everything is written into a staging folder inside the output directory, moved into place
// on success, and meta.json is written last: a failed or interrupted run leaves no meta.json.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/corpus.h"
#include "data/dataset.h"

namespace foundry::data {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  int32_t vocab_size = 8192;      // ignored when tokenizer_path is set
  std::string tokenizer_path;     // reuse this tokenizer.model instead of training one
  InputFormat format = InputFormat::Auto;
  std::string jsonl_field = "text";
  double val_fraction = 0.01;     // in [0, 0.5]
  uint64_t seed = 1;              // chooses the val documents
  uint64_t shard_tokens = 100'000'000;
  int64_t max_sentences = 1'000'000;  // lines sampled for tokenizer training
  bool overwrite = false;         // replace a dataset already in out_dir
  bool allow_binary = false;      // read input that is not text (data/corpus.h, TextCheck)
  bool show_progress = true;      // progress lines on stderr
};

// Checks the options without touching the file system; errors name the flag.
void validate_prepare_options(const PrepareOptions& options);

// Runs the whole preparation and returns the meta.json that was written.
DatasetMeta prepare_dataset(const PrepareOptions& options);

}  // namespace foundry::data
