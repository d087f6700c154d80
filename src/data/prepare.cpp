#include "data/prepare.h"

#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <regex>

#include "base/error.h"
#include "base/hash.h"
#include "base/interrupt.h"
#include "base/io.h"
#include "base/progress.h"
#include "base/rng.h"
#include "base/timer.h"

namespace foundry::data {

namespace fs = std::filesystem;

namespace {

// The tokenizer sample must not depend on --seed: one corpus, one tokenizer.
constexpr uint64_t kTokenizerSampleSeed = 0x746f6b656e697a65;  // "tokenize"
constexpr size_t kMaxTrainingSentenceBytes = 4096;
constexpr size_t kEncodeBatchDocuments = 2048;
constexpr size_t kEncodeBatchBytes = 8 << 20;
constexpr size_t kEncodeAloneBytes = 1 << 20;  // a document encoded by every thread
const char* const kStagingPrefix = ".prepare-";

std::string shard_file_name(const std::string& split, size_t index) {
  return fmt::format("{}_{:05d}.bin", split, index);
}

constexpr size_t kMaxShardsPerSplit = 16384;

// Writes one split as a numbered series of shards of at most `shard_tokens` tokens each. A
// shard boundary may fall inside a document: readers see the split as one stream.
class ShardSeriesWriter {
 public:
  ShardSeriesWriter(std::string dir, std::string split, const Tokenizer& tokenizer,
                    uint64_t shard_tokens)
      : dir_(std::move(dir)), split_(std::move(split)),
        vocab_size_(static_cast<uint32_t>(tokenizer.vocab_size())),
        tokenizer_checksum_(tokenizer.checksum()), shard_tokens_(shard_tokens) {}

  void append(const std::vector<int32_t>& ids) {
    size_t done = 0;
    while (done < ids.size()) {
      if (!current_ || current_->token_count() == shard_tokens_) start_next_shard();
      const size_t room = static_cast<size_t>(shard_tokens_ - current_->token_count());
      const size_t n = std::min(room, ids.size() - done);
      current_->append(ids.data() + done, n);
      done += n;
    }
  }

  // Finishes the last shard; a split with no tokens still gets one (empty) shard.
  SplitInfo finish(uint64_t documents) {
    if (!current_) start_next_shard();
    finish_current();
    SplitInfo info;
    info.documents = documents;
    info.shards = shards_;
    for (const ShardInfo& s : shards_) info.tokens += s.tokens;
    return info;
  }

 private:
  void start_next_shard() {
    if (current_) finish_current();
    // Readers map every shard: a process may hold 65,530 mappings (vm.max_map_count).
    if (shards_.size() >= kMaxShardsPerSplit)
      fail(fmt::format("the {} split needs more than {} shards of --shard-tokens {}: too many "
                       "files for a reader to map at once",
                       split_, kMaxShardsPerSplit, shard_tokens_),
           "use a larger --shard-tokens (the default, 100000000, is 100 M tokens a shard); "
           "nothing was written");
    const std::string name = shard_file_name(split_, shards_.size());
    current_ = std::make_unique<TokenShardWriter>((fs::path(dir_) / name).string(), vocab_size_,
                                                  tokenizer_checksum_);
    current_name_ = name;
  }

  void finish_current() {
    const ShardHeader header = current_->finish();
    shards_.push_back({current_name_, header.token_count, header.payload_checksum});
    current_.reset();
  }

  std::string dir_, split_;
  uint32_t vocab_size_;
  uint64_t tokenizer_checksum_, shard_tokens_;
  std::unique_ptr<TokenShardWriter> current_;
  std::string current_name_;
  std::vector<ShardInfo> shards_;
};

// Chooses exactly `wanted` of `total` documents, visiting them in order (selection sampling,
// Knuth's Algorithm S): constant memory, and the choice depends only on the seed.
class ValSelector {
 public:
  ValSelector(uint64_t seed, uint64_t total, uint64_t wanted)
      : rng_(seed), remaining_(total), wanted_(wanted) {}
  bool next_is_val() {
    FOUNDRY_CHECK(remaining_ > 0);
    const bool take =
        rng_.uniform() * static_cast<double>(remaining_) < static_cast<double>(wanted_);
    --remaining_;
    if (take) --wanted_;
    return take;
  }

