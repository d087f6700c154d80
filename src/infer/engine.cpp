#include "infer/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "base/error.h"
#include "base/format.h"
#include "base/rng.h"
#include "infer/prefix_tree.h"
#include "infer/sampling.h"

namespace foundry::infer {
namespace {

using Segment = Model::KvSegment;

struct NodeState {
  int64_t bytes = 0;                 // of its segment
  std::unique_ptr<Segment> segment;  // made when its parent is complete
  bool live = false;                 // admitted, and not freed or evicted since
  int64_t filled = 0;                // prompt tokens computed
  // prefix_tree and fixed: requests below it that have not finished (it is freed at 0);
  // lru: admitted requests below it that have not finished (at 0 it stays cached).
  int64_t users = 0;
  int64_t to_start = 0;              // requests that end here and have not started
  int64_t last_use = 0;              // lru: when a request through it was admitted or finished
  std::vector<float> logits;         // after its last token, while requests ending here wait
};

struct RequestState {
  const GenerationRequest* q = nullptr;
  int32_t node = 0;  // where its prompt ends
  int64_t room = 0, own_bytes = 0;
  std::unique_ptr<Segment> own;  // its generated tokens' keys and values
  std::vector<Segment*> chain;   // from its start: its prompt's nodes' segments, then own
  Generation gen;
  Rng rng;
  int32_t pending = -1;  // the token it feeds at the next step
  bool started = false, finished = false;
};

// One run: the tree, the streams' states, the step loop.
class Run {
 public:
  Run(Model& model, int32_t eos_id, const EngineOptions& o,
      const std::vector<const GenerationRequest*>& requests,
      const std::function<void(const GenerationRequest&, const Generation&)>& done)
      : model_(model), c_(model.config()), eos_(eos_id), o_(o), done_(done),
        lru_(o.schedule == Schedule::lru),
        max_requests_(o.max_requests > 0 ? o.max_requests : o.max_rows),
        tree_(contexts_of(requests), o.share_prefixes && o.schedule != Schedule::fixed),
        nodes_(tree_.nodes().size()), reqs_(requests.size()) {
    std::vector<double> priority;
    for (size_t i = 0; i < requests.size(); ++i) {
      RequestState& r = reqs_[i];
      r.q = requests[i];
      r.node = tree_.node_of(static_cast<int64_t>(i));
      const int64_t n = static_cast<int64_t>(r.q->context.size());
      r.room = new_token_room(c_, n, r.q->max_new_tokens);
      r.own_bytes = r.room > 1 ? model_.kv_segment_bytes(r.room - 1) : 0;
      r.rng = Rng(r.q->seed);
      priority.push_back(static_cast<double>(r.q->max_new_tokens) / static_cast<double>(n));
    }
    for (size_t n = 1; n < nodes_.size(); ++n) {
      nodes_[n].bytes = model_.kv_segment_bytes(static_cast<int64_t>(tree_.nodes()[n].tokens.size()));
      nodes_[n].users = lru_ ? 0 : tree_.nodes()[n].prompts_below;
      nodes_[n].to_start = static_cast<int64_t>(tree_.nodes()[n].ends.size());
    }
    if (o.schedule == Schedule::prefix_tree) {
      order_ = tree_.order(priority);
    } else {
      for (size_t i = 0; i < requests.size(); ++i) order_.push_back(static_cast<int64_t>(i));
    }
  }

  // Each request's KV need against the budget, before any work.
  void check_budget() const {
    if (o_.kv_budget_bytes <= 0) return;
    for (const RequestState& r : reqs_) {
      int64_t need = r.own_bytes;
      const std::vector<int32_t> path = tree_.path_to(r.node);
      for (int32_t n : path) need += nodes_[n].bytes;
      if (need <= o_.kv_budget_bytes) continue;
      // Each shared prefix is a segment with its own fixed part (ZAYA1's convolution state):
      // a prompt cut at many branch points can need far more than it would whole.
      const int64_t whole =
          r.own_bytes + model_.kv_segment_bytes(static_cast<int64_t>(r.q->context.size()));
      const std::string unshared =
          path.size() > 1 && whole <= o_.kv_budget_bytes
              ? fmt::format(
                    "; its prompt is cut at {} shared prefixes, each kept as a segment "
                    "of its own: unshared it needs {}, so --no-prefix-sharing (or "
                    "--schedule fixed) runs it",
                    path.size() - 1, format_bytes(static_cast<double>(whole)))
              : "";
      fail(fmt::format("request {} (line {}) needs {} of KV memory at once ({} prompt tokens "
                       "and up to {} new ones), more than the KV budget of {}{}",
                       r.q->index, r.q->line, format_bytes(static_cast<double>(need)),
                       r.q->prompt_tokens(), r.room,
                       format_bytes(static_cast<double>(o_.kv_budget_bytes)), unshared),
           "raise --kv-memory, or shorten that request (its prompt or max_new_tokens)");
    }
  }

