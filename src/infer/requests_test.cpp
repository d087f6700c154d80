#include "infer/requests.h"

#include <gtest/gtest.h>

#include <string>

#include "base/test_expect_error.h"
#include "infer/test_support.h"

namespace foundry::infer {
namespace {

using foundry::testing::TempDir;
using foundry::testing::write_file;
using testing::small_tokenizer;

RequestSet read(const TempDir& dir, const std::string& text, const RequestDefaults& d = {}) {
  write_file(dir.file("in.jsonl"), text);
  return read_generation_requests(dir.file("in.jsonl"), small_tokenizer(), 24, d);
}

TEST(Requests, ReadsPromptsIdsAndSettingsWithTheCommandsDefaults) {
  TempDir dir;
  const data::Tokenizer& tok = small_tokenizer();
  RequestDefaults d;
  d.max_new_tokens = 7;
  d.sampling = {0.5, 3, 0.9};
  d.seed = 100;
  const RequestSet set = read(dir,
                              "{\"prompt\": \"the expert router\"}\n"
                              "\n"
                              "{\"prompt_ids\": [5, 6, 7], \"max_new_tokens\": 3, "
                              "\"temperature\": 0, \"top_k\": 0, \"top_p\": 1, \"seed\": 9, "
                              "\"ignore_eos\": true}\n"
                              "{\"prompt\": \"\"}\n",
                              d);
  ASSERT_EQ(set.count, 3);
  ASSERT_TRUE(set.errors.empty()) << set.errors[0].message;
  ASSERT_EQ(set.requests.size(), 3u);
  const GenerationRequest& a = set.requests[0];
  std::vector<int32_t> expected = {tok.eos_id()};
  for (int32_t id : tok.encode("the expert router")) expected.push_back(id);
  EXPECT_EQ(a.context, expected);
  EXPECT_EQ(a.prompt_tokens(), static_cast<int64_t>(expected.size()) - 1);
  EXPECT_EQ(a.index, 0);
  EXPECT_EQ(a.line, 1);
  EXPECT_EQ(a.max_new_tokens, 7);
  EXPECT_EQ(a.sampling.top_k, 3);
  EXPECT_EQ(a.seed, 100u);  // --seed + index
  const GenerationRequest& b = set.requests[1];
  EXPECT_EQ(b.index, 1);
  EXPECT_EQ(b.line, 3);  // the blank line is not a request
  EXPECT_EQ(b.context, (std::vector<int32_t>{tok.eos_id(), 5, 6, 7}));
  EXPECT_EQ(b.max_new_tokens, 3);
  EXPECT_EQ(b.sampling.temperature, 0.0);
  EXPECT_EQ(b.seed, 9u);
  EXPECT_TRUE(b.ignore_eos);
  EXPECT_FALSE(a.ignore_eos);
  EXPECT_NE(a.key, b.key);
  EXPECT_EQ(set.requests[2].context, (std::vector<int32_t>{tok.eos_id()}));  // empty prompt
  EXPECT_EQ(set.requests[2].seed, 102u);
}

TEST(Requests, InvalidLinesAreNamedByLineAndTheRestStillRun) {
  TempDir dir;
  std::string ids23 = "[1";
  for (int i = 1; i < 23; ++i) ids23 += ", 1";
  ids23 += "]";
  const RequestSet set = read(dir,
                              "{\"prompt\": \"fine\"}\n"
                              "{\"prompt\": \"x\",}\n"
                              "[1, 2]\n"
                              "{\"prompt\": \"x\", \"max_tokens\": 3}\n"
                              "{\"prompt\": \"x\", \"prompt_ids\": [1]}\n"
                              "{\"prompt_ids\": [1, 300]}\n"
                              "{\"prompt\": \"x\", \"max_new_tokens\": 0}\n"
                              "{\"prompt\": \"x\", \"top_p\": 1.5}\n"
                              "{\"prompt\": \"x\", \"seed\": -1}\n"
                              "{\"prompt_ids\": " +
                                  ids23 +
                                  "}\n"
                                  "{}\n"
                                  "{\"prompt\": \"x\", \"ignore_eos\": 1}\n"
                                  "{\"prompt\": \"a\", \"prompt\": \"b\"}\n"
                                  "{\"prompt\": \"also fine\"}\n");
  EXPECT_EQ(set.count, 14);
  ASSERT_EQ(set.requests.size(), 2u);
  EXPECT_EQ(set.requests[1].index, 13);
  ASSERT_EQ(set.errors.size(), 12u);
  const std::vector<std::string> needles = {
      "not JSON",         "not a JSON object",        "unknown key \"max_tokens\"",
      "both \"prompt\"",  "\"prompt_ids\"[1] is 300", "\"max_new_tokens\" is 0",
      "\"top_p\" is 1.5", "\"seed\" is -1",           "model.max_seq_len is 24",
      "neither",          "\"ignore_eos\" is 1",      "\"prompt\" appears twice"};
  for (size_t i = 0; i < needles.size(); ++i) {
    EXPECT_EQ(set.errors[i].line, static_cast<int64_t>(i) + 2);
    EXPECT_NE(set.errors[i].message.find(needles[i]), std::string::npos)
        << "line " << set.errors[i].line << ": " << set.errors[i].message;
  }
}

TEST(Requests, AFileWithNoRequestsOrNoFileIsAnError) {
  TempDir dir;
  expect_error([&] { read(dir, "\n  \n"); }, "has no requests");
  expect_error(
      [&] { read_generation_requests(dir.file("missing.jsonl"), small_tokenizer(), 24, {}); },
      "missing.jsonl");
}

TEST(Requests, TheKeyChangesWithAnythingThatDecidesTheResult) {
  TempDir dir;
  const std::string line = "{\"prompt\": \"the router\"}\n";
  RequestDefaults d;
  const uint64_t base = read(dir, line, d).requests[0].key;
  EXPECT_EQ(read(dir, line, d).requests[0].key, base);
  d.max_new_tokens = 65;
  EXPECT_NE(read(dir, line, d).requests[0].key, base);
  d = {};
  d.seed = 1;
  EXPECT_NE(read(dir, line, d).requests[0].key, base);
  EXPECT_NE(read(dir, "{\"prompt\": \"the routers\"}\n").requests[0].key, base);
  d = {};  // the model that computes it
  d.model = 1;
  const uint64_t one = read(dir, line, d).requests[0].key;
  EXPECT_NE(one, base);
  d.model = 2;
  EXPECT_NE(read(dir, line, d).requests[0].key, one);
}

TEST(Requests, FinishedResultsAreThoseOfTheseRequests) {
  TempDir dir;
  const RequestSet set = read(dir, "{\"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n{\"prompt\": \"c\"}\n");
  GenerationResult r0, r2;
  r0.index = 0;
  r0.key = set.requests[0].key;
  r0.token_ids = {4, 5};
  r0.text = "xy";
  r2.index = 2;
  r2.key = set.requests[2].key;
  const std::string out = dir.file("out.jsonl");
  // Two results, an error line, and a last line cut short by a kill.
  GenerationResult r1 = r0;
  r1.index = 1;
  write_file(out, result_line(r2) + "\n" + error_line({1, 2, "bad"}) + "\n" + result_line(r0) +
                      "\n" + result_line(r1).substr(0, 30));
  const auto done = read_finished_results(out, set);
  ASSERT_EQ(done.size(), 2u);
  const std::string text = read_text_file(out);
  const auto line_at = [&](const LineSpan& span) { return text.substr(span.offset, span.bytes); };
  EXPECT_EQ(line_at(done.at(0)), result_line(r0));
  EXPECT_EQ(line_at(done.at(2)), result_line(r2));
  // A request's last line counts.
  write_file(out, result_line(r0) + "\n" + result_line(r2) + "\n" + result_line(r0) + "\n");
  EXPECT_EQ(read_finished_results(out, set).at(0).offset,
            static_cast<int64_t>(result_line(r0).size() + result_line(r2).size() + 2));
  EXPECT_TRUE(read_finished_results(dir.file("none.jsonl"), set).empty());

  // A result for another request at that index, or a file of something else: refused.
  GenerationResult other = r0;
  other.key ^= 1;
  write_file(out, result_line(other) + "\n");
  expect_error([&] { read_finished_results(out, set); }, "made for another request");
  write_file(out, "hello\nworld\n");
  expect_error([&] { read_finished_results(out, set); }, "line 1: not JSON");
  write_file(out, "my notes\n");  // one line, whole: not a cut-short result
  expect_error([&] { read_finished_results(out, set); }, "line 1: not JSON");
  write_file(out, "my notes");
  expect_error([&] { read_finished_results(out, set); }, "line 1: not JSON");
  // Cut within the first key: a result's start all the same.
  write_file(out, result_line(r2) + "\n" + "{\"finish_rea");
  EXPECT_EQ(read_finished_results(out, set).size(), 1u);
  // Cut short too, but not the start of a result or error line: someone else's file.
  write_file(out, "{\"my\": \"important data\"");
  expect_error([&] { read_finished_results(out, set); }, "line 1: not JSON");
  write_file(out, "{\"a\": 1}\n");
  expect_error([&] { read_finished_results(out, set); }, "no \"index\"");
}

}  // namespace
}  // namespace foundry::infer
