// The tokenizer: a SentencePiece model (tokenizer.model) behind a small interface, and the
// deterministic BPE training used by `foundry data prepare`.
//
// Trained models use identity normalization and byte fallback, so decode(encode(text)) == text
// for any UTF-8 text, and bytes outside the learned pieces become <0xNN> byte tokens instead of
// <unk>. Special ids: unk = 0, bos = 1, eos = 2; there is no pad id.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace foundry::data {

inline constexpr int32_t kUnkId = 0;
inline constexpr int32_t kBosId = 1;
inline constexpr int32_t kEosId = 2;

class Tokenizer {
 public:
  // Loads a tokenizer.model file. Fails, naming the path, if the file is unreadable or is not
  // a SentencePiece model.
  static Tokenizer load(const std::string& model_path);
  // Loads from the bytes of a model file; `where` names their origin in error messages.
  static Tokenizer from_bytes(std::string model_bytes, const std::string& where);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Thread-safe: several threads may encode with one Tokenizer at once. A text over
  // kEncodePieceBytes is encoded in pieces cut at spaces between words when the model keeps
  // every piece within a word (see cuts_at_spaces()): the same ids, in bounded memory and time
  // (SentencePiece needs about 85 bytes of memory per byte of one text, and slows down on long
  // ones: docs/PERFORMANCE.md, "One long document").
  std::vector<int32_t> encode(std::string_view text) const;
  // The same ids as encode(), `text` cut into pieces of about `piece_bytes` (tests).
  std::vector<int32_t> encode_in_pieces(std::string_view text, size_t piece_bytes) const;
  // Whether a text may be cut at a space between words and its pieces encoded apart: no
  // vocabulary piece holds the space marker after its start, and the model adds the dummy
  // prefix (so the cut's space comes back as the next piece's leading marker).
  bool cuts_at_spaces() const { return cuts_at_spaces_; }
  static constexpr size_t kEncodePieceBytes = size_t{1} << 16;
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 if the model has none
  int32_t eos_id() const;  // -1 if the model has none
  int32_t unk_id() const;
  std::string piece(int32_t id) const;  // the text of one vocabulary entry, e.g. "▁the"

  // XXH3-64 of the model file bytes; shards record it to tie them to their tokenizer.
  uint64_t checksum() const { return checksum_; }
  // The model file bytes (what tokenizer.model holds).
  const std::string& model_bytes() const { return model_bytes_; }

 private:
  Tokenizer() = default;
  std::vector<int32_t> encode_whole(std::string_view text) const;
  bool pieces_stay_within_words() const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::string model_bytes_;
  uint64_t checksum_ = 0;
  bool cuts_at_spaces_ = false;
};

struct BpeTrainingOptions {
  int32_t vocab_size = 8192;
  // Characters covering this fraction of the text get their own piece; the rest are spelled
  // with byte tokens.
  double character_coverage = 0.9995;
  // Longer training sentences are split at whitespace into pieces of at most this many bytes.
  int32_t max_sentence_bytes = 4096;
};

// Splits text into the units the trainer learns from: one per line, blank lines dropped, and
// lines longer than `max_bytes` cut at the last space before the limit (or at a UTF-8
// character boundary), because SentencePiece silently skips over-long sentences.
void for_each_training_sentence(std::string_view text, size_t max_bytes,
                                const std::function<void(std::string_view)>& emit);

// Trains a BPE tokenizer on `sentences` (each passed through for_each_training_sentence) and
// returns it. The result depends only on the sentences (in order) and the options: training is
// single-threaded with no sampling or shuffling, so the same input gives a byte-identical model.
// The caller bounds the number of sentences. A vocabulary too small or too large for the corpus is
// an Error whose hint gives the usable range when SentencePiece reports it.
Tokenizer train_bpe_tokenizer(const std::vector<std::string>& sentences,
                              const BpeTrainingOptions& options);

}  // namespace foundry::data
