#include "infer/prefix_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace foundry::infer {
namespace {

using Tokens = std::vector<int32_t>;

// The tokens from the root to the node where prompt i ends: the prompt itself.
Tokens spelled(const PrefixTree& t, int64_t prompt) {
  Tokens out;
  for (int32_t n : t.path_to(t.node_of(prompt)))
    out.insert(out.end(), t.nodes()[n].tokens.begin(), t.nodes()[n].tokens.end());
  return out;
}

// Every node's invariants: depth is the tokens above it, children start with distinct tokens,
// prompts_below counts its subtree, each prompt is spelled by its path.
void check_tree(const PrefixTree& t, const std::vector<Tokens>& prompts) {
  const auto& nodes = t.nodes();
  for (size_t n = 1; n < nodes.size(); ++n) {
    const auto& node = nodes[n];
    EXPECT_FALSE(node.tokens.empty()) << "node " << n;
    const auto& parent = nodes[node.parent];
    EXPECT_EQ(node.depth, parent.depth + static_cast<int64_t>(parent.tokens.size()));
    EXPECT_NE(std::find(parent.children.begin(), parent.children.end(), n),
              parent.children.end());
  }
  for (const auto& node : nodes) {
    std::vector<int32_t> firsts;
    int64_t below = static_cast<int64_t>(node.ends.size());
    for (int32_t c : node.children) {
      firsts.push_back(nodes[c].tokens.front());
      below += nodes[c].prompts_below;
    }
    std::sort(firsts.begin(), firsts.end());
    EXPECT_EQ(std::adjacent_find(firsts.begin(), firsts.end()), firsts.end());
    EXPECT_EQ(node.prompts_below, below);
  }
  for (size_t p = 0; p < prompts.size(); ++p) EXPECT_EQ(spelled(t, p), prompts[p]) << p;
  int64_t total = 0;
  for (const Tokens& p : prompts) total += static_cast<int64_t>(p.size());
  EXPECT_EQ(t.prompt_tokens(), total);
}

TEST(PrefixTree, IdenticalPromptsEndAtOneNode) {
  const std::vector<Tokens> prompts = {{1, 2, 3}, {1, 2, 3}, {1, 2, 3}};
  const PrefixTree t(prompts);
  check_tree(t, prompts);
  EXPECT_EQ(t.nodes().size(), 2u);
  EXPECT_EQ(t.node_of(0), t.node_of(2));
  EXPECT_EQ(t.nodes()[t.node_of(0)].ends, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(t.tree_tokens(), 3);
}

TEST(PrefixTree, APromptThatIsAPrefixOfAnotherEndsInsideItsPath) {
  for (const auto& prompts : {std::vector<Tokens>{{1, 2}, {1, 2, 3, 4}},
                              std::vector<Tokens>{{1, 2, 3, 4}, {1, 2}}}) {
    const PrefixTree t(prompts);
    check_tree(t, prompts);
    EXPECT_EQ(t.nodes().size(), 3u);
    const int64_t shorter = prompts[0].size() == 2 ? 0 : 1;
    const auto& node = t.nodes()[t.node_of(shorter)];
    EXPECT_EQ(node.tokens, (Tokens{1, 2}));
    ASSERT_EQ(node.children.size(), 1u);
    EXPECT_EQ(t.nodes()[node.children[0]].tokens, (Tokens{3, 4}));
    EXPECT_EQ(t.tree_tokens(), 4);
  }
}

TEST(PrefixTree, EmptyPromptsEndAtTheRoot) {
  const std::vector<Tokens> prompts = {{}, {5}, {}};
  const PrefixTree t(prompts);
  check_tree(t, prompts);
  EXPECT_EQ(t.node_of(0), 0);
  EXPECT_EQ(t.node_of(2), 0);
  EXPECT_EQ(t.nodes()[0].prompts_below, 3);
}

TEST(PrefixTree, PromptsWithNothingInCommonShareNothing) {
  const std::vector<Tokens> prompts = {{1, 2}, {3, 4, 5}, {6}};
  const PrefixTree t(prompts);
  check_tree(t, prompts);
  EXPECT_EQ(t.nodes()[0].children.size(), 3u);
  EXPECT_EQ(t.tree_tokens(), t.prompt_tokens());
}

TEST(PrefixTree, WithoutSharingEveryPromptIsItsOwnBranch) {
  const std::vector<Tokens> prompts = {{1, 2, 3}, {1, 2, 3}, {1, 2}, {}};
  const PrefixTree t(prompts, /*share=*/false);
  EXPECT_EQ(t.nodes().size(), 4u);
  EXPECT_EQ(t.tree_tokens(), t.prompt_tokens());
  EXPECT_NE(t.node_of(0), t.node_of(1));
  EXPECT_EQ(t.node_of(3), 0);
  for (size_t p = 0; p < prompts.size(); ++p) {
    EXPECT_EQ(spelled(t, p), prompts[p]);
    if (!prompts[p].empty()) {
      EXPECT_EQ(t.nodes()[t.node_of(p)].parent, 0);
    }
  }
}

TEST(PrefixTree, SharesPrefixesAtEveryDepth) {
  // A system prompt, two few-shot blocks under it, questions under each.
  const std::vector<Tokens> prompts = {{9, 1, 2, 3, 10, 11}, {9, 1, 2, 3, 10, 12},
                                       {9, 1, 2, 4, 20},     {9, 1, 2, 4, 21, 22},
                                       {9, 1, 2, 3},         {8}};
  const PrefixTree t(prompts);
  check_tree(t, prompts);
  // [8] | [9 1 2] → [3] → ([10] → [11], [12]) | [4] → [20], [21 22]
  EXPECT_EQ(t.nodes().size(), 10u);
  EXPECT_EQ(t.tree_tokens(), 1 + 3 + 1 + 1 + 1 + 1 + 1 + 1 + 2);
  const auto& shared = t.nodes()[t.path_to(t.node_of(0))[0]];
  EXPECT_EQ(shared.tokens, (Tokens{9, 1, 2}));
  EXPECT_EQ(shared.prompts_below, 5);
}

TEST(PrefixTree, OrderKeepsEachPrefixsPromptsTogetherMostDecodingFirst) {
  const std::vector<Tokens> prompts = {{1, 2, 3}, {7, 8}, {1, 2, 4}, {7, 9}, {1, 2, 3}};
  const PrefixTree t(prompts);
  const std::vector<int64_t> order = t.order({1.0, 0.5, 3.0, 4.0, 2.0});
  ASSERT_EQ(order.size(), 5u);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  // The [7 …] group holds the highest priority (4.0), so it goes first; inside [1 2 …], the
  // [4] branch (3.0) before [3] (2.0, then 1.0).
  EXPECT_EQ(order, (std::vector<int64_t>{3, 1, 2, 4, 0}));
}

}  // namespace
}  // namespace foundry::infer
