#include "data/prepare.h"

#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <filesystem>

#include "base/hash.h"
#include "data/loader.h"
#include "data/test_util.h"

namespace foundry::data {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;
using testing::generated_sentences;
using testing::read_file;
using testing::TempDir;
using testing::write_file;

std::string join_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& l : lines) text += l + "\n";
  return text;
}

// The documents of a split, recovered by decoding and cutting at EOS.
std::vector<std::string> decoded_documents(const Dataset& dataset, const TokenSplit& split) {
  const Tokenizer tokenizer = dataset.load_tokenizer();
  std::vector<int32_t> tokens(split.token_count());
  split.copy_tokens(0, tokens.size(), tokens.data());
  std::vector<std::string> docs;
  std::vector<int32_t> current;
  for (int32_t id : tokens) {
    if (id == tokenizer.eos_id()) {
      docs.push_back(tokenizer.decode(current));
      current.clear();
    } else {
      current.push_back(id);
    }
  }
  EXPECT_TRUE(current.empty()) << "every document ends with EOS";
  return docs;
}

std::vector<std::string> directory_listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class Prepare : public ::testing::Test {
 protected:
  void SetUp() override {
    documents_ = generated_sentences(300, 11);
    write_file(dir_.file("corpus/a.txt"),
               join_lines({documents_.begin(), documents_.begin() + 200}));
    nlohmann::json array(std::vector<std::string>(documents_.begin() + 200, documents_.end()));
    write_file(dir_.file("corpus/b.json"), array.dump());
  }
  PrepareOptions options(const std::string& out) const {
    PrepareOptions o;
    o.inputs = {dir_.file("corpus")};
    o.out_dir = dir_.file(out);
    o.vocab_size = 300;
    o.val_fraction = 0.05;
    o.seed = 17;
    o.shard_tokens = 1000;
    o.show_progress = false;
    return o;
  }
  TempDir dir_;
  std::vector<std::string> documents_;
};

TEST_F(Prepare, WritesACompleteDatasetThatDecodesToTheInput) {
  const DatasetMeta meta = prepare_dataset(options("out"));
  EXPECT_EQ(meta.vocab_size, 300u);
  EXPECT_EQ(meta.train.documents + meta.val.documents, 300u);
  EXPECT_EQ(meta.val.documents, 15u);  // round(0.05 * 300)
  EXPECT_GT(meta.train.shards.size(), 1u);
  EXPECT_EQ(meta.val.shards.front().file, "val_00000.bin");
  ASSERT_EQ(meta.sources.size(), 2u);
  EXPECT_EQ(meta.sources[0].format, "text");
  EXPECT_EQ(meta.sources[1].format, "json-array");
  EXPECT_EQ(meta.sources[1].documents, 100u);

  const auto files = directory_listing(dir_.file("out"));
  EXPECT_TRUE(std::find(files.begin(), files.end(), "meta.json") != files.end());
  EXPECT_TRUE(std::find(files.begin(), files.end(), "tokenizer.model") != files.end());
  EXPECT_EQ(files.size(), 2 + meta.train.shards.size() + meta.val.shards.size())
      << "no staging or temporary files left";

  Dataset dataset(dir_.file("out"));
  EXPECT_EQ(dataset.meta().to_json(), meta.to_json());
  // Train and val partition the documents, each keeping input order.
  const auto train = decoded_documents(dataset, dataset.train());
  const auto val = decoded_documents(dataset, dataset.val());
  EXPECT_EQ(train.size() + val.size(), documents_.size());
  size_t t = 0, v = 0;
  for (const std::string& doc : documents_) {
    if (t < train.size() && train[t] == doc) ++t;
    else if (v < val.size() && val[v] == doc) ++v;
    else FAIL() << "document \"" << doc << "\" is missing or out of order";
  }
}

TEST_F(Prepare, SameInputSameBytesAndTheSeedPicksValidation) {
  const DatasetMeta a = prepare_dataset(options("a"));
  const DatasetMeta b = prepare_dataset(options("b"));
  for (const auto& name : directory_listing(dir_.file("a"))) {
    if (name == "meta.json") continue;
    EXPECT_EQ(read_file(dir_.file("a/" + name)), read_file(dir_.file("b/" + name))) << name;
  }

  PrepareOptions other_seed = options("c");
  other_seed.seed = 18;
  const DatasetMeta c = prepare_dataset(other_seed);
  EXPECT_EQ(c.tokenizer_checksum, a.tokenizer_checksum) << "the tokenizer ignores the seed";
  EXPECT_EQ(c.val.documents, a.val.documents);
  EXPECT_NE(c.val.shards[0].checksum, a.val.shards[0].checksum) << "other documents held out";
}