 private:
  Rng rng_;
  uint64_t remaining_, wanted_;
};

uint64_t val_document_count(uint64_t documents, double val_fraction) {
  if (documents < 2 || val_fraction <= 0) return 0;
  const auto wanted =
      static_cast<uint64_t>(std::llround(val_fraction * static_cast<double>(documents)));
  return std::clamp<uint64_t>(wanted, 1, documents - 1);
}

void warn_invalid_utf8(const std::string& path, const TextCheck& c) {
  std::fprintf(stderr,
               "warning: '%s': %llu byte(s) on %llu line(s) are not valid UTF-8 (the first on "
               "line %llu) and become U+FFFD, the replacement character; if the file is in "
               "another encoding, convert it to UTF-8 first (e.g. iconv -f latin1 -t utf-8)\n",
               path.c_str(), static_cast<unsigned long long>(c.invalid_utf8_bytes),
               static_cast<unsigned long long>(c.invalid_utf8_lines),
               static_cast<unsigned long long>(c.first_invalid_line));
}

// ---------------------------------------------------------------------------------------------
// Pass 1: count documents and sample lines for the tokenizer.

struct CorpusScan {
  std::vector<uint64_t> documents_per_file;
  uint64_t documents = 0;
  std::vector<std::string> tokenizer_sample;
};

CorpusScan scan_corpus(const std::vector<InputFile>& files, const PrepareOptions& options,
                       bool sample_for_tokenizer) {
  CorpusScan scan;
  uint64_t total_bytes = 0;
  for (const InputFile& f : files) total_bytes += f.bytes;
  std::optional<Progress> progress;
  if (options.show_progress) progress.emplace("reading", static_cast<int64_t>(total_bytes), "B");

  const size_t sample_limit = static_cast<size_t>(options.max_sentences);
  Rng sample_rng(kTokenizerSampleSeed);
  uint64_t lines_seen = 0;
  auto sample_line = [&](std::string_view line) {
    ++lines_seen;
    if (scan.tokenizer_sample.size() < sample_limit) {
      scan.tokenizer_sample.emplace_back(line);
      return;
    }
    const uint64_t slot = sample_rng.below(lines_seen);  // reservoir sampling (Algorithm R)
    if (slot < sample_limit) scan.tokenizer_sample[static_cast<size_t>(slot)].assign(line);
  };

  uint64_t bytes_before = 0;
  for (const InputFile& file : files) {
    uint64_t documents = 0;
    read_documents(file, options.jsonl_field, [&](std::string_view text, uint64_t end_offset) {
      check_interrupted();
      ++documents;
      if (sample_for_tokenizer)
        for_each_training_sentence(text, kMaxTrainingSentenceBytes, sample_line);
      if (progress) progress->update(static_cast<int64_t>(bytes_before + end_offset));
    });
    scan.documents_per_file.push_back(documents);
    scan.documents += documents;
    bytes_before += file.bytes;
  }
  if (progress)
    progress->finish(fmt::format("{} documents in {} files", scan.documents, files.size()));
  return scan;
}

// Before anything is written: input that is not text is refused (unless allowed), and bytes
// that are not UTF-8, which the tokenizer turns into U+FFFD, are counted and named.
void check_inputs_are_text(const std::vector<InputFile>& files, const PrepareOptions& options) {
  uint64_t replaced = 0, files_with_replacements = 0;
  for (const InputFile& file : files) {
    const TextCheck c = check_text(file.path);
    if (c.binary() && !options.allow_binary)
      fail(fmt::format("input '{}' is not text: {} control byte(s){} (first at line {}) and {} "
                       "byte(s) of invalid UTF-8 in {} bytes",
                       file.path, c.control_bytes, c.has_nul ? ", NUL among them" : "",
                       c.first_control_line, c.invalid_utf8_bytes, c.bytes),
           "pass UTF-8 text (plain text, JSONL or a JSON array), or --allow-binary to read it "
           "anyway (invalid bytes become U+FFFD)");
    if (c.invalid_utf8_bytes == 0) continue;
    replaced += c.invalid_utf8_bytes;
    ++files_with_replacements;
    warn_invalid_utf8(file.path, c);
  }
  if (files_with_replacements > 1)
    std::fprintf(stderr, "warning: %llu byte(s) of invalid UTF-8 in %llu files become U+FFFD\n",
                 static_cast<unsigned long long>(replaced),
                 static_cast<unsigned long long>(files_with_replacements));
}

[[noreturn]] void fail_no_text(const std::vector<InputFile>& files) {
  std::string names;
  for (size_t i = 0; i < files.size() && i < 3; ++i) names += (i ? ", " : "") + files[i].path;
  if (files.size() > 3) names += fmt::format(" and {} more", files.size() - 3);
  fail(fmt::format("the input holds no text: {} (every document is empty or blank)", names),
       "check the --input paths, and --jsonl-field for JSONL input");
}

// ---------------------------------------------------------------------------------------------
// Pass 2: encode documents into the two shard series.

struct EncodedSplits {
  SplitInfo train, val;
};

// A batch of documents' tokens, each ended by EOS, in the batch's order: the documents side by
// side, except a long one the tokenizer cuts into pieces, encoded alone with its pieces side
// by side.
std::vector<std::vector<int32_t>> encode_documents(const Tokenizer& tokenizer,
                                                   const std::vector<std::string>& batch) {
  std::vector<std::vector<int32_t>> encoded(batch.size());
  const auto alone = [&](size_t i) {
    return tokenizer.cuts_at_spaces() && batch[i].size() > kEncodeAloneBytes;
  };
  std::string error;
#pragma omp parallel for schedule(dynamic, 16)
  for (size_t i = 0; i < batch.size(); ++i) {
    if (alone(i)) continue;
    try {
      encoded[i] = tokenizer.encode(batch[i]);
    } catch (const std::exception& e) {
#pragma omp critical
      if (error.empty()) error = e.what();
    }
  }
  if (!error.empty()) fail(error);
  for (size_t i = 0; i < batch.size(); ++i) {
    if (alone(i)) encoded[i] = tokenizer.encode(batch[i]);
    encoded[i].push_back(tokenizer.eos_id());
  }
  return encoded;
}

EncodedSplits encode_corpus(const std::vector<InputFile>& files, const CorpusScan& scan,
                            const Tokenizer& tokenizer, const PrepareOptions& options,
                            const std::string& staging_dir) {
  ShardSeriesWriter train(staging_dir, "train", tokenizer, options.shard_tokens);
  ShardSeriesWriter val(staging_dir, "val", tokenizer, options.shard_tokens);
  const uint64_t val_wanted = val_document_count(scan.documents, options.val_fraction);
  ValSelector selector(options.seed, scan.documents, val_wanted);
  uint64_t train_documents = 0, val_documents = 0;

  uint64_t total_bytes = 0;
  for (const InputFile& f : files) total_bytes += f.bytes;
  std::optional<Progress> progress;
  if (options.show_progress) progress.emplace("encoding", static_cast<int64_t>(total_bytes), "B");

  // Documents are encoded in parallel batches and written in input order.
  std::vector<std::string> batch;
  std::vector<uint8_t> batch_is_val;
  size_t batch_bytes = 0;
  const int32_t unk = tokenizer.unk_id();
  uint64_t unknown = 0;  // <unk> tokens: text a tokenizer without byte fallback cannot spell
  auto flush = [&]() {
    check_interrupted();
    const std::vector<std::vector<int32_t>> encoded = encode_documents(tokenizer, batch);
    for (size_t i = 0; i < batch.size(); ++i) {
      (batch_is_val[i] ? val : train).append(encoded[i]);
      unknown += static_cast<uint64_t>(std::count(encoded[i].begin(), encoded[i].end(), unk));
    }
    batch.clear();
    batch_is_val.clear();
    batch_bytes = 0;
  };

  uint64_t bytes_before = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    uint64_t documents = 0;
    read_documents(files[f], options.jsonl_field, [&](std::string_view text, uint64_t end_offset) {
      if (++documents > scan.documents_per_file[f]) return;  // reported below
      const bool is_val = selector.next_is_val();
      (is_val ? val_documents : train_documents)++;
      batch.emplace_back(text);
      batch_is_val.push_back(is_val);
      batch_bytes += text.size();
      if (batch.size() >= kEncodeBatchDocuments || batch_bytes >= kEncodeBatchBytes) {
        flush();
        if (progress) progress->update(static_cast<int64_t>(bytes_before + end_offset));
      }
    });
    if (documents != scan.documents_per_file[f])
      fail(fmt::format("input '{}' changed while it was being prepared ({} documents, then {})",
                       files[f].path, scan.documents_per_file[f], documents),
           "do not modify the inputs during foundry data prepare; run it again");
    bytes_before += files[f].bytes;
  }
  flush();
  EncodedSplits splits{train.finish(train_documents), val.finish(val_documents)};
  if (progress)
    progress->finish(
        fmt::format("{} train + {} val tokens", splits.train.tokens, splits.val.tokens));
  if (unknown > 0 && unk >= 0)
    fmt::print(stderr,
               "warning: {} of the {} tokens are <unk> (id {}): the tokenizer has no piece for "
               "some of the text and no byte fallback, so that text is lost\n",
               unknown, splits.train.tokens + splits.val.tokens, unk);
  return splits;
}

// ---------------------------------------------------------------------------------------------
// The output directory: staging, publication, and cleanup on failure.

bool is_dataset_file(const std::string& name) {
  static const std::regex shard(R"((train|val)_\d{5}\.bin)");
  return name == kMetaFileName || name == kTokenizerFileName || name.starts_with(kStagingPrefix) ||
         name.starts_with(std::string(kMetaFileName) + ".tmp.") || std::regex_match(name, shard);
}

// A staging folder left by a run whose process is gone.
bool is_stale_staging(const std::string& name) {
  if (!name.starts_with(kStagingPrefix)) return false;
  const long pid = std::strtol(name.c_str() + std::strlen(kStagingPrefix), nullptr, 10);
  return process_gone(pid);
}

class OutputDir {
 public:
  // `tokenizer`: the --tokenizer file ("" when one is trained), which may be --out's own.
  OutputDir(const std::string& dir, bool overwrite, const std::string& tokenizer) : dir_(dir) {
    std::error_code ec;
    if (fs::exists(dir_, ec)) {
      if (!fs::is_directory(dir_, ec))
        fail(fmt::format("--out '{}' exists and is not a directory", dir_),
             "choose a new or empty directory for the dataset");
      if (path_exists(path(kMetaFileName)) && !overwrite)
        fail(fmt::format("'{}' already holds a prepared dataset", dir_),
             "pass --overwrite to replace it, or choose another --out directory");
      std::vector<std::string> unfinished;  // dataset files without the meta.json that ends one
      for (const auto& entry : fs::directory_iterator(dir_)) {
        const std::string name = entry.path().filename().string();
        if (!is_dataset_file(name))
          fail(fmt::format("--out '{}' is not empty and holds '{}', which is not part of a dataset",
                           dir_, name),
               "choose a new or empty directory for the dataset");
        // (The --tokenizer given is read, then written back as this dataset's.)
        const bool given_tokenizer =
            !tokenizer.empty() && fs::equivalent(entry.path(), tokenizer, ec);
        if (name != kMetaFileName && !name.starts_with(kStagingPrefix) &&
            !name.starts_with(std::string(kMetaFileName) + ".tmp.") && !given_tokenizer)
          unfinished.push_back(name);
      }
      // Without meta.json they are no dataset Foundry finished: an interrupted replacement's,
      // or the user's own (a tokenizer.model meant as --tokenizer): replaced only on purpose.
      std::sort(unfinished.begin(), unfinished.end());
      if (!path_exists(path(kMetaFileName)) && !unfinished.empty() && !overwrite)
        fail(fmt::format("--out '{}' holds {} but no {}: not a dataset Foundry finished, and this "
                         "run would replace them",
                         dir_,
                         fmt::format("{}", fmt::join(unfinished.begin(),
                                                     unfinished.begin() +
                                                         std::min<size_t>(3, unfinished.size()),
                                                     ", ")) +
                             (unfinished.size() > 3 ? ", ..." : ""),
                         kMetaFileName),
             "pass --overwrite to replace them, or choose another --out directory; to encode "
             "with an existing tokenizer.model, pass it as --tokenizer");
    } else {
      created_ = make_dirs_outermost(dir_);
    }
    for (const auto& entry : fs::directory_iterator(dir_))
      if (is_stale_staging(entry.path().filename().string())) remove_all(entry.path().string());
    staging_ = path(fmt::format("{}{}", kStagingPrefix, ::getpid()));
    remove_all(staging_);
    make_dirs(staging_);
  }

