#include "data/tokenizer.h"

#include <omp.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cctype>
#include <regex>
#include <unordered_map>

#include "base/error.h"
#include "base/hash.h"
#include "base/io.h"
#include "data/corpus.h"

namespace foundry::data {

Tokenizer Tokenizer::load(const std::string& model_path) {
  return from_bytes(read_text_file(model_path), model_path);
}

Tokenizer Tokenizer::from_bytes(std::string model_bytes, const std::string& where) {
  Tokenizer t;
  t.processor_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = t.processor_->LoadFromSerializedProto(model_bytes);
  if (model_bytes.empty() || !status.ok() || t.processor_->GetPieceSize() <= 0)
    fail(fmt::format("'{}' is not a valid SentencePiece tokenizer model", where),
         "pass a tokenizer.model written by foundry data prepare (DATASET/tokenizer.model) or "
         "by SentencePiece");
  t.checksum_ = hash64(model_bytes.data(), model_bytes.size());
  t.model_bytes_ = std::move(model_bytes);
  t.cuts_at_spaces_ = t.pieces_stay_within_words();
  return t;
}

namespace {

// U+2581, SentencePiece's marker for a space.
constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";

// The next place at or after `from` to cut a text for encoding: a single space between two
// words (neither neighbour a space, the next character an ASCII letter or digit, so no
// normalization joins it to the space). npos if there is none.
size_t next_cut(std::string_view text, size_t from) {
  for (size_t i = text.find(' ', std::max<size_t>(from, 1)); i != std::string_view::npos;
       i = text.find(' ', i + 1)) {
    if (i + 1 >= text.size()) return std::string_view::npos;
    const auto next = static_cast<unsigned char>(text[i + 1]);
    if (text[i - 1] != ' ' && next < 0x80 && std::isalnum(next)) return i;
  }
  return std::string_view::npos;
}

}  // namespace

// Cutting "x y" into "x" and "y" gives the same ids when every piece lies within a word: the
// model splits at each space (as U+2581 at the start of the next word) and never merges across
// one, and the dummy prefix it adds to "y" stands for the space that was cut.
bool Tokenizer::pieces_stay_within_words() const {
  for (int id = 0; id < processor_->GetPieceSize(); ++id) {
    if (processor_->IsByte(id) || processor_->IsControl(id) || processor_->IsUnknown(id)) continue;
    const std::string p = processor_->IdToPiece(id);
    if (p.find(kSpaceMarker, 1) != std::string::npos) return false;
  }
  std::vector<std::string> probe;
  return processor_->Encode("a", &probe).ok() && !probe.empty() &&
         std::string_view(probe.front()).starts_with(kSpaceMarker);
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  if (text.size() > kEncodePieceBytes && cuts_at_spaces_)
    return encode_in_pieces(text, kEncodePieceBytes);
  return encode_whole(text);
}

std::vector<int32_t> Tokenizer::encode_in_pieces(std::string_view text, size_t piece_bytes) const {
  if (!cuts_at_spaces_) return encode_whole(text);
  std::vector<std::string_view> pieces;
  for (size_t start = 0; start < text.size();) {
    const size_t cut = next_cut(text, start + std::max<size_t>(piece_bytes, 1));
    const size_t end = cut == std::string_view::npos ? text.size() : cut;
    pieces.push_back(text.substr(start, end - start));
    start = end == text.size() ? end : end + 1;  // the space is the next piece's dummy prefix
  }
  // Side by side unless the caller already encodes texts side by side.
  std::vector<std::vector<int32_t>> parts(pieces.size());
  std::string error;
#pragma omp parallel for schedule(dynamic, 1) if (pieces.size() > 1 && !omp_in_parallel())
  for (size_t i = 0; i < pieces.size(); ++i) {
    try {
      parts[i] = encode_whole(pieces[i]);
    } catch (const std::exception& e) {
#pragma omp critical
      if (error.empty()) error = e.what();
    }
  }
  if (!error.empty()) fail(error);
  std::vector<int32_t> ids;
  for (const std::vector<int32_t>& part : parts) ids.insert(ids.end(), part.begin(), part.end());
  return ids;
}

std::vector<int32_t> Tokenizer::encode_whole(std::string_view text) const {
  // U+2581 is SentencePiece's own space marker: a piece whose text holds a literal one is
  // written as its bytes' pieces, or decode would give a space back for it.
  if (text.find(kSpaceMarker) == std::string_view::npos) {
    std::vector<int> ids;
    const auto status = processor_->Encode(text, &ids);
    if (!status.ok()) fail(fmt::format("tokenizer cannot encode text: {}", status.ToString()));
    return std::vector<int32_t>(ids.begin(), ids.end());
  }
  sentencepiece::ImmutableSentencePieceText pieces;
  const auto status = processor_->Encode(text, pieces.mutable_proto());
  if (!status.ok()) fail(fmt::format("tokenizer cannot encode text: {}", status.ToString()));
  std::vector<int32_t> ids;
  for (const auto& piece : pieces.pieces()) {
    const std::string& surface = piece.surface();
    // Byte pieces spell their bytes already (the first of a character's has no surface).
    if (processor_->IsByte(static_cast<int>(piece.id())) ||
        surface.find(kSpaceMarker) == std::string::npos) {
      ids.push_back(static_cast<int32_t>(piece.id()));
      continue;
    }
    for (unsigned char byte : surface) {
      const int id = processor_->PieceToId(fmt::format("<0x{:02X}>", byte));
      if (id == processor_->unk_id())
        fail("tokenizer cannot encode U+2581 in the text: its model has no byte pieces",
             "use a tokenizer prepared by foundry data prepare (byte fallback)");
      ids.push_back(id);
    }
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const int32_t vocab = vocab_size();
  for (int32_t id : ids)
    if (id < 0 || id >= vocab)
      fail(fmt::format("cannot decode token id {}: the vocabulary has {} entries", id, vocab));
  std::string text;
  const auto status = processor_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  if (!status.ok()) fail(fmt::format("tokenizer cannot decode ids: {}", status.ToString()));
  return text;
}

int32_t Tokenizer::vocab_size() const { return processor_->GetPieceSize(); }
int32_t Tokenizer::bos_id() const { return processor_->bos_id(); }
int32_t Tokenizer::eos_id() const { return processor_->eos_id(); }
int32_t Tokenizer::unk_id() const { return processor_->unk_id(); }

std::string Tokenizer::piece(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail(fmt::format("token id {} is outside the vocabulary of {} entries", id, vocab_size()));
  return processor_->IdToPiece(id);
}

// ---------------------------------------------------------------------------------------------
// Training

namespace {

class VectorSentenceIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorSentenceIterator(const std::vector<std::string>& sentences)
      : sentences_(sentences) {}
  bool done() const override { return index_ >= sentences_.size(); }
  void Next() override { ++index_; }
  const std::string& value() const override { return sentences_[index_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& sentences_;
  size_t index_ = 0;
};

[[noreturn]] void fail_training(const std::string& message, int32_t vocab_size) {
  std::smatch m;
  static const std::regex too_small(R"(smaller than required_chars\. (\d+) vs (\d+))");
  static const std::regex too_large(
      R"(Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+))");
  if (std::regex_search(message, m, too_small))
    fail(fmt::format("vocabulary size {} is too small for this corpus: it needs at least {} "
                     "(3 special ids, 256 byte-fallback tokens and the corpus's characters)",
                     vocab_size, m[2].str()),
         fmt::format("use --vocab-size {} or more", m[2].str()));
  if (std::regex_search(message, m, too_large))
    fail(fmt::format("vocabulary size {} is too large for this corpus: BPE can learn at most {} "
                     "pieces from it",
                     vocab_size, m[2].str()),
         fmt::format("use --vocab-size {} or less, or add more text", m[2].str()));
  fail(fmt::format("tokenizer training failed: {}", message),
       "check the --vocab-size and that the input holds enough text");
}

}  // namespace

void for_each_training_sentence(std::string_view text, size_t max_bytes,
                                const std::function<void(std::string_view)>& emit) {
  FOUNDRY_CHECK(max_bytes >= 4);  // room for any UTF-8 character
  size_t line_start = 0;
  while (line_start <= text.size()) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = text.size();
    std::string_view line = text.substr(line_start, line_end - line_start);
    while (!line.empty()) {
      size_t len = std::min(max_bytes, line.size());
      if (len < line.size()) {
        // Cut at the last space before the limit, else at a UTF-8 character boundary.
        size_t space = line.rfind(' ', len);
        if (space != std::string_view::npos && space > 0) {
          len = space;
        } else {
          while (len > 1 && (static_cast<uint8_t>(line[len]) & 0xC0) == 0x80) --len;
        }
      }
      if (!is_blank_text(line.substr(0, len))) emit(line.substr(0, len));
      line.remove_prefix(len);
      while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    }
    line_start = line_end + 1;
  }
}

Tokenizer train_bpe_tokenizer(const std::vector<std::string>& sentences,
                              const BpeTrainingOptions& options) {
  if (sentences.empty())
    fail("no text to train the tokenizer on",
         "the inputs must hold at least one non-empty document");
  if (options.vocab_size < 1)
    fail(fmt::format("vocabulary size {} must be positive", options.vocab_size),
         "use e.g. --vocab-size 8192");
  const std::unordered_map<std::string, std::string> spec = {
      {"model_type", "bpe"},
      // Below the 3 special ids SentencePiece fails on them before it counts what the corpus
      // needs: trained at 3, it names the corpus's minimum (fail_training), for any size.
      {"vocab_size", std::to_string(std::max(options.vocab_size, 3))},
      {"character_coverage", std::to_string(options.character_coverage)},
      {"byte_fallback", "true"},
      // Keep text exactly as written (whitespace, newlines, case): decode(encode(x)) == x.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"max_sentence_length", std::to_string(options.max_sentence_bytes)},
      // Determinism: the caller already bounded the sentences; no sampling, no shuffling.
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", "1"},
      {"unk_id", std::to_string(kUnkId)},
      {"bos_id", std::to_string(kBosId)},
      {"eos_id", std::to_string(kEosId)},
      {"pad_id", "-1"},
      {"minloglevel", "2"},  // errors come back as a status; keep the console quiet
  };
  std::vector<std::string> chunks;
  for (const std::string& s : sentences)
    for_each_training_sentence(s, static_cast<size_t>(options.max_sentence_bytes),
                               [&](std::string_view chunk) { chunks.emplace_back(chunk); });
  if (chunks.empty())
    fail("no text to train the tokenizer on", "the inputs hold only blank documents");
  VectorSentenceIterator iterator(chunks);
  std::string model_bytes;
  const auto status = sentencepiece::SentencePieceTrainer::Train(spec, &iterator, &model_bytes);
  if (!status.ok()) fail_training(status.message(), options.vocab_size);
  return Tokenizer::from_bytes(std::move(model_bytes), "trained tokenizer");
}

}  // namespace foundry::data
