#include "infer/engine.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <map>
#include <vector>

#include "base/test_expect_error.h"
#include "infer/generation.h"
#include "infer/prefix_tree.h"
#include "infer/test_support.h"

namespace foundry::infer {
namespace {

using testing::small_model;

// Requests over a tree of prompts: 3 groups (two share a 9-token system prompt, and then
// a few-shot block each), identical prompts, a prompt that is a prefix of others, greedy and
// seeded sampled decoding, budgets from 1 to 7 new tokens.
std::vector<GenerationRequest> tree_requests() {
  const std::vector<int32_t> system = {0, 11, 12, 13, 14, 15, 16, 17, 18};
  const std::vector<std::vector<int32_t>> tails = {
      {30, 31, 32}, {30, 31, 33, 34}, {30, 31, 32}, {40}, {40, 41, 42, 43, 44}, {}, {30}};
  std::vector<GenerationRequest> out;
  for (size_t i = 0; i < tails.size(); ++i) {
    GenerationRequest q;
    q.index = static_cast<int64_t>(i);
    q.line = q.index + 1;
    q.context = system;
    q.context.insert(q.context.end(), tails[i].begin(), tails[i].end());
    q.max_new_tokens = 1 + static_cast<int64_t>(i);
    q.sampling = i % 2 ? SamplingOptions{1.3, 0, 0.95} : SamplingOptions{0.0, 0, 1.0};
    q.seed = 100 + i;
    out.push_back(q);
  }
  for (int g = 0; g < 3; ++g) {  // a second group with nothing in common with the first
    GenerationRequest q;
    q.index = static_cast<int64_t>(out.size());
    q.line = q.index + 1;
    q.context = {0, 50 + g, 60, 61};
    q.max_new_tokens = 4 + g;
    q.sampling = {0.0, 0, 1.0};
    out.push_back(q);
  }
  return out;
}

struct Outcome {
  std::map<int64_t, Generation> results;
  EngineStats stats;
  int64_t kv_seen_max = 0;
  std::vector<int64_t> running;  // after each step
  std::vector<std::pair<int64_t, int64_t>> done_and_generated;  // after each step
};

Outcome run_engine(Model& m, const std::vector<GenerationRequest>& requests,
                   const EngineOptions& o) {
  std::vector<const GenerationRequest*> ptrs;
  for (const GenerationRequest& q : requests) ptrs.push_back(&q);
  Outcome out;
  GenerationEngine engine(m, /*eos_id=*/-1, o);
  out.stats = engine.run(
      ptrs, [&](const GenerationRequest& q, const Generation& g) { out.results[q.index] = g; },
      [&](const EngineStats& e) {
        out.kv_seen_max = std::max(out.kv_seen_max, e.kv_bytes);
        out.running.push_back(e.running);
        out.done_and_generated.emplace_back(e.requests_done, e.generated_tokens);
      });
  return out;
}

EngineOptions options(int64_t rows, int64_t budget, Schedule schedule,
                      int64_t max_requests = 0) {
  EngineOptions o;
  o.max_rows = rows;
  o.kv_budget_bytes = budget;
  o.schedule = schedule;
  o.max_requests = max_requests;
  return o;
}

// The KV bytes of the request that needs the most alone (its prompt's nodes and its own
// segment).
int64_t largest_need(const Model& m, const std::vector<GenerationRequest>& requests) {
  std::vector<std::vector<int32_t>> contexts;
  for (const GenerationRequest& q : requests) contexts.push_back(q.context);
  const PrefixTree tree(contexts);
  int64_t largest = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& q = requests[i];
    const int64_t room = new_token_room(m.config(), static_cast<int64_t>(q.context.size()),
                                        q.max_new_tokens);
    int64_t need = room > 1 ? m.kv_segment_bytes(room - 1) : 0;
    for (int32_t n : tree.path_to(tree.node_of(static_cast<int64_t>(i))))
      need += m.kv_segment_bytes(static_cast<int64_t>(tree.nodes()[n].tokens.size()));
    largest = std::max(largest, need);
  }
  return largest;
}

class Engine : public ::testing::TestWithParam<Arch> {};

TEST_P(Engine, EveryRequestGetsItsTokensAloneWhateverTheBatching) {
  auto m = small_model(GetParam());
  const std::vector<GenerationRequest> requests = tree_requests();
  std::map<int64_t, Generation> alone;
  for (const GenerationRequest& q : requests)
    alone[q.index] = generate(*m, q.context, q.max_new_tokens, -1, q.sampling, q.seed);
  for (int64_t rows : {1, 3, 32}) {
    const Outcome o = run_engine(*m, requests, {rows, 0});
    ASSERT_EQ(o.results.size(), requests.size()) << rows;
    for (const auto& [i, g] : alone) {
      EXPECT_EQ(o.results.at(i).tokens, g.tokens) << "request " << i << ", " << rows << " rows";
      EXPECT_EQ(o.results.at(i).finish, g.finish);
    }
    EXPECT_EQ(o.stats.kv_bytes, 0) << "KV memory back to its baseline";
  }
}

// The generated-token count grows with every token (the trace and the progress rate follow
// decoding, not request completions) and ends at the results' total.
TEST_P(Engine, CountsGeneratedTokensAsTheyAreGenerated) {
  auto m = small_model(GetParam());
  const Outcome o = run_engine(*m, tree_requests(), {32, 0});
  int64_t total = 0;
  for (const auto& [i, g] : o.results) total += static_cast<int64_t>(g.tokens.size());
  EXPECT_EQ(o.stats.generated_tokens, total);
  bool before_any_finished = false;  // tokens counted while no request had finished
  for (const auto& [done, generated] : o.done_and_generated)
    before_any_finished = before_any_finished || (done == 0 && generated > 0);
  EXPECT_TRUE(before_any_finished);
  for (size_t k = 1; k < o.done_and_generated.size(); ++k)
    EXPECT_GE(o.done_and_generated[k].second, o.done_and_generated[k - 1].second);
}

TEST_P(Engine, SharedPrefixesAreComputedOnce) {
  auto m = small_model(GetParam());
  const std::vector<GenerationRequest> requests = tree_requests();
  std::vector<std::vector<int32_t>> contexts;
  int64_t decoded = 0;
  for (const GenerationRequest& q : requests) {
    contexts.push_back(q.context);
    decoded += q.max_new_tokens - 1;  // every token but the last is fed back (no EOS here)
  }
  const PrefixTree tree(contexts);
  const Outcome o = run_engine(*m, requests, {8, 0});
  EXPECT_EQ(o.stats.prefill_tokens, tree.tree_tokens());
  EXPECT_LT(tree.tree_tokens(), tree.prompt_tokens());
  EXPECT_EQ(o.stats.decode_tokens, decoded);
  // Without sharing, every prompt token is computed, to the same results.
  const Outcome unshared = run_engine(*m, requests, {8, 0, /*share_prefixes=*/false});
  EXPECT_EQ(unshared.stats.prefill_tokens, tree.prompt_tokens());
  for (const auto& [i, g] : o.results) EXPECT_EQ(unshared.results.at(i).tokens, g.tokens) << i;
}

TEST_P(Engine, StaysWithinTheKvBudgetFreeingEachPrefixAfterItsLastRequest) {
  auto m = small_model(GetParam());
  const std::vector<GenerationRequest> requests = tree_requests();
  const Outcome free_run = run_engine(*m, requests, {32, 0});
  // Room for the largest request alone, and half as much again: not for everything at once.
  const int64_t budget = largest_need(*m, requests) * 3 / 2;
  ASSERT_LT(budget, free_run.stats.peak_kv_bytes);
  const Outcome tight = run_engine(*m, requests, {32, budget});
  EXPECT_LE(tight.stats.peak_kv_bytes, budget);
  EXPECT_LE(tight.kv_seen_max, budget);
  EXPECT_EQ(tight.stats.kv_bytes, 0);
  for (const auto& [i, g] : free_run.results) EXPECT_EQ(tight.results.at(i).tokens, g.tokens) << i;
}

TEST_P(Engine, ABudgetTooSmallForOneRequestIsAnErrorBeforeAnyWork) {
  auto m = small_model(GetParam());
  const std::vector<GenerationRequest> requests = tree_requests();
  std::vector<const GenerationRequest*> ptrs;
  for (const GenerationRequest& q : requests) ptrs.push_back(&q);
  int calls = 0;
  GenerationEngine engine(*m, -1, {8, m->kv_segment_bytes(5)});
  expect_error([&] { engine.run(ptrs, [&](const auto&, const auto&) { ++calls; }); },
               "request 0 (line 1) needs");
  EXPECT_EQ(calls, 0);
}

// A prompt that others branch off at every token is cut into that many segments, each with
// its fixed part: under a budget that fits it whole, the error says so, and the run without
// prefix sharing fits.
TEST_P(Engine, APromptCutAtManyBranchPointsIsNamedWithWhatItNeedsUnshared) {
  auto m = small_model(GetParam());
  std::vector<GenerationRequest> requests(8);
  for (size_t i = 0; i < requests.size(); ++i) {
    GenerationRequest& q = requests[i];
    q.index = static_cast<int64_t>(i);
    q.line = q.index + 1;
    q.context = {0, 11, 12, 13, 14, 15, 16, 17, 18};
    if (i > 0) q.context.resize(i + 1), q.context.push_back(40);  // branches off after i tokens
    q.max_new_tokens = 2;
    q.sampling = {0.0, 0, 1.0};
  }
  const int64_t whole = m->kv_segment_bytes(9) + m->kv_segment_bytes(1);
  ASSERT_GT(largest_need(*m, requests), whole);
  EngineOptions o = options(8, whole, Schedule::prefix_tree);
  std::vector<const GenerationRequest*> ptrs;
  for (const GenerationRequest& q : requests) ptrs.push_back(&q);
  GenerationEngine shared(*m, -1, o);
  expect_error([&] { shared.run(ptrs, [](const auto&, const auto&) {}); },
               "its prompt is cut at 7 shared prefixes, each kept as a segment of its own: "
               "unshared it needs");
  o.share_prefixes = false;
  const Outcome alone = run_engine(*m, requests, o);
  EXPECT_EQ(alone.results.size(), requests.size());
  EXPECT_LE(alone.stats.peak_kv_bytes, whole);
}

// The baselines run the same requests to the same tokens: lru (arrival order, a prefix
// cache) and fixed batches (arrival order, nothing shared; of 1 request: one at a time).
TEST_P(Engine, BaselineSchedulesGiveEveryRequestTheSameTokens) {
  auto m = small_model(GetParam());
  const std::vector<GenerationRequest> requests = tree_requests();
  std::vector<std::vector<int32_t>> contexts;
  for (const GenerationRequest& q : requests) contexts.push_back(q.context);
  const PrefixTree tree(contexts);
  const Outcome design = run_engine(*m, requests, options(8, 0, Schedule::prefix_tree));
  const Outcome lru = run_engine(*m, requests, options(8, 0, Schedule::lru));
  // With room for everything the cache computes each prefix once and keeps it.
  EXPECT_EQ(lru.stats.prefill_tokens, tree.tree_tokens());
  EXPECT_EQ(lru.stats.evictions, 0);
  EXPECT_GT(lru.stats.kv_bytes, 0) << "finished prefixes stay cached";
  EXPECT_GE(lru.stats.peak_kv_bytes, design.stats.peak_kv_bytes);
  for (int64_t batch : {1, 3}) {
    const Outcome fixed = run_engine(*m, requests, options(8, 0, Schedule::fixed, batch));
    EXPECT_EQ(fixed.stats.prefill_tokens, tree.prompt_tokens()) << "nothing shared";
    EXPECT_EQ(fixed.stats.kv_bytes, 0);
    // A batch runs to its end before the next starts, and has at most `batch` requests.
    for (size_t k = 0; k < fixed.running.size(); ++k) {
      EXPECT_LE(fixed.running[k], batch);
      if (k > 0 && fixed.running[k] > fixed.running[k - 1]) {
        EXPECT_EQ(fixed.running[k - 1], 0) << "a request joined a running batch at step " << k;
      }
    }
    for (const auto& [i, g] : design.results)
      EXPECT_EQ(fixed.results.at(i).tokens, g.tokens) << "fixed " << batch << ", request " << i;
  }
  for (const auto& [i, g] : design.results) EXPECT_EQ(lru.results.at(i).tokens, g.tokens) << i;
  for (int64_t r : design.running) EXPECT_LE(r, 8);
}

// Under a budget that cannot keep every prefix, the cache evicts the least recently used and
// computes them again when a later request needs them; the tokens do not change.
TEST_P(Engine, LruEvictsUnderATightBudgetAndRecomputes) {
  auto m = small_model(GetParam());
  std::vector<GenerationRequest> requests = tree_requests();
  // Arrival order alternates the two groups: each needs the prefix the other pushed out.
  std::vector<GenerationRequest> mixed;
  for (size_t k = 0; k < 3; ++k) mixed.push_back(requests[k]), mixed.push_back(requests[7 + k]);
  for (size_t i = 0; i < mixed.size(); ++i) mixed[i].index = static_cast<int64_t>(i);
  const int64_t budget = largest_need(*m, mixed) * 3 / 2;
  const Outcome roomy = run_engine(*m, mixed, options(8, 0, Schedule::lru));
  const Outcome tight = run_engine(*m, mixed, options(8, budget, Schedule::lru, 1));
  EXPECT_GT(tight.stats.evictions, 0);
  EXPECT_GT(tight.stats.prefill_tokens, roomy.stats.prefill_tokens) << "evicted, computed again";
  EXPECT_LE(tight.stats.peak_kv_bytes, budget);
  EXPECT_LE(tight.kv_seen_max, budget);
  for (const auto& [i, g] : roomy.results) EXPECT_EQ(tight.results.at(i).tokens, g.tokens) << i;
}

// A request stops before the end-of-sequence token, unless it says ignore_eos.
TEST_P(Engine, StopsAtEosUnlessTheRequestIgnoresIt) {
  auto m = small_model(GetParam());
  std::vector<GenerationRequest> requests = tree_requests();
  requests.resize(2);
  for (GenerationRequest& q : requests) q.sampling = {0.0, 0, 1.0}, q.max_new_tokens = 6;
  const Generation free = generate(*m, requests[0].context, 6, -1, {0.0, 0, 1.0}, 0);
  ASSERT_EQ(free.tokens.size(), 6u);
  // Request 0's token k stands for EOS: the third, or an earlier one where greedy decoding
  // repeats itself (its first appearance is where the request stops).
  size_t k = 2;
  while (k > 0 && std::find(free.tokens.begin(), free.tokens.begin() + k, free.tokens[k]) !=
                      free.tokens.begin() + k)
    --k;
  const int32_t eos = free.tokens[k];
  requests[1].context = requests[0].context;
  requests[1].ignore_eos = true;
  std::vector<const GenerationRequest*> ptrs = {&requests[0], &requests[1]};
  std::map<int64_t, Generation> got;
  GenerationEngine(*m, eos, {}).run(
      ptrs, [&](const GenerationRequest& q, const Generation& g) { got[q.index] = g; });
  EXPECT_EQ(got.at(0).finish, FinishReason::eos);
  EXPECT_EQ(got.at(0).tokens, std::vector<int32_t>(free.tokens.begin(), free.tokens.begin() + k));
  EXPECT_EQ(got.at(1).finish, FinishReason::length);
  EXPECT_EQ(got.at(1).tokens, free.tokens);
}

// The bytes glibc's allocator has handed out and not had back, over all its arenas.
int64_t heap_bytes_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

// Every finished prompt's logits (a row of the vocabulary, kept while requests ending there
// wait to start) are freed with it: the engine's memory does not grow by a row a request.
TEST(EngineMemory, KeepsNoVocabularyRowPerFinishedRequest) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the sanitizer's allocator is not glibc's: mallinfo2 does not see it";
#endif
  ModelConfig c = testing::small_config(Arch::moe);
  c.vocab_size = 8192;
  c.validate("test");
  Model m(c, DType::f32);
  m.init_weights(3);
  // The extra heap held at the busiest point of a run over n distinct two-token prompts.
  const auto peak_growth = [&](int64_t n) {
    std::vector<GenerationRequest> requests(n);
    std::vector<const GenerationRequest*> ptrs;
    for (int64_t i = 0; i < n; ++i) {
      requests[i].index = i;
      requests[i].context = {0, static_cast<int32_t>(1 + i % 4000), static_cast<int32_t>(1 + i)};
      requests[i].max_new_tokens = 2;
      ptrs.push_back(&requests[i]);
    }
    const int64_t before = heap_bytes_in_use();
    int64_t peak = before;
    GenerationEngine(m, /*eos_id=*/-1, options(16, 0, Schedule::prefix_tree))
        .run(
            ptrs, [](const GenerationRequest&, const Generation&) {},
            [&](const EngineStats&) { peak = std::max(peak, heap_bytes_in_use()); });
    return peak - before;
  };
  const int64_t row = c.padded_vocab() * static_cast<int64_t>(sizeof(float));
  const int64_t few = peak_growth(50), many = peak_growth(650);
  // A request's own state is some hundred bytes; a row of logits each would be 600 × 32 KiB.
  EXPECT_LT(many - few, 600 * row / 4) << "few " << few << " bytes, many " << many;
}

TEST(Schedules, NamesParseAndABadOneIsNamed) {
  for (Schedule s : {Schedule::prefix_tree, Schedule::lru, Schedule::fixed})
    EXPECT_EQ(parse_schedule(schedule_name(s), "--schedule"), s);
  expect_error([] { parse_schedule("fifo", "--schedule"); }, "--schedule 'fifo' is not");
}

INSTANTIATE_TEST_SUITE_P(BothArchitectures, Engine, ::testing::Values(Arch::moe, Arch::zaya1),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

}  // namespace
}  // namespace foundry::infer