  // Without publish(), the destructor removes everything this run wrote.
  ~OutputDir() {
    if (published_) return;
    std::error_code ec;
    fs::remove_all(staging_, ec);
    remove_empty_dirs(dir_, created_);  // what this run made, where it is still empty
  }

  const std::string& staging() const { return staging_; }

  void move_into_place(const fs::path& staged) const {
    std::error_code ec;
    fs::rename(staged, fs::path(dir_) / staged.filename(), ec);
    if (ec)
      fail(fmt::format("cannot move '{}' into '{}': {}", staged.string(), dir_, ec.message()),
           io_error_hint(ec.value(), path(staged.filename().string()),
                         "check permissions and free space of the output directory"));
  }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // Moves the staged files into place, meta.json last. Everything is written (meta.json
  // staged too) before an older dataset in the directory is touched: a full disk fails while
  // the older one is whole. That one loses its meta.json first, so no reader ever sees a mix
  // of old and new files.
  void publish(const DatasetMeta& meta) {
    const fs::path staged_meta = fs::path(staging_) / kMetaFileName;
    write_file_atomic(staged_meta.string(), meta.to_json().dump(2) + "\n");
    if (path_exists(path(kMetaFileName))) {
      remove_all(path(kMetaFileName));
      fsync_path(dir_);
    }
    for (const auto& entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      if (is_dataset_file(name) && !name.starts_with(kStagingPrefix))
        remove_all(entry.path().string());
    }
    for (const auto& entry : fs::directory_iterator(staging_))
      if (entry.path() != staged_meta) move_into_place(entry.path());
    fsync_path(dir_);
    move_into_place(staged_meta);
    fsync_path(dir_);
    remove_all(staging_);
    published_ = true;
  }