  EngineStats run(const std::function<void(const EngineStats&)>& progress) {
    auto state = model_.new_rows_state(o_.max_rows);
    while (true) {
      admit();
      if (stats_.requests_done == static_cast<int64_t>(reqs_.size())) break;
      std::vector<int64_t> who;
      const std::vector<Model::DecodeRow> rows = next_rows(who);
      FOUNDRY_CHECK(!rows.empty());  // admitted work always has a next token
      take_logits(model_.decode_rows(state, rows), who);
      ++stats_.steps;
      stats_.running = std::count_if(active_.begin(), active_.end(),
                                     [&](int64_t i) { return !reqs_[i].finished; });
      if (progress) progress(stats_);
    }
    return stats_;
  }

 private:
  // A step's rows, at most max_rows: one decode token of every request that has one, then
  // runs of prompt tokens of the nodes whose parent is complete, in admission order, as many
  // as the budget leaves. who[k] ≥ 0: row k is request who[k]'s; < 0: node −1 − who[k]'s.
  std::vector<Model::DecodeRow> next_rows(std::vector<int64_t>& who) {
    std::vector<Model::DecodeRow> rows;
    for (int64_t i : active_) {
      const RequestState& r = reqs_[i];
      if (r.pending < 0 || static_cast<int64_t>(rows.size()) >= o_.max_rows) continue;
      rows.push_back({r.pending, r.chain});
      who.push_back(i);
    }
    prefilling_.erase(std::remove_if(prefilling_.begin(), prefilling_.end(),
                                     [&](int32_t n) { return complete_node(n); }),
                      prefilling_.end());
    for (int32_t n : prefilling_) {
      const int64_t room = o_.max_rows - static_cast<int64_t>(rows.size());
      if (room <= 0) break;
      if (!complete_node(tree_.nodes()[n].parent)) continue;
      NodeState& node = nodes_[n];
      const std::vector<int32_t>& tokens = tree_.nodes()[n].tokens;
      if (!node.segment) {
        const int32_t parent = tree_.nodes()[n].parent;
        node.segment = std::make_unique<Segment>(model_.new_kv_segment(
            tree_.nodes()[n].depth, static_cast<int64_t>(tokens.size()),
            parent > 0 ? nodes_[parent].segment.get() : nullptr));
      }
      const std::vector<Segment*> path = chain(n, nullptr);
      const int64_t run = std::min(room, static_cast<int64_t>(tokens.size()) - node.filled);
      for (int64_t k = 0; k < run; ++k) {
        rows.push_back({tokens[node.filled + k], path});
        who.push_back(-1 - n);
      }
    }
    return rows;
  }

  // Each row's logits: a request's next token, or a node's progress (its last one starts the
  // requests that end there).
  void take_logits(const float* logits, const std::vector<int64_t>& who) {
    for (size_t k = 0; k < who.size(); ++k) {
      const float* row = logits + static_cast<int64_t>(k) * c_.padded_vocab();
      if (who[k] >= 0) {
        ++stats_.decode_tokens;
        reqs_[who[k]].pending = -1;
        advance(who[k], row);
      } else {
        ++stats_.prefill_tokens;
        const int32_t n = static_cast<int32_t>(-1 - who[k]);
        if (++nodes_[n].filled == static_cast<int64_t>(tree_.nodes()[n].tokens.size()))
          complete(n, row);
      }
    }
  }

