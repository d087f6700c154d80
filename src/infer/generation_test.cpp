#include "infer/generation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "base/test_expect_error.h"
#include "infer/test_support.h"

namespace foundry::infer {
namespace {

using testing::small_model;

// Greedy continuation by full forward passes: the argmax of the last position's logits over
// the real vocabulary, the context regrown each time (no decode caches).
std::vector<int32_t> greedy_by_forward(Model& m, std::vector<int32_t> ids, int64_t n) {
  const int64_t V = m.config().vocab_size, Vp = m.config().padded_vocab();
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t T = static_cast<int64_t>(ids.size());
    m.forward(ids.data(), nullptr, 1, T);
    const float* last = m.logits() + (T - 1) * Vp;
    const int32_t next = static_cast<int32_t>(std::max_element(last, last + V) - last);
    out.push_back(next);
    ids.push_back(next);
  }
  return out;
}

class Generate : public ::testing::TestWithParam<Arch> {};

TEST_P(Generate, GreedyTokensAreTheFullForwardsArgmax) {
  auto m = small_model(GetParam());
  const std::vector<int32_t> context = {0, 17, 42, 5, 280};
  const Generation g = generate(*m, context, 8, /*eos_id=*/-1, {0.0, 0, 1.0}, 0);
  EXPECT_EQ(g.finish, FinishReason::length);
  EXPECT_EQ(g.tokens, greedy_by_forward(*m, context, 8));
}

TEST_P(Generate, StopsBeforeEosAndAtMaxSeqLen) {
  auto m = small_model(GetParam());
  const std::vector<int32_t> context = {0, 3, 4};
  const Generation free_run = generate(*m, context, 6, -1, {0.0, 0, 1.0}, 0);
  ASSERT_EQ(free_run.tokens.size(), 6u);
  // With a later token as EOS (the last new one), generation ends before its first use.
  size_t at = free_run.tokens.size() - 1;
  while (at > 0 && std::find(free_run.tokens.begin(), free_run.tokens.begin() + at,
                             free_run.tokens[at]) != free_run.tokens.begin() + at)
    --at;
  const Generation stopped = generate(*m, context, 6, free_run.tokens[at], {0.0, 0, 1.0}, 0);
  EXPECT_EQ(stopped.finish, FinishReason::eos);
  EXPECT_EQ(stopped.tokens,
            std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + at));
  // max_seq_len is 24: a 20-token context has room for 4.
  const std::vector<int32_t> long_context(20, 7);
  EXPECT_EQ(new_token_room(m->config(), 20, 64), 4);
  EXPECT_EQ(generate(*m, long_context, 64, -1, {0.0, 0, 1.0}, 0).tokens.size(), 4u);
  expect_error([&] { generate(*m, std::vector<int32_t>(24, 7), 1, -1, {}, 0); },
               "model.max_seq_len is 24");
}

TEST_P(Generate, SamplingDependsOnlyOnTheSeed) {
  auto m = small_model(GetParam());
  const std::vector<int32_t> context = {0, 9, 8, 7};
  const SamplingOptions warm{1.5, 0, 1.0};
  const Generation a = generate(*m, context, 12, -1, warm, 5);
  const Generation b = generate(*m, context, 12, -1, warm, 5);
  const Generation c = generate(*m, context, 12, -1, warm, 6);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_NE(a.tokens, c.tokens);
}

INSTANTIATE_TEST_SUITE_P(BothArchitectures, Generate, ::testing::Values(Arch::moe, Arch::zaya1),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

}  // namespace
}  // namespace foundry::infer