 private:
  std::string dir_, staging_;
  std::string created_;  // the outermost directory this run made ("" if --out existed)
  bool published_ = false;
};

void write_staged_file(const std::string& path, const std::string& bytes) {
  write_file_atomic(path, bytes.data(), bytes.size());
}

}  // namespace

void validate_prepare_options(const PrepareOptions& o) {
  if (o.inputs.empty())
    fail("no input given", "pass --input PATH (a file or a folder), repeatable");
  if (o.out_dir.empty()) fail("no output directory given", "pass --out DIR");
  if (!(o.val_fraction >= 0.0 && o.val_fraction <= 0.5))
    fail(fmt::format("--val-fraction {} is out of range [0, 0.5]", o.val_fraction),
         "it is the fraction of documents held out for validation, e.g. 0.01; 0 holds none out");
  if (o.tokenizer_path.empty() && (o.vocab_size < 1 || o.vocab_size > (1 << 20)))
    fail(fmt::format("--vocab-size {} is out of range [1, 1048576]", o.vocab_size),
         "typical sizes are 8192 to 65536; small corpora need a few hundred at least");
  if (o.shard_tokens < 1)
    fail("--shard-tokens must be at least 1", "e.g. --shard-tokens 100000000");
  if (o.max_sentences < 1)
    fail(fmt::format("--max-sentences {} must be at least 1", o.max_sentences),
         "it bounds the lines sampled to train the tokenizer, e.g. 1000000");
  if (o.jsonl_field.empty()) fail("--jsonl-field must not be empty", "e.g. --jsonl-field text");
}