  static std::vector<std::vector<int32_t>> contexts_of(
      const std::vector<const GenerationRequest*>& requests) {
    std::vector<std::vector<int32_t>> out;
    for (const GenerationRequest* q : requests) out.push_back(q->context);
    return out;
  }

  bool complete_node(int32_t n) const {
    return n == 0 || (nodes_[n].live &&
                      nodes_[n].filled == static_cast<int64_t>(tree_.nodes()[n].tokens.size()));
  }

  // The segments of the nodes from the root to `n`, then `own` (if any).
  std::vector<Segment*> chain(int32_t n, Segment* own) const {
    std::vector<Segment*> out;
    for (int32_t p : tree_.path_to(n)) out.push_back(nodes_[p].segment.get());
    if (own) out.push_back(own);
    return out;
  }

  // Requests in the schedule's order while the unfinished ones are few enough and their new
  // segments fit the budget (one always runs, whatever the budget: check_budget said it fits
  // alone). Schedule fixed admits a batch only when the one before has finished; lru makes
  // room by evicting cached segments.
  void admit() {
    const auto prune = [&] {
      active_.erase(std::remove_if(active_.begin(), active_.end(),
                                   [&](int64_t i) { return reqs_[i].finished; }),
                    active_.end());
    };
    prune();
    if (o_.schedule == Schedule::fixed && !active_.empty()) return;
    // (A request may finish as it starts, at its first token: pruned before the next one.)
    for (; next_ < order_.size(); prune()) {
      if (static_cast<int64_t>(active_.size()) >= max_requests_) break;
      const int64_t i = order_[next_];
      RequestState& r = reqs_[i];
      const std::vector<int32_t> path = tree_.path_to(r.node);
      int64_t need = r.own_bytes;  // eviction leaves it alone: it keeps the path
      for (int32_t n : path)
        if (!nodes_[n].live) need += nodes_[n].bytes;
      const auto fits = [&] {
        return o_.kv_budget_bytes <= 0 || stats_.kv_bytes + need <= o_.kv_budget_bytes;
      };
      while (lru_ && !fits() && evict_one(path)) {
      }
      if (!fits() && !active_.empty()) break;
      stats_.kv_bytes += need;
      stats_.peak_kv_bytes = std::max(stats_.peak_kv_bytes, stats_.kv_bytes);
      ++clock_;
      for (int32_t n : path) {
        NodeState& node = nodes_[n];
        if (!node.live) node.live = true, node.filled = 0, prefilling_.push_back(n);
        if (lru_) ++node.users, node.last_use = clock_;
      }
      active_.push_back(i);
      ++next_;
      if (complete_node(r.node)) start(i);
    }
  }

  // lru: drops the least recently used cached segment that no running request reads, has no
  // live child and is not on `keep` (the path of the request being admitted); false when
  // there is none.
  bool evict_one(const std::vector<int32_t>& keep) {
    int32_t victim = -1;
    for (size_t n = 1; n < nodes_.size(); ++n) {
      const NodeState& node = nodes_[n];
      if (!node.live || node.users > 0 ||
          std::find(keep.begin(), keep.end(), static_cast<int32_t>(n)) != keep.end())
        continue;
      const std::vector<int32_t>& kids = tree_.nodes()[n].children;
      if (std::any_of(kids.begin(), kids.end(), [&](int32_t k) { return nodes_[k].live; }))
        continue;
      if (victim < 0 || node.last_use < nodes_[victim].last_use) victim = static_cast<int32_t>(n);
    }
    if (victim < 0) return false;
    release(victim);
    ++stats_.evictions;
    return true;
  }

  void release(int32_t n) {
    prefilling_.erase(std::remove(prefilling_.begin(), prefilling_.end(), n), prefilling_.end());
    NodeState& node = nodes_[n];
    node.segment.reset();
    std::vector<float>().swap(node.logits);  // its memory too (`= {}` keeps the capacity)
    node.live = false;
    node.filled = 0;
    stats_.kv_bytes -= node.bytes;
  }

  // The prompt of node n is computed: its last logits start the requests that end there.
  void complete(int32_t n, const float* logits) {
    NodeState& node = nodes_[n];
    if (node.to_start == 0) return;
    node.logits.assign(logits, logits + c_.padded_vocab());
    for (int64_t i : active_)
      if (reqs_[i].node == n && !reqs_[i].started) start(i);
  }

