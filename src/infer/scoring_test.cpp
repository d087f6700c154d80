#include "infer/scoring.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/test_expect_error.h"
#include "infer/test_support.h"

namespace foundry::infer {
namespace {

using foundry::testing::TempDir;
using foundry::testing::write_file;
using testing::small_model;
using testing::small_tokenizer;

// log p(choice | context) by one full forward pass over context + choice (no decode caches).
std::vector<double> forward_logprobs(Model& m, const std::vector<int32_t>& context,
                                     const std::vector<int32_t>& choice) {
  std::vector<int32_t> ids = context;
  ids.insert(ids.end(), choice.begin(), choice.end());
  const int64_t T = static_cast<int64_t>(ids.size()), Vp = m.config().padded_vocab();
  m.forward(ids.data(), nullptr, 1, T);
  std::vector<double> out;
  for (size_t j = 0; j < choice.size(); ++j)
    out.push_back(token_logprob(m.logits() + (context.size() - 1 + j) * Vp,
                                m.config().vocab_size, choice[j]));
  return out;
}

class Scoring : public ::testing::TestWithParam<Arch> {};

TEST_P(Scoring, ChoicesScoreAsAFullForwardAndAsEachChoiceAlone) {
  auto m = small_model(GetParam());
  ChoiceItem item;
  item.context = {0, 21, 22, 23, 24, 25};
  item.choices = {{30}, {31, 32, 33}, {40, 41}, {31, 32, 34, 35, 36}};
  auto state = m->new_rows_state(4);
  const std::vector<ChoiceScore> scores = score_choices(*m, state, item);
  ASSERT_EQ(scores.size(), 4u);
  for (size_t c = 0; c < item.choices.size(); ++c) {
    const std::vector<double> ref = forward_logprobs(*m, item.context, item.choices[c]);
    ASSERT_EQ(scores[c].token_logprobs.size(), ref.size());
    double sum = 0;
    for (size_t j = 0; j < ref.size(); ++j) {
      EXPECT_NEAR(scores[c].token_logprobs[j], ref[j], 1e-5 * std::abs(ref[j])) << c << " " << j;
      sum += ref[j];
    }
    EXPECT_NEAR(scores[c].sum, sum, 1e-5 * std::abs(sum));
    // Scored alone (an item of that one choice): the same bits.
    ChoiceItem alone = item;
    alone.choices = {item.choices[c]};
    const ChoiceScore one = score_choices(*m, state, alone)[0];
    EXPECT_EQ(std::memcmp(one.token_logprobs.data(), scores[c].token_logprobs.data(),
                          one.token_logprobs.size() * sizeof(double)),
              0)
        << "choice " << c;
  }
}

INSTANTIATE_TEST_SUITE_P(BothArchitectures, Scoring, ::testing::Values(Arch::moe, Arch::zaya1),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

// A log-probability is log softmax's, in double; from logits with a NaN or an infinity it is
// refused (a NaN score would make the prediction up), as sampling refuses them.
TEST(Scoring, TokenLogprobIsLogSoftmaxAndRefusesNonFiniteLogits) {
  std::vector<float> logits = {1.0f, 2.0f, -0.5f, 0.25f};
  double z = 0;
  for (float x : logits) z += std::exp(double(x));
  for (int32_t t = 0; t < 4; ++t)
    EXPECT_NEAR(token_logprob(logits.data(), 4, t), double(logits[t]) - std::log(z), 1e-12);
  for (float bad : {NAN, INFINITY}) {
    logits[2] = bad;
    expect_error([&] { token_logprob(logits.data(), 4, 0); }, "1 of the 4 logits are not finite");
  }
}

TEST(Scoring, ReadsItemsAndNamesInvalidLines) {
  TempDir dir;
  write_file(
      dir.file("c.jsonl"),
      "{\"context\": \"the expert\", \"choices\": [\" router\", \" model\"], \"answer\": 1}\n"
      "{\"context\": \"x\", \"choices\": [\"a\"]}\n"
      "\n"
      "{\"context\": \"x\", \"choices\": [\"a\", \"\"]}\n"
      "{\"context\": \"x\", \"choices\": [\"a\", \"b\"], \"answer\": 2}\n"
      "{\"context\": \"x\", \"choices\": [\"a\", \"b\"], \"label\": 0}\n"
      "{\"choices\": [\"a\", \"b\"]}\n"
      "{\"context\": \"x\", \"choices\": [\"a\", \"b\"], \"answer\": 0, \"answer\": 1}\n"
      "{\"context\": \"the data\", \"choices\": [\" flows\", \" runs\", \" layers\"]}\n");
  const ChoiceFile f = read_choice_items(dir.file("c.jsonl"), small_tokenizer(), 24);
  EXPECT_EQ(f.count, 8);
  ASSERT_EQ(f.items.size(), 2u);
  EXPECT_EQ(f.items[0].answer, 1);
  EXPECT_EQ(f.items[0].context.front(), small_tokenizer().eos_id());
  EXPECT_EQ(f.items[1].index, 7);
  EXPECT_EQ(f.items[1].answer, -1);
  ASSERT_EQ(f.errors.size(), 6u);
  const std::vector<std::pair<int64_t, std::string>> want = {
      {2, "at least two"},          {4, "\"choices\"[1]"}, {5, "\"answer\" is 2"},
      {6, "unknown key \"label\""}, {7, "\"context\""},    {8, "\"answer\" appears twice"}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(f.errors[i].line, want[i].first);
    EXPECT_NE(f.errors[i].message.find(want[i].second), std::string::npos) << f.errors[i].message;
  }
}

// The tokens of `choice` after `context` in running text.
std::vector<int32_t> tokens_after(const std::string& context, const std::string& choice) {
  const std::vector<int32_t> c = small_tokenizer().encode(context),
                             whole = small_tokenizer().encode(context + choice);
  return std::vector<int32_t>(whole.begin() + c.size(), whole.end());
}

// A choice's tokens are those it has after the context in running text: " sends" after "the
// expert router" is "▁sends", not the "▁" "▁sends" of " sends" encoded alone (a document's
// start gets a "▁" of its own); a choice that merges with the context's last word is named.
TEST(Scoring, AChoiceHasTheTokensItHasAfterTheContext) {
  const data::Tokenizer& tok = small_tokenizer();
  const std::vector<int32_t> after = tokens_after("the expert router", " sends");
  ASSERT_NE(after, tok.encode(" sends"));  // what encoding the choice alone gave
  // A word split where the tokenizer merges the two halves into one token.
  std::string merged_context, merged_choice;
  for (const std::string word : {"router", "expert", "tokens", "layers", "learns", "sends"})
    for (size_t k = 1; k < word.size() && merged_context.empty(); ++k) {
      const std::vector<int32_t> part = tok.encode("the " + word.substr(0, k)),
                                 whole = tok.encode("the " + word);
      if (whole.size() <= part.size() || !std::equal(part.begin(), part.end(), whole.begin())) {
        merged_context = "the " + word.substr(0, k);
        merged_choice = word.substr(k);
      }
    }
  ASSERT_FALSE(merged_context.empty());
  TempDir dir;
  write_file(dir.file("c.jsonl"),
             "{\"context\": \"the expert router\", \"choices\": [\" sends\", \" learns\"]}\n"
             "{\"context\": \"" +
                 merged_context + "\", \"choices\": [\" sends\", \"" + merged_choice + "\"]}\n" +
                 "{\"context\": \"the expert \", \"choices\": [\"sends\", \"learns\"]}\n");
  const ChoiceFile f = read_choice_items(dir.file("c.jsonl"), tok, 24);
  ASSERT_EQ(f.items.size(), 1u);
  EXPECT_EQ(f.items[0].choices[0], after);
  EXPECT_EQ(f.items[0].choices[1], tokens_after("the expert router", " learns"));
  std::vector<int32_t> context = {tok.eos_id()};
  for (int32_t id : tok.encode("the expert router")) context.push_back(id);
  EXPECT_EQ(f.items[0].context, context);
  ASSERT_EQ(f.errors.size(), 2u);
  EXPECT_EQ(f.errors[0].line, 2);
  const std::string named = "\"choices\"[1] (\"" + merged_choice + "\") runs into the context";
  EXPECT_NE(f.errors[0].message.find(named), std::string::npos) << f.errors[0].message;
  EXPECT_NE(f.errors[0].message.find("start the choice with the space before it"),
            std::string::npos)
      << f.errors[0].message;
  // A context that ends in the space: the space moves to the choice.
  EXPECT_EQ(f.errors[1].line, 3);
  EXPECT_NE(f.errors[1].message.find("end the context before its last space and start the "
                                     "choice with it (\" sends\")"),
            std::string::npos)
      << f.errors[1].message;
}

TEST(Scoring, AFileWithNoValidItemIsRefusedAndOutIsNotWritten) {
  TempDir dir;
  auto m = small_model(Arch::moe);
  write_file(dir.file("c.jsonl"),
             "{\"prompt\": \"a\"}\n{\"context\": \"a\", \"choices\": [\"b\"]}\n");
  expect_error(
      [&] {
        run_choice_eval(*m, small_tokenizer(), dir.file("c.jsonl"), dir.file("out.jsonl"), true);
      },
      "none of the 2 items in '" + dir.file("c.jsonl") + "' is valid:\n  line 1: ");
  EXPECT_FALSE(std::ifstream(dir.file("out.jsonl")).good());
}

TEST(Scoring, RunWritesOneLineAnItemAndCountsTheRightAnswers) {
  TempDir dir;
  auto m = small_model(Arch::moe);
  // Two items whose answer is the model's own choice, one whose answer is not.
  ChoiceItem probe;
  const std::string context = "the expert router";
  probe.context.push_back(small_tokenizer().eos_id());
  for (int32_t id : small_tokenizer().encode(context)) probe.context.push_back(id);
  probe.choices = {tokens_after(context, " sends"), tokens_after(context, " learns")};
  auto state = m->new_rows_state(2);
  const std::vector<ChoiceScore> s = score_choices(*m, state, probe);
  const int best = s[1].sum > s[0].sum ? 1 : 0;
  const std::string item = "{\"context\": \"the expert router\", \"choices\": [\" sends\", \" learns\"]";
  write_file(dir.file("c.jsonl"), item + ", \"answer\": " + std::to_string(best) + "}\n" +
                                      item + ", \"answer\": " + std::to_string(1 - best) + "}\n" +
                                      "not json\n" + item + "}\n");
  const ChoiceSummary sum =
      run_choice_eval(*m, small_tokenizer(), dir.file("c.jsonl"), dir.file("out.jsonl"), true);
  EXPECT_EQ(sum.items, 4);
  EXPECT_EQ(sum.invalid, 1);
  EXPECT_EQ(sum.with_answer, 2);
  EXPECT_EQ(sum.correct, 1);
  std::ifstream in(dir.file("out.jsonl"));
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["prediction"], best);
  EXPECT_EQ(lines[0]["correct"], true);
  EXPECT_EQ(lines[1]["correct"], false);
  EXPECT_EQ(lines[2]["line"], 3);
  EXPECT_FALSE(lines[3].contains("answer"));
  EXPECT_DOUBLE_EQ(lines[0]["scores"][best].get<double>(), s[best].sum);
}

}  // namespace
}  // namespace foundry::infer