TEST_F(Prepare, ReusesAGivenTokenizer) {
  const DatasetMeta first = prepare_dataset(options("first"));
  PrepareOptions reuse = options("second");
  reuse.tokenizer_path = dir_.file("first/tokenizer.model");
  reuse.vocab_size = 5;  // ignored
  const DatasetMeta second = prepare_dataset(reuse);
  EXPECT_EQ(second.tokenizer_checksum, first.tokenizer_checksum);
  EXPECT_EQ(second.tokenizer_origin, reuse.tokenizer_path);
  // The record names the tokenizer reused, not the training's unused vocabulary size.
  EXPECT_EQ(second.options.value("tokenizer", ""), reuse.tokenizer_path);
  EXPECT_FALSE(second.options.contains("vocab_size"));
  EXPECT_EQ(first.options.value("vocab_size", 0), options("first").vocab_size);
  EXPECT_EQ(read_file(dir_.file("second/train_00000.bin")),
            read_file(dir_.file("first/train_00000.bin")));

  write_file(dir_.file("junk.model"), "not a model at all");
  reuse.out_dir = dir_.file("third");
  reuse.tokenizer_path = dir_.file("junk.model");
  expect_error([&] { prepare_dataset(reuse); }, {dir_.file("junk.model"), "not a valid"});
  EXPECT_FALSE(fs::exists(dir_.file("third")));
  reuse.tokenizer_path = dir_.file("missing.model");
  expect_error([&] { prepare_dataset(reuse); }, {dir_.file("missing.model"), "does not exist"});
}

// A tokenizer of another origin that normalizes text and has no byte fallback: prepare says
// that it does not give text back as written, and counts the <unk> tokens; Foundry's own says
// nothing.
TEST_F(Prepare, ALossyGivenTokenizerIsWarnedAbout) {
  const std::string prefix = dir_.file("lossy");
  std::string text;
  for (const std::string& d : documents_) text += d + "\n";
  write_file(dir_.file("lossy.txt"), text);
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + dir_.file("lossy.txt") + " --model_prefix=" + prefix +
      " --vocab_size=120 --model_type=bpe --normalization_rule_name=nmt_nfkc --byte_fallback=false"
      " --character_coverage=0.99 --minloglevel=2 --num_threads=1 --eos_id=2 --bos_id=1"
      " --unk_id=0");
  ASSERT_TRUE(status.ok()) << status.ToString();
  write_file(dir_.file("corpus/c.txt"), "a line with \u2603 and \ufb01\n");
  PrepareOptions o = options("lossy-out");
  o.tokenizer_path = prefix + ".model";
  ::testing::internal::CaptureStderr();
  prepare_dataset(o);
  const std::string lossy = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(lossy.find("does not give text back as written"), std::string::npos) << lossy;
  EXPECT_NE(lossy.find("tokens are <unk> (id 0)"), std::string::npos) << lossy;

  ::testing::internal::CaptureStderr();
  prepare_dataset(options("own"));
  PrepareOptions reuse = options("own-again");
  reuse.tokenizer_path = dir_.file("own/tokenizer.model");
  prepare_dataset(reuse);
  const std::string own = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(own.find("warning"), std::string::npos) << own;
}

TEST_F(Prepare, FailureLeavesNoDataset) {
  // The error surfaces in the second file, after the first was read.
  write_file(dir_.file("corpus/c.jsonl"), "{\"text\": \"fine\"}\n{\"text\": oops}\n");
  expect_error([&] { prepare_dataset(options("new/deeper/ds")); },
               {dir_.file("corpus/c.jsonl") + ":2:"});
  EXPECT_FALSE(fs::exists(dir_.file("new"))) << "the directories this run created are removed";

  fs::create_directories(dir_.file("existing"));
  expect_error([&] { prepare_dataset(options("existing")); }, {"c.jsonl:2:"});
  EXPECT_TRUE(directory_listing(dir_.file("existing")).empty()) << "no staging files left";

  fs::remove(dir_.file("corpus/c.jsonl"));
  PrepareOptions small_vocab = options("existing");
  small_vocab.vocab_size = 100;
  const Error e = expect_error([&] { prepare_dataset(small_vocab); }, {"too small"});
  EXPECT_TRUE(testing::contains(e.hint(), "--vocab-size"));
  EXPECT_TRUE(directory_listing(dir_.file("existing")).empty());
}

