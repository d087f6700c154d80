// The batch generation engine (BatchLLM's global prefix sharing and throughput-oriented token
// batching, on the CPU): requests run together, their prompts' shared prefixes computed once.
//
// The prompts' prefix tree (prefix_tree.h) gives each shared prefix one KV segment
// (Model::KvSegment), computed once and read by every request below it, never copied; a
// request's own tokens go to a segment of its own, after the chain of its prompt's nodes. Each
// step is one Model::decode_rows call over up to `max_rows` rows (the token budget): first one
// decode token of every request that is generating, then runs of prompt tokens (chunks) of
// nodes whose parent is complete, as many as the budget leaves. Requests are admitted in the
// tree's order (each prefix group together, those with most decoding per prompt token first)
// while their new segments fit the KV budget and at most `max_requests` are unfinished; a
// node's segment is freed when the last request below it finishes. A request's tokens are the
// bits of its generation alone (infer::generate): decode_rows gives each row the logits of its
// sequence decoded alone, and sampling draws from the request's own generator.
//
// Two other schedules serve as the baselines this design is measured against, on the same
// steps and budgets:
// - lru: a prefix cache as serving systems keep one. Requests are admitted in arrival order;
//   a prefix is shared when it is in the cache (or being computed), and a segment no running
//   request reads stays cached until the KV budget needs its room, the least recently used
//   first (leaves of the cache before their parents).
// - fixed: batches of `max_requests` requests in arrival order, each batch run to its end
//   before the next starts, nothing shared. With max_requests 1: one request at a time.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "infer/generation.h"
#include "infer/requests.h"
#include "model/model.h"

namespace foundry::infer {

enum class Schedule { prefix_tree, lru, fixed };
// "prefix-tree", "lru", "fixed"; parse_schedule fails naming `what` and the choices.
const char* schedule_name(Schedule s);
Schedule parse_schedule(const std::string& name, const std::string& what);

struct EngineOptions {
  int64_t max_rows = 32;        // tokens (rows) per step: decode tokens and prompt chunks
  int64_t kv_budget_bytes = 0;  // KV segments alive at once (0: no limit)
  bool share_prefixes = true;   // false: every request computes its whole prompt (a baseline)
  Schedule schedule = Schedule::prefix_tree;
  int64_t max_requests = 0;     // unfinished requests at once (0: max_rows)
};

struct EngineStats {
  int64_t steps = 0, prefill_tokens = 0, decode_tokens = 0;
  int64_t requests_done = 0, generated_tokens = 0;
  int64_t kv_bytes = 0, peak_kv_bytes = 0;  // of live segments, now and at most
  int64_t running = 0;                      // admitted requests that have not finished
  int64_t evictions = 0;                    // schedule lru: cached segments dropped for room
};

class GenerationEngine {
 public:
  GenerationEngine(Model& model, int32_t eos_id, const EngineOptions& options);

  // Fails (Error, naming the request's line) when one request alone needs more KV memory
  // than the budget: the segments of its prompt's prefix-tree nodes and its own. run() checks
  // this first; a caller may check before it writes anything.
  void check_budget(const std::vector<const GenerationRequest*>& requests) const;
  // Calls `done` as each request finishes and `progress` after each step.
  EngineStats run(const std::vector<const GenerationRequest*>& requests,
                  const std::function<void(const GenerationRequest&, const Generation&)>& done,
                  const std::function<void(const EngineStats&)>& progress = {});

 private:
  Model& model_;
  int32_t eos_id_;
  EngineOptions options_;
};

}  // namespace foundry::infer
