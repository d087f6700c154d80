// Model::decode_rows: rows at their own positions over shared segments give each sequence's
// logits of decoding it alone (decode_step), whatever the segments and the rows beside it.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "base/error.h"
#include "model/model.h"
#include "model/test_support.h"

namespace foundry {
namespace {

using Segment = Model::KvSegment;
using Row = Model::DecodeRow;

ModelConfig config_of(Arch arch) {
  ModelConfig c = testing::small_moe_config();
  c.max_seq_len = 40;  // more than two 16-position blocks
  if (arch == Arch::zaya1) c = testing::small_zaya_config(c);
  c.validate("test");
  return c;
}

// Logits [T, Vp] of each position of `tokens` decoded alone.
std::vector<float> alone(Model& m, const std::vector<int32_t>& tokens) {
  const int64_t Vp = m.config().padded_vocab();
  auto state = m.new_decode_state(static_cast<int64_t>(tokens.size()));
  std::vector<float> out;
  for (int32_t t : tokens) {
    const float* logits = m.decode_step(state, t);
    out.insert(out.end(), logits, logits + Vp);
  }
  return out;
}

class DecodeRows : public ::testing::TestWithParam<Arch> {};

// Three sequences: A and B share their first 19 tokens (a prefix segment across a block
// edge), C shares nothing. The prefix is decoded once (as A's rows), then A, B and C advance
// together, B and A from the shared segment, each row at its own position.
TEST_P(DecodeRows, SharedPrefixRowsGiveTheBitsOfEachSequenceAlone) {
  Model m(config_of(GetParam()), DType::f32);
  m.init_weights(21);
  const int64_t Vp = m.config().padded_vocab(), prefix = 19;
  Rng rng(4);
  std::vector<int32_t> a, b, c;
  for (int i = 0; i < 33; ++i) a.push_back(static_cast<int32_t>(rng.below(50)));
  b.assign(a.begin(), a.begin() + prefix);
  for (int i = 0; i < 9; ++i) b.push_back(static_cast<int32_t>(rng.below(50)));
  for (int i = 0; i < 25; ++i) c.push_back(static_cast<int32_t>(rng.below(50)));
  const std::vector<float> want_a = alone(m, a), want_b = alone(m, b), want_c = alone(m, c);

  Segment shared = m.new_kv_segment(0, prefix);
  Segment own_c = m.new_kv_segment(0, 25);
  auto state = m.new_rows_state(3);
  std::vector<float> got_a, got_b, got_c;
  const auto keep = [&](std::vector<float>& into, const float* logits, int64_t row) {
    into.insert(into.end(), logits + row * Vp, logits + (row + 1) * Vp);
  };
  // The prefix (A's first 19 positions) beside C's first 19.
  for (int64_t t = 0; t < prefix; ++t) {
    const float* logits = m.decode_rows(state, {Row{a[t], {&shared}}, Row{c[t], {&own_c}}});
    keep(got_a, logits, 0);
    keep(got_c, logits, 1);
  }
  got_b = got_a;  // B's logits over the shared prefix are A's
  Segment own_a = m.new_kv_segment(prefix, 33 - prefix, &shared);
  Segment own_b = m.new_kv_segment(prefix, 9, &shared);
  for (int64_t t = prefix; t < 33; ++t) {
    std::vector<Row> rows;
    if (t < 28) rows.push_back(Row{b[t], {&shared, &own_b}});
    rows.push_back(Row{a[t], {&shared, &own_a}});
    if (t < 25) rows.push_back(Row{c[t], {&own_c}});
    const float* logits = m.decode_rows(state, rows);
    int64_t r = 0;
    if (t < 28) keep(got_b, logits, r++);
    keep(got_a, logits, r++);
    if (t < 25) keep(got_c, logits, r++);
  }
  EXPECT_EQ(shared.len, prefix);
  EXPECT_EQ(own_a.len, 33 - prefix);
  for (const auto& [got, want, name] :
       {std::tuple{&got_a, &want_a, "A"}, {&got_b, &want_b, "B"}, {&got_c, &want_c, "C"}}) {
    ASSERT_EQ(got->size(), want->size()) << name;
    EXPECT_EQ(std::memcmp(got->data(), want->data(), want->size() * sizeof(float)), 0)
        << "sequence " << name << " differs from its decoding alone";
  }
}

// A prompt computed in runs of several positions a step (one row each, all writing the same
// segment), beside a sequence that decodes one token a step, then the prompt's sequence
// continued in a segment of its own: every row's logits are those of decoding alone.
TEST_P(DecodeRows, RunsOfAPromptInOneStepGiveTheBitsOfDecodingAlone) {
  Model m(config_of(GetParam()), DType::f32);
  m.init_weights(5);
  const int64_t Vp = m.config().padded_vocab(), prompt = 23;
  Rng rng(8);
  std::vector<int32_t> a, c;
  for (int i = 0; i < 30; ++i) a.push_back(static_cast<int32_t>(rng.below(50)));
  for (int i = 0; i < 8; ++i) c.push_back(static_cast<int32_t>(rng.below(50)));
  const std::vector<float> want_a = alone(m, a), want_c = alone(m, c);

  Segment shared = m.new_kv_segment(0, prompt), own_c = m.new_kv_segment(0, 8);
  auto state = m.new_rows_state(8);
  std::vector<float> got_a, got_c;
  // Runs of 1, 7, 3, 7 and 5 positions (across the 16-position block edge), C's row between.
  int64_t t = 0, step = 0;
  for (int64_t run : {1, 7, 3, 7, 5}) {
    std::vector<Row> rows;
    for (int64_t k = 0; k < run; ++k) {
      if (k == 1) rows.push_back(Row{c[step], {&own_c}});
      rows.push_back(Row{a[t + k], {&shared}});
    }
    const float* logits = m.decode_rows(state, rows);
    for (int64_t r = 0; r < static_cast<int64_t>(rows.size()); ++r) {
      std::vector<float>& into = rows[r].chain.back() == &own_c ? got_c : got_a;
      into.insert(into.end(), logits + r * Vp, logits + (r + 1) * Vp);
    }
    t += run;
    if (run > 1) ++step;
  }
  ASSERT_EQ(t, prompt);
  EXPECT_EQ(shared.len, prompt);
  Segment own_a = m.new_kv_segment(prompt, 30 - prompt, &shared);
  std::vector<Row> rest;
  for (int64_t k = prompt; k < 30; ++k) rest.push_back(Row{a[k], {&shared, &own_a}});
  const float* logits = m.decode_rows(state, rest);
  got_a.insert(got_a.end(), logits, logits + (30 - prompt) * Vp);
  ASSERT_EQ(got_a.size(), want_a.size());
  EXPECT_EQ(std::memcmp(got_a.data(), want_a.data(), want_a.size() * sizeof(float)), 0)
      << "the prompt's runs differ from decoding it alone";
  ASSERT_EQ(got_c.size(), static_cast<size_t>(4 * Vp));
  EXPECT_EQ(std::memcmp(got_c.data(), want_c.data(), got_c.size() * sizeof(float)), 0)
      << "the row beside the runs differs from decoding alone";
}

TEST_P(DecodeRows, RefusesAFullSegmentAndAGapInTheChain) {
  Model m(config_of(GetParam()), DType::f32);
  m.init_weights(2);
  auto state = m.new_rows_state(2);
  Segment first = m.new_kv_segment(0, 2);
  m.decode_rows(state, {Row{1, {&first}}});
  m.decode_rows(state, {Row{2, {&first}}});
  try {
    m.decode_rows(state, {Row{3, {&first}}});
    ADD_FAILURE() << "a full segment was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is full"), std::string::npos) << e.what();
  }
  Segment later = m.new_kv_segment(3, 4);  // position 2 is missing
  EXPECT_THROW(m.decode_rows(state, {Row{3, {&first, &later}}}), Error);
  Segment next = m.new_kv_segment(2, 4, &first);
  Segment other = m.new_kv_segment(0, 2);
  other.len = 2;
  // Two rows writing one segment must be one sequence (the same chain) ...
  EXPECT_THROW(m.decode_rows(state, {Row{3, {&first, &next}}, Row{4, {&other, &next}}}), Error);
  // ... and its run must fit the segment.
  std::vector<Row> five(5, Row{3, {&first, &next}});
  EXPECT_THROW(m.decode_rows(state, five), Error);
  EXPECT_EQ(next.len, 0);
  EXPECT_EQ(next.bytes(), m.kv_segment_bytes(4));
  EXPECT_EQ(first.bytes(), m.kv_segment_bytes(2));
}

INSTANTIATE_TEST_SUITE_P(BothArchitectures, DecodeRows, ::testing::Values(Arch::moe, Arch::zaya1),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

}  // namespace
}  // namespace foundry