TEST_F(Prepare, RefusesToClobberWithoutOverwrite) {
  prepare_dataset(options("out"));
  expect_error([&] { prepare_dataset(options("out")); }, {"already holds a prepared dataset"});
  PrepareOptions again = options("out");
  again.overwrite = true;
  again.shard_tokens = 100'000;  // fewer shards than before: old ones must go
  const DatasetMeta meta = prepare_dataset(again);
  EXPECT_EQ(meta.train.shards.size(), 1u);
  EXPECT_EQ(directory_listing(dir_.file("out")),
            (std::vector<std::string>{"meta.json", "tokenizer.model", "train_00000.bin",
                                      "val_00000.bin"}));
  EXPECT_NO_THROW(Dataset d(dir_.file("out")));

  // Dataset files without a meta.json (a tokenizer.model of the user's, say) are replaced only
  // with --overwrite.
  write_file(dir_.file("tok/tokenizer.model"), "the user's own");
  expect_error([&] { prepare_dataset(options("tok")); },
               {"holds tokenizer.model but no meta.json", "not a dataset Foundry finished"});
  EXPECT_EQ(read_file(dir_.file("tok/tokenizer.model")), "the user's own");
  // The same file given as --tokenizer is no obstacle: it is read, and becomes the dataset's.
  const std::string own = dir_.file("own/tokenizer.model");
  std::filesystem::create_directories(dir_.file("own"));
  std::filesystem::copy_file(dir_.file("out/tokenizer.model"), own);
  PrepareOptions with_own = options("own");
  with_own.tokenizer_path = own;
  EXPECT_NO_THROW(prepare_dataset(with_own));
  EXPECT_TRUE(std::filesystem::exists(dir_.file("own/meta.json")));
  PrepareOptions replace = options("tok");
  replace.overwrite = true;
  EXPECT_NO_THROW(prepare_dataset(replace));
  EXPECT_NE(read_file(dir_.file("tok/tokenizer.model")), "the user's own");

  write_file(dir_.file("busy/notes.txt"), "mine");
  expect_error([&] { prepare_dataset(options("busy")); }, {"busy", "notes.txt", "not empty"});
  EXPECT_EQ(read_file(dir_.file("busy/notes.txt")), "mine");
}

TEST_F(Prepare, RejectsBadOptionsAndEmptyInput) {
  PrepareOptions o = options("out");
  o.val_fraction = 0.7;
  expect_error([&] { prepare_dataset(o); }, {"--val-fraction 0.7", "out of range"});
  o.val_fraction = -0.1;
  expect_error([&] { prepare_dataset(o); }, {"--val-fraction"});
  o = options("out");
  o.vocab_size = 0;
  expect_error([&] { prepare_dataset(o); }, {"--vocab-size 0"});

  write_file(dir_.file("blank/a.txt"), "\n   \n\n");
  write_file(dir_.file("blank/b.jsonl"), "{\"text\": \"\"}\n");
  o = options("out");
  o.inputs = {dir_.file("blank")};
  expect_error([&] { prepare_dataset(o); }, {"no text", dir_.file("blank/a.txt")});
  EXPECT_FALSE(fs::exists(dir_.file("out")));

  o.inputs = {dir_.file("corpus/a.txt"), dir_.file("nope.txt")};
  expect_error([&] { prepare_dataset(o); }, {dir_.file("nope.txt"), "does not exist"});

  write_file(dir_.file("fields.jsonl"), "{\"body\": \"x\"}\n");
  o.inputs = {dir_.file("fields.jsonl")};
  expect_error([&] { prepare_dataset(o); },
               {dir_.file("fields.jsonl") + ":1:", "no field \"text\""});
}

TEST_F(Prepare, SingleDocumentHasNoValidationSplit) {
  prepare_dataset(options("first"));
  write_file(dir_.file("one.txt"), documents_[0] + " " + documents_[1] + "\n");
  PrepareOptions o = options("out");
  o.inputs = {dir_.file("one.txt")};
  o.tokenizer_path = dir_.file("first/tokenizer.model");
  const DatasetMeta meta = prepare_dataset(o);
  EXPECT_EQ(meta.train.documents, 1u);
  EXPECT_EQ(meta.val.documents, 0u);
  EXPECT_EQ(meta.val.tokens, 0u);
  Dataset dataset(dir_.file("out"));
  EXPECT_EQ(dataset.val().token_count(), 0u);
  expect_error([&] { BatchLoader::for_eval(dataset, 1, 4); }, {"'val' split", "0 tokens"});
}

}  // namespace
}  // namespace foundry::data
