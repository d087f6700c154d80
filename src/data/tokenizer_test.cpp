#include "data/tokenizer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "data/test_util.h"

namespace foundry::data {
namespace {

using testing::expect_error;
using testing::generated_sentences;
using testing::TempDir;
using testing::write_file;

class TrainedTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    BpeTrainingOptions options;
    options.vocab_size = 320;
    tokenizer_ = new Tokenizer(train_bpe_tokenizer(generated_sentences(400, 7), options));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  static Tokenizer* tokenizer_;
};
Tokenizer* TrainedTokenizer::tokenizer_ = nullptr;

TEST_F(TrainedTokenizer, HasTheDocumentedSpecialIds) {
  EXPECT_EQ(tokenizer_->vocab_size(), 320);
  EXPECT_EQ(tokenizer_->unk_id(), kUnkId);
  EXPECT_EQ(tokenizer_->bos_id(), kBosId);
  EXPECT_EQ(tokenizer_->eos_id(), kEosId);
  EXPECT_EQ(tokenizer_->piece(kEosId), "</s>");
  EXPECT_EQ(tokenizer_->piece(3), "<0x00>");  // byte pieces follow the specials
  EXPECT_EQ(tokenizer_->piece(258), "<0xFF>");
}

TEST_F(TrainedTokenizer, RoundTripsTrainingAndUnseenText) {
  for (const std::string& s : generated_sentences(50, 99)) {
    const auto ids = tokenizer_->encode(s);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(tokenizer_->decode(ids), s);
  }
  // Text the tokenizer never saw: byte fallback spells it, nothing becomes <unk>.
  for (const std::string s : {"Naïve café: 😀 中文 — ok?", "  two  spaces\nnew line\ttab ", "X"}) {
    const auto ids = tokenizer_->encode(s);
    for (int32_t id : ids) EXPECT_NE(id, kUnkId) << "in \"" << s << "\"";
    EXPECT_EQ(tokenizer_->decode(ids), s);
  }
  EXPECT_TRUE(tokenizer_->encode("").empty());
}

// U+2581, SentencePiece's own space marker, comes back as itself, not as a space, wherever it
// stands; text without it encodes as SentencePiece encodes it.
TEST_F(TrainedTokenizer, RoundTripsTheSpaceMarkerCharacter) {
  for (const std::string s : {"x\u2581y", "\u2581", "\u2581lead", "trail\u2581", "a \u2581 b",
                              "\u2581\u2581 the expert\u2581router", " \u2581x", "the expert"}) {
    const auto ids = tokenizer_->encode(s);
    for (int32_t id : ids) EXPECT_NE(id, kUnkId) << "in \"" << s << "\"";
    EXPECT_EQ(tokenizer_->decode(ids), s);
  }
  // Pieces without the character keep their ids: "the expert" alone and after it.
  const auto plain = tokenizer_->encode(" the expert");
  const auto after = tokenizer_->encode("\u2581 the expert");
  ASSERT_GE(after.size(), plain.size());
  EXPECT_TRUE(std::equal(plain.end() - 2, plain.end(), after.end() - 2));
}

// A long text is encoded in pieces cut at single spaces between words: the same ids as the
// whole text at every piece size, whatever whitespace, marks and characters lie near the cuts.
TEST_F(TrainedTokenizer, EncodingInPiecesGivesTheIdsOfTheWholeText) {
  ASSERT_TRUE(tokenizer_->cuts_at_spaces());
  const std::vector<std::string> seps = {" ",       "  ",      "\t",      " \n ", ", ",
                                         " \u2581", "\u2581 ", " \u00e9", " 42 ", "\u4e2d\u6587 ",
                                         " - "};
  std::string text;
  size_t k = 0;
  for (const std::string& s : generated_sentences(300, 3)) text += s + seps[k++ % seps.size()];
  const std::vector<int32_t> whole = tokenizer_->encode_in_pieces(text, text.size());
  EXPECT_EQ(tokenizer_->decode(whole), text);
  for (size_t piece : {size_t{1}, size_t{2}, size_t{7}, size_t{64}, size_t{333}, size_t{4096}})
    EXPECT_EQ(tokenizer_->encode_in_pieces(text, piece), whole) << "pieces of " << piece;

  // Over kEncodePieceBytes, encode() cuts by itself.
  std::string big;
  while (big.size() <= Tokenizer::kEncodePieceBytes) big += text;
  EXPECT_EQ(tokenizer_->encode(big), tokenizer_->encode_in_pieces(big, big.size()));
}

TEST_F(TrainedTokenizer, LearnsMergesFromTheCorpus) {
  // "expert" is frequent in the corpus, so it costs far fewer tokens than its bytes.
  EXPECT_LE(tokenizer_->encode("expert").size(), 2u);
}

TEST_F(TrainedTokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  expect_error([&] { tokenizer_->decode({5, 320}); }, {"320", "320 entries"});
  expect_error([&] { tokenizer_->decode({-1}); }, {"-1"});
}

TEST_F(TrainedTokenizer, SavesAndLoadsAsAFile) {
  TempDir dir;
  write_file(dir.file("tokenizer.model"), tokenizer_->model_bytes());
  Tokenizer loaded = Tokenizer::load(dir.file("tokenizer.model"));
  EXPECT_EQ(loaded.checksum(), tokenizer_->checksum());
  EXPECT_EQ(loaded.vocab_size(), 320);
  const std::string text = "the router sends each token to experts.";
  EXPECT_EQ(loaded.encode(text), tokenizer_->encode(text));
}

TEST(Tokenizer, TrainingIsDeterministic) {
  BpeTrainingOptions options;
  options.vocab_size = 300;
  const auto sentences = generated_sentences(300, 3);
  const Tokenizer a = train_bpe_tokenizer(sentences, options);
  const Tokenizer b = train_bpe_tokenizer(sentences, options);
  EXPECT_EQ(a.model_bytes(), b.model_bytes());
  EXPECT_EQ(a.checksum(), b.checksum());
}

TEST(Tokenizer, VocabularyTooSmallOrTooLargeGivesAHint) {
  const auto sentences = generated_sentences(200, 5);
  BpeTrainingOptions options;
  options.vocab_size = 100;  // below 3 specials + 256 bytes + the characters
  const Error small = expect_error([&] { train_bpe_tokenizer(sentences, options); },
                                   {"vocabulary size 100 is too small", "at least"});
  EXPECT_TRUE(testing::contains(small.hint(), "--vocab-size"));
  for (int32_t below_specials : {1, 2}) {  // SentencePiece fails on its special ids there
    options.vocab_size = below_specials;
    expect_error([&] { train_bpe_tokenizer(sentences, options); },
                 {fmt::format("vocabulary size {} is too small for this corpus: it needs at least",
                              below_specials)});
  }
  options.vocab_size = 20000;  // far more pieces than 200 short sentences can yield
  const Error large = expect_error([&] { train_bpe_tokenizer(sentences, options); },
                                   {"vocabulary size 20000 is too large"});
  EXPECT_TRUE(testing::contains(large.hint(), "--vocab-size"));
}

TEST(Tokenizer, TrainingNeedsText) {
  BpeTrainingOptions options;
  options.vocab_size = 300;
  expect_error([&] { train_bpe_tokenizer({}, options); }, {"no text"});
  expect_error([&] { train_bpe_tokenizer({"", "   ", "\n\n"}, options); }, {"no text"});
}

TEST(Tokenizer, InvalidModelFileNamesThePath) {
  TempDir dir;
  write_file(dir.file("bad.model"), "this is not a sentencepiece model");
  expect_error([&] { Tokenizer::load(dir.file("bad.model")); },
               {dir.file("bad.model"), "not a valid SentencePiece"});
  write_file(dir.file("empty.model"), "");
  expect_error([&] { Tokenizer::load(dir.file("empty.model")); }, {dir.file("empty.model")});
  expect_error([&] { Tokenizer::load(dir.file("missing.model")); }, {dir.file("missing.model")});
}

TEST(Tokenizer, TrainingSentencesSplitLongLinesSafely) {
  std::vector<std::string> out;
  auto collect = [&](std::string_view s) { out.emplace_back(s); };
  for_each_training_sentence("first line\n\n   \nsecond line\r\n", 100, collect);
  EXPECT_EQ(out, (std::vector<std::string>{"first line", "second line\r"}));

  out.clear();
  for_each_training_sentence("aaaa bbbb cccc dddd", 10, collect);
  EXPECT_EQ(out, (std::vector<std::string>{"aaaa bbbb", "cccc dddd"}));

  // No spaces: cut at character boundaries, never inside a multi-byte character.
  out.clear();
  std::string accents;
  for (int i = 0; i < 20; ++i) accents += "é";  // 2 bytes each
  for_each_training_sentence(accents, 7, collect);
  std::string joined;
  for (const std::string& s : out) {
    EXPECT_LE(s.size(), 7u);
    EXPECT_EQ(s.size() % 2, 0u) << "a piece splits a character";
    joined += s;
  }
  EXPECT_EQ(joined, accents);
}

}  // namespace
}  // namespace foundry::data