  void start(int64_t i) {
    RequestState& r = reqs_[i];
    NodeState& node = nodes_[r.node];
    r.started = true;
    if (r.room > 1)
      r.own = std::make_unique<Segment>(model_.new_kv_segment(
          static_cast<int64_t>(r.q->context.size()), r.room - 1, node.segment.get()));
    r.chain = chain(r.node, r.own.get());  // its nodes stay live until it finishes
    // Its own copy (advance may finish r and free the node); the last request to start takes
    // the node's, and with it the memory: a vocabulary's row per prompt otherwise stays held.
    std::vector<float> logits;
    if (--node.to_start == 0)
      logits.swap(node.logits);
    else
      logits = node.logits;
    advance(i, logits.data());
  }

  // A token from `logits`: the end of the request, or its next input.
  void advance(int64_t i, const float* logits) {
    RequestState& r = reqs_[i];
    const int64_t position =
        static_cast<int64_t>(r.q->context.size() + r.gen.tokens.size()) - 1;
    const int32_t next = sample_token(logits, c_.vocab_size, position, r.q->sampling, r.rng);
    if (next == eos_ && !r.q->ignore_eos) {
      r.gen.finish = FinishReason::eos;
      return finish(i);
    }
    r.gen.tokens.push_back(next);
    ++stats_.generated_tokens;  // as generated: the trace and the progress rate follow decoding
    if (static_cast<int64_t>(r.gen.tokens.size()) >= r.room) return finish(i);
    r.pending = next;
  }

  void finish(int64_t i) {
    RequestState& r = reqs_[i];
    r.finished = true;
    r.pending = -1;
    ++stats_.requests_done;
    r.own.reset();
    std::vector<Segment*>().swap(r.chain);
    stats_.kv_bytes -= r.own_bytes;
    ++clock_;
    for (int32_t n : tree_.path_to(r.node)) {
      NodeState& node = nodes_[n];
      node.last_use = clock_;
      if (--node.users == 0 && !lru_) release(n);
    }
    done_(*r.q, r.gen);
    r.gen = Generation();  // reported: a finished request keeps nothing but its flags
  }

  Model& model_;
  const ModelConfig& c_;
  int32_t eos_;
  EngineOptions o_;
  std::function<void(const GenerationRequest&, const Generation&)> done_;
  bool lru_;
  int64_t max_requests_;
  PrefixTree tree_;
  std::vector<NodeState> nodes_;
  std::vector<RequestState> reqs_;
  std::vector<int64_t> order_;
  size_t next_ = 0;
  int64_t clock_ = 0;
  std::vector<int64_t> active_;      // admitted, unfinished requests, in admission order
  std::vector<int32_t> prefilling_;  // admitted nodes not yet complete, in admission order
  EngineStats stats_;
};

}  // namespace

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::prefix_tree: return "prefix-tree";
    case Schedule::lru: return "lru";
    case Schedule::fixed: return "fixed";
  }
  return "?";
}

Schedule parse_schedule(const std::string& name, const std::string& what) {
  for (Schedule s : {Schedule::prefix_tree, Schedule::lru, Schedule::fixed})
    if (name == schedule_name(s)) return s;
  fail(fmt::format("{} '{}' is not a schedule", what, name),
       "use prefix-tree (the default), or lru or fixed (the baselines it is measured against)");
}

GenerationEngine::GenerationEngine(Model& model, int32_t eos_id, const EngineOptions& options)
    : model_(model), eos_id_(eos_id), options_(options) {
  FOUNDRY_CHECK(options_.max_rows >= 1);
}

void GenerationEngine::check_budget(const std::vector<const GenerationRequest*>& requests) const {
  if (requests.empty()) return;
  Run(model_, eos_id_, options_, requests, {}).check_budget();
}

EngineStats GenerationEngine::run(
    const std::vector<const GenerationRequest*>& requests,
    const std::function<void(const GenerationRequest&, const Generation&)>& done,
    const std::function<void(const EngineStats&)>& progress) {
  if (requests.empty()) return {};
  Run run(model_, eos_id_, options_, requests, done);
  run.check_budget();
  return run.run(progress);
}

}  // namespace foundry::infer
