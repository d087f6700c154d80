// `foundry data prepare`: argument parsing only; the work is data::prepare_dataset().
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "base/hash.h"
#include "base/interrupt.h"
#include "cli/commands.h"
#include "data/prepare.h"

namespace foundry::cli {

namespace {

struct PrepareArgs {
  data::PrepareOptions options;
  std::string format = "auto";
  bool quiet = false;
};

// SIGINT/SIGTERM stop the work and remove what it wrote: --out is left as it was.
data::DatasetMeta prepare_interruptibly(const data::PrepareOptions& options) {
  try {
    InterruptScope scope(fmt::format(
        "stopping: data prepare removes what it wrote to '{}' and exits; a tokenizer in "
        "training finishes first",
        options.out_dir));
    return data::prepare_dataset(options);
  } catch (const Interrupted& e) {
    throw Interrupted(
        e.signal(),
        fmt::format("data prepare {}: it removed what it had written, and left '{}' as it "
                    "found it",
                    e.what(), options.out_dir));
  }
}

void run_prepare(const PrepareArgs& args, bool vocab_size_given, bool max_sentences_given) {
  data::PrepareOptions options = args.options;
  options.format = data::parse_input_format(args.format);
  options.show_progress = !args.quiet;
  if (vocab_size_given && !options.tokenizer_path.empty())
    std::fprintf(stderr,
                 "note: --vocab-size is ignored with --tokenizer (the tokenizer sets it)\n");
  if (max_sentences_given && !options.tokenizer_path.empty())
    std::fprintf(stderr,
                 "note: --max-sentences is ignored with --tokenizer (no tokenizer is trained)\n");

  const data::DatasetMeta meta = prepare_interruptibly(options);

  std::printf("prepared dataset in %s\n", options.out_dir.c_str());
  std::printf("  tokenizer  %s, vocab %u, checksum %s\n",
              meta.tokenizer_origin == "trained" ? "trained BPE" : meta.tokenizer_origin.c_str(),
              meta.vocab_size, hash64_hex(meta.tokenizer_checksum).c_str());
  const auto print_split = [](const char* name, const data::SplitInfo& split) {
    std::printf("  %-9s  %llu documents, %llu tokens in %zu shard%s\n", name,
                static_cast<unsigned long long>(split.documents),
                static_cast<unsigned long long>(split.tokens), split.shards.size(),
                split.shards.size() == 1 ? "" : "s");
  };
  print_split("train", meta.train);
  print_split("val", meta.val);
}

}  // namespace

void register_data_commands(CLI::App& app) {
  CLI::App* data_cmd = app.add_subcommand("data", "Prepare training data");
  data_cmd->require_subcommand(1);

  CLI::App* prepare = data_cmd->add_subcommand(
      "prepare",
      "Train a tokenizer (or reuse one) and encode text into token shards in a dataset directory");
  auto args = std::make_shared<PrepareArgs>();
  data::PrepareOptions& o = args->options;
  prepare->add_option("--input", o.inputs,
                      "Text, JSONL or JSON-array file, or a folder scanned for them (repeatable)")
      ->required();
  prepare->add_option("--out", o.out_dir, "Dataset directory to write")->required();
  CLI::Option* vocab = prepare->add_option("--vocab-size", o.vocab_size,
                                           "Vocabulary size of the BPE tokenizer to train")
                           ->capture_default_str();
  prepare->add_option("--tokenizer", o.tokenizer_path,
                      "Reuse this SentencePiece tokenizer.model instead of training one");
  prepare->add_option("--format", args->format, "Input format: auto, text, jsonl, json-array")
      ->capture_default_str();
  prepare->add_option("--jsonl-field", o.jsonl_field, "JSONL field holding the document text")
      ->capture_default_str();
  prepare->add_option("--val-fraction", o.val_fraction,
                      "Fraction of documents held out for validation, in [0, 0.5]")
      ->capture_default_str();
  prepare->add_option("--seed", o.seed, "Seed choosing the validation documents")
      ->check(seed_value())
      ->capture_default_str();
  prepare->add_option("--shard-tokens", o.shard_tokens, "Maximum tokens per shard file")
      ->check(in_range(int64_t{1}, int64_t{1} << 62))
      ->capture_default_str();
  CLI::Option* max_sentences = prepare
                                   ->add_option("--max-sentences", o.max_sentences,
                                                "Maximum lines sampled to train the tokenizer")
                                   ->capture_default_str();
  prepare->add_flag("--overwrite", o.overwrite, "Replace a dataset already in --out");
  prepare->add_flag("--allow-binary", o.allow_binary,
                    "Read input that is not text (control bytes such as NUL) instead of refusing "
                    "it; bytes that are not UTF-8 become U+FFFD");
  prepare->add_flag("--quiet,-q", args->quiet, "No progress output");
  prepare->callback([args, vocab, max_sentences]() {
    run_prepare(*args, vocab->count() > 0, max_sentences->count() > 0);
  });
}

}  // namespace foundry::cli
