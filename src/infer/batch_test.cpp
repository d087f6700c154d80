#include "infer/batch.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/test_expect_error.h"
#include "infer/generation.h"
#include "infer/test_support.h"

namespace foundry::infer {
namespace {

using foundry::testing::TempDir;
using foundry::testing::write_file;
using nlohmann::json;
using testing::small_model;
using testing::small_tokenizer;

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<json> read_lines(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

// Requests that share prefixes at several depths, one identical pair, one prefix of another,
// an empty prompt, greedy and sampled ones, and an invalid line.
const char* kRequests =
    "{\"prompt\": \"the expert router sends each token\", \"max_new_tokens\": 5, \"temperature\": 0}\n"
    "{\"prompt\": \"the expert router sends\", \"max_new_tokens\": 6, \"temperature\": 0}\n"
    "{\"prompt\": \"the expert router sends each token\", \"max_new_tokens\": 5, \"temperature\": 0}\n"
    "{\"prompt\": \"the expert learns\", \"max_new_tokens\": 4, \"seed\": 3}\n"
    "{\"prompt\": \"\", \"max_new_tokens\": 3, \"temperature\": 0}\n"
    "{\"prompt\": \"data flows\", \"top_p\": 2}\n"
    "{\"prompt_ids\": [40, 41, 42], \"max_new_tokens\": 4}\n";

class Batch : public ::testing::TestWithParam<Arch> {};

TEST_P(Batch, EachResultIsTheRequestRunAloneInTheInputsOrder) {
  TempDir dir;
  write_file(dir.file("in.jsonl"), kRequests);
  auto model = small_model(GetParam());
  const data::Tokenizer& tok = small_tokenizer();
  BatchOptions o;
  o.in = dir.file("in.jsonl");
  o.out = dir.file("out.jsonl");
  o.defaults.max_new_tokens = 9;
  o.defaults.seed = 50;
  o.quiet = true;
  const BatchSummary s = run_generation_batch(*model, tok, o);
  EXPECT_EQ(s.requests, 7);
  EXPECT_EQ(s.invalid, 1);
  EXPECT_EQ(s.generated, 6);
  EXPECT_EQ(s.already_done, 0);
  EXPECT_GT(s.shared_prefix_tokens, 0);

  const std::vector<json> lines = read_lines(o.out);
  ASSERT_EQ(lines.size(), 7u);
  const RequestSet set = read_generation_requests(o.in, tok, model->config().max_seq_len, o.defaults);
  int64_t tokens = 0;
  for (int64_t i = 0; i < 7; ++i) {
    const json& j = lines[i];
    EXPECT_EQ(j["index"], i);
    if (i == 5) {
      EXPECT_EQ(j["line"], 6);
      EXPECT_NE(j["error"].get<std::string>().find("top_p"), std::string::npos);
      continue;
    }
    const GenerationRequest& q = set.requests[i < 5 ? i : i - 1];
    ASSERT_EQ(q.index, i);
    const Generation alone =
        generate(*model, q.context, q.max_new_tokens, tok.eos_id(), q.sampling, q.seed);
    EXPECT_EQ(j["token_ids"].get<std::vector<int32_t>>(), alone.tokens) << "request " << i;
    // The prompt's text and this are the text of the prompt and new tokens decoded together.
    std::vector<int32_t> all(q.context.begin() + 1, q.context.end());
    const std::string prompt = tok.decode(all);
    all.insert(all.end(), alone.tokens.begin(), alone.tokens.end());
    EXPECT_EQ(prompt + j["text"].get<std::string>(), tok.decode(all)) << "request " << i;
    EXPECT_EQ(j["finish_reason"], finish_reason_name(alone.finish));
    EXPECT_EQ(j["prompt_tokens"], q.prompt_tokens());
    EXPECT_EQ(j["generated_tokens"], alone.tokens.size());
    tokens += static_cast<int64_t>(alone.tokens.size());
  }
  EXPECT_EQ(s.generated_tokens, tokens);
  // Identical requests give identical results.
  EXPECT_EQ(lines[0]["token_ids"], lines[2]["token_ids"]);
}

TEST_P(Batch, AKilledRunResumesWithoutRedoingFinishedRequests) {
  TempDir dir;
  write_file(dir.file("in.jsonl"), kRequests);
  auto model = small_model(GetParam());
  BatchOptions o;
  o.in = dir.file("in.jsonl");
  o.out = dir.file("full.jsonl");
  o.quiet = true;
  run_generation_batch(*model, small_tokenizer(), o);
  const std::string full = read_all(o.out);

  // What a run killed after three results leaves: them, in the order they finished, and a
  // line cut short.
  const std::vector<json> lines = read_lines(o.out);
  o.out = dir.file("resumed.jsonl");
  write_file(o.out, lines[6].dump() + "\n" + lines[1].dump() + "\n" + lines[3].dump() + "\n" +
                        lines[0].dump().substr(0, 40));
  const BatchSummary s = run_generation_batch(*model, small_tokenizer(), o);
  EXPECT_EQ(s.already_done, 3);
  EXPECT_EQ(s.generated, 3);
  EXPECT_EQ(read_all(o.out), full);
  // Once more: nothing left to do.
  const BatchSummary again = run_generation_batch(*model, small_tokenizer(), o);
  EXPECT_EQ(again.already_done, 6);
  EXPECT_EQ(again.generated, 0);
  EXPECT_EQ(read_all(o.out), full);
}

TEST_P(Batch, ForeignOutputAndStopOnErrorChangeNothing) {
  TempDir dir;
  write_file(dir.file("in.jsonl"), kRequests);
  auto model = small_model(GetParam());
  BatchOptions o;
  o.in = dir.file("in.jsonl");
  o.out = dir.file("notes.txt");
  o.quiet = true;
  write_file(o.out, "my notes\nmore notes\n");
  expect_error([&] { run_generation_batch(*model, small_tokenizer(), o); },
               "notes.txt' line 1: not JSON");
  EXPECT_EQ(read_all(o.out), "my notes\nmore notes\n");

  o.out = dir.file("out.jsonl");
  o.stop_on_error = true;
  expect_error([&] { run_generation_batch(*model, small_tokenizer(), o); },
               "line 6: \"top_p\" is 2");
  EXPECT_FALSE(std::ifstream(o.out).good());

  // No valid line at all (here: the results of another run given as the requests): refused
  // with the first lines' errors, without --stop-on-error, and OUT left as it was.
  write_file(dir.file("results.jsonl"), "{\"index\": 0, \"text\": \"a\"}\n{\"index\": 1}\n");
  o.in = dir.file("results.jsonl");
  o.stop_on_error = false;
  write_file(o.out, "");
  expect_error([&] { run_generation_batch(*model, small_tokenizer(), o); },
               "none of the 2 requests in '" + o.in + "' is valid:\n  line 1: ");
  EXPECT_EQ(read_all(o.out), "");
}

INSTANTIATE_TEST_SUITE_P(BothArchitectures, Batch, ::testing::Values(Arch::moe, Arch::zaya1),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

}  // namespace
}  // namespace foundry::infer