// A tokenizer not trained by Foundry may not give text back as written (another
// normalization, whitespace collapsed, no byte fallback): the dataset would hold the text
// changed. Tried on a probe of what such settings change.
void warn_if_lossy(const Tokenizer& tokenizer, const std::string& path) {
  const std::string probe = "Caf\u00e9  \ufb01ne\n\n\tx\u2603 \u4e2d\u6587 \u00bd";
  const std::string back = tokenizer.decode(tokenizer.encode(probe));
  if (back == probe) return;
  fmt::print(stderr,
             "warning: --tokenizer '{}' does not give text back as written: {} comes back as {} "
             "(its normalization, whitespace handling or missing byte fallback); the dataset "
             "holds such text changed\n",
             path, nlohmann::json(probe).dump(), nlohmann::json(back).dump());
}

DatasetMeta prepare_dataset(const PrepareOptions& options) {
  validate_prepare_options(options);
  const std::vector<InputFile> files =
      resolve_inputs(options.inputs, options.format, options.out_dir);

  // Load a given tokenizer before any long work, so a bad one fails fast.
  std::optional<Tokenizer> tokenizer;
  if (!options.tokenizer_path.empty()) {
    if (!path_exists(options.tokenizer_path))
      fail(fmt::format("--tokenizer '{}' does not exist", options.tokenizer_path),
           "pass the path of an existing tokenizer.model, or leave out --tokenizer to train one");
    tokenizer = Tokenizer::load(options.tokenizer_path);
    warn_if_lossy(*tokenizer, options.tokenizer_path);
  }

  check_inputs_are_text(files, options);
  OutputDir out(options.out_dir, options.overwrite,
                options.tokenizer_path);  // checked before the long work starts
  const CorpusScan scan = scan_corpus(files, options, !tokenizer.has_value());
  if (scan.documents == 0) fail_no_text(files);

  if (!tokenizer) {
    if (options.show_progress)
      std::fprintf(stderr,
                   "training BPE tokenizer: vocab %d on %zu sentences (lines; long ones cut)\n",
                   options.vocab_size, scan.tokenizer_sample.size());
    BpeTrainingOptions bpe;
    bpe.vocab_size = options.vocab_size;
    bpe.max_sentence_bytes = static_cast<int32_t>(kMaxTrainingSentenceBytes);
    const double start = now_seconds();
    {
      std::optional<ElapsedTicker> ticker;
      if (options.show_progress) ticker.emplace("training the tokenizer");
      tokenizer = train_bpe_tokenizer(scan.tokenizer_sample, bpe);  // not interruptible
    }
    check_interrupted();
    if (options.show_progress)
      std::fprintf(stderr, "trained the tokenizer: %d pieces (%.1f s)\n", tokenizer->vocab_size(),
                   now_seconds() - start);
  }
  if (tokenizer->eos_id() < 0)
    fail(fmt::format("tokenizer '{}' has no end-of-sequence piece", options.tokenizer_path),
         "documents are separated by EOS; use a tokenizer trained with an eos id");

  write_staged_file((fs::path(out.staging()) / kTokenizerFileName).string(),
                    tokenizer->model_bytes());
  EncodedSplits splits = encode_corpus(files, scan, *tokenizer, options, out.staging());

  DatasetMeta meta;
  meta.vocab_size = static_cast<uint32_t>(tokenizer->vocab_size());
  meta.token_bytes = token_bytes_for_vocab(meta.vocab_size);
  meta.tokenizer_checksum = tokenizer->checksum();
  meta.tokenizer_origin = options.tokenizer_path.empty() ? "trained" : options.tokenizer_path;
  meta.unk_id = tokenizer->unk_id();
  meta.bos_id = tokenizer->bos_id();
  meta.eos_id = tokenizer->eos_id();
  meta.train = std::move(splits.train);
  meta.val = std::move(splits.val);
  for (size_t i = 0; i < files.size(); ++i)
    meta.sources.push_back({files[i].path, input_format_name(files[i].format), files[i].bytes,
                            scan.documents_per_file[i]});
  meta.options = {{"format", input_format_name(options.format)},
                  {"jsonl_field", options.jsonl_field},
                  {"val_fraction", options.val_fraction},
                  {"seed", options.seed},
                  {"shard_tokens", options.shard_tokens}};
  // The tokenizer's training options, or the tokenizer reused (its vocabulary is vocab_size).
  if (options.tokenizer_path.empty()) {
    meta.options["vocab_size"] = options.vocab_size;
    meta.options["max_sentences"] = options.max_sentences;
  } else {
    meta.options["tokenizer"] = options.tokenizer_path;
  }
  check_interrupted();  // the last chance: once publishing starts, the dataset is finished
  out.publish(meta);
  return meta;
}

}  // namespace foundry::data
