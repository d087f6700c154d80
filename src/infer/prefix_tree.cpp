#include "infer/prefix_tree.h"

#include <algorithm>
#include <functional>

namespace foundry::infer {

PrefixTree::PrefixTree(const std::vector<std::vector<int32_t>>& prompts, bool share) {
  nodes_.emplace_back();
  child_by_token_.emplace_back();
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int32_t>& tokens = prompts[p];
    prompt_tokens_ += static_cast<int64_t>(tokens.size());
    int32_t at = 0;
    size_t i = 0;
    if (!share && !tokens.empty()) {  // a branch of its own
      Node leaf;
      leaf.parent = 0;
      leaf.tokens = tokens;
      at = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(std::move(leaf));
      child_by_token_.emplace_back();
      nodes_[0].children.push_back(at);
      i = tokens.size();
    }
    while (i < tokens.size()) {
      const auto found = child_by_token_[at].find(tokens[i]);
      if (found == child_by_token_[at].end()) {  // a new branch: the rest of the prompt
        Node leaf;
        leaf.parent = at;
        leaf.depth = static_cast<int64_t>(i);
        leaf.tokens.assign(tokens.begin() + static_cast<int64_t>(i), tokens.end());
        const int32_t id = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(std::move(leaf));
        child_by_token_.emplace_back();
        nodes_[at].children.push_back(id);
        child_by_token_[at][tokens[i]] = id;
        at = id;
        break;
      }
      int32_t child = found->second;
      const std::vector<int32_t>& run = nodes_[child].tokens;
      size_t same = 0;
      while (same < run.size() && i + same < tokens.size() && run[same] == tokens[i + same])
        ++same;
      if (same < run.size()) child = split(child, static_cast<int64_t>(same));
      at = child;
      i += same;
    }
    nodes_[at].ends.push_back(static_cast<int64_t>(p));
    end_node_.push_back(at);
  }
  // Counts below each node: children may have lower ids than their parents (after a split).
  std::function<int64_t(int32_t)> count = [&](int32_t n) {
    int64_t below = static_cast<int64_t>(nodes_[n].ends.size());
    for (int32_t c : nodes_[n].children) below += count(c);
    return nodes_[n].prompts_below = below;
  };
  count(0);
  for (const Node& n : nodes_) tree_tokens_ += static_cast<int64_t>(n.tokens.size());
}

int32_t PrefixTree::split(int32_t node, int64_t keep) {
  const int32_t mid = static_cast<int32_t>(nodes_.size());
  Node head;
  head.parent = nodes_[node].parent;
  head.depth = nodes_[node].depth;
  head.tokens.assign(nodes_[node].tokens.begin(), nodes_[node].tokens.begin() + keep);
  head.children.push_back(node);
  nodes_.push_back(std::move(head));
  child_by_token_.emplace_back();
  Node& tail = nodes_[node];
  tail.tokens.erase(tail.tokens.begin(), tail.tokens.begin() + keep);
  tail.depth += keep;
  const int32_t parent = tail.parent;
  tail.parent = mid;
  child_by_token_[mid][tail.tokens.front()] = node;
  std::replace(nodes_[parent].children.begin(), nodes_[parent].children.end(), node, mid);
  child_by_token_[parent][nodes_[mid].tokens.front()] = mid;
  return mid;
}

std::vector<int32_t> PrefixTree::path_to(int32_t node) const {
  std::vector<int32_t> path;
  for (int32_t n = node; n > 0; n = nodes_[n].parent) path.push_back(n);
  std::reverse(path.begin(), path.end());
  return path;
}

std::vector<int64_t> PrefixTree::order(const std::vector<double>& priority) const {
  std::vector<double> best(nodes_.size(), -1e300);  // a subtree's highest priority
  std::function<double(int32_t)> highest = [&](int32_t n) {
    double b = -1e300;
    for (int64_t p : nodes_[n].ends) b = std::max(b, priority[p]);
    for (int32_t c : nodes_[n].children) b = std::max(b, highest(c));
    return best[n] = b;
  };
  highest(0);
  std::vector<int64_t> out;
  out.reserve(end_node_.size());
  std::function<void(int32_t)> visit = [&](int32_t n) {
    std::vector<int64_t> ends = nodes_[n].ends;
    std::stable_sort(ends.begin(), ends.end(),
                     [&](int64_t a, int64_t b) { return priority[a] > priority[b]; });
    out.insert(out.end(), ends.begin(), ends.end());
    std::vector<int32_t> children = nodes_[n].children;
    std::stable_sort(children.begin(), children.end(),
                     [&](int32_t a, int32_t b) { return best[a] > best[b]; });
    for (int32_t c : children) visit(c);
  };
  visit(0);
  return out;
}

}  // namespace foundry::infer
