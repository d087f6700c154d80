// The prefix tree of a batch's prompts (token level, a radix tree): each node holds a run of
// tokens that every prompt below it starts with, so a prefix shared by several prompts, at any
// depth, is one node. Its state (the KV caches, and for ZAYA1 CCA's convolution state at its
// end) need be computed once for all of them. BatchLLM's global prefix sharing starts here.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

namespace foundry::infer {

class PrefixTree {
 public:
  struct Node {
    int32_t parent = -1;            // -1 for the root
    int64_t depth = 0;              // tokens before this node's run
    std::vector<int32_t> tokens;    // the run (empty only at the root)
    std::vector<int32_t> children;  // in the order they were first reached
    std::vector<int64_t> ends;      // the prompts that end here, in input order
    int64_t prompts_below = 0;      // prompts that end here or below
  };

  // With `share` false every prompt is a child of the root of its own (nothing shared: the
  // baseline that sharing is measured against).
  explicit PrefixTree(const std::vector<std::vector<int32_t>>& prompts, bool share = true);

  // Node 0 is the root, with no tokens.
  const std::vector<Node>& nodes() const { return nodes_; }
  // The node where prompt i ends (the root for an empty prompt).
  int32_t node_of(int64_t prompt) const { return end_node_[prompt]; }
  // Σ |prompt|: the prompt tokens computed without sharing.
  int64_t prompt_tokens() const { return prompt_tokens_; }
  // Σ |run| over the nodes: the prompt tokens computed once each with sharing.
  int64_t tree_tokens() const { return tree_tokens_; }
  // The nodes from the root's child down to `node` (empty for the root).
  std::vector<int32_t> path_to(int32_t node) const;

  // Every prompt once, each shared prefix's prompts together (depth first): at a node, the
  // prompts that end there, then its children's subtrees. Prompts at a node and children go
  // in descending `priority` (of the prompt; of a subtree, its highest), ties in input order.
  std::vector<int64_t> order(const std::vector<double>& priority) const;

 private:
  int32_t split(int32_t node, int64_t keep);  // the first `keep` tokens become a new parent

  std::vector<Node> nodes_;
  std::vector<std::map<int32_t, int32_t>> child_by_token_;  // first token of a child → child
  std::vector<int32_t> end_node_;
  int64_t prompt_tokens_ = 0, tree_tokens_ = 0;
};

}  // namespace foundry::infer
