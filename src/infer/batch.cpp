#include "infer/batch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <vector>

#include "base/error.h"
#include "base/format.h"
#include "base/io.h"
#include "base/progress.h"
#include "base/timer.h"
#include "ckpt/checkpoint_dir.h"
#include "infer/generation.h"
#include "infer/prefix_tree.h"
#include "model/info.h"

namespace foundry::infer {
namespace {

// The invalid lines, reported; with stop_on_error, a failure naming the first ones.
void report_invalid(const RequestSet& set, const BatchOptions& o) {
  if (set.errors.empty()) return;
  std::string list;
  for (size_t i = 0; i < set.errors.size() && i < 5; ++i)
    list += fmt::format("\n  line {}: {}", set.errors[i].line, set.errors[i].message);
  if (set.errors.size() > 5) list += fmt::format("\n  ... and {} more", set.errors.size() - 5);
  if (o.stop_on_error)
    fail(fmt::format("{} of the {} requests in '{}' are invalid:{}", set.errors.size(),
                     set.count, o.in, list),
         "fix those lines, or leave out --stop-on-error to run the valid requests and get an "
         "\"error\" line in --out for each invalid one");
  warn(fmt::format("{} of the {} requests in '{}' are invalid and will not run (each gets an "
                   "\"error\" line in '{}'):{}",
                   set.errors.size(), set.count, o.in, o.out, list));
}

// OUT as an earlier run left it, cut back to its last whole line, opened to append.
std::FILE* open_for_append(const std::string& path, const std::map<int64_t, std::string>& kept) {
  std::string text;
  for (const auto& [index, line] : kept) text += line + "\n";
  write_file_atomic(path, text);  // only the results that stay, whole lines
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (!f)
    fail(fmt::format("cannot write --out '{}'", path),
         "check that its directory exists and is writable");
  return f;
}

// The text a generation adds to its prompt: the prompt and the new tokens decoded together,
// less the prompt's text (decoded alone, a continuation can lose the space that joins it).
std::string continuation_text(const data::Tokenizer& tok, const std::vector<int32_t>& context,
                              const std::vector<int32_t>& tokens) {
  std::vector<int32_t> all(context.begin() + 1, context.end());
  const std::string prompt = tok.decode(all);
  all.insert(all.end(), tokens.begin(), tokens.end());
  const std::string whole = tok.decode(all);
  return whole.compare(0, prompt.size(), prompt) == 0 ? whole.substr(prompt.size())
                                                      : tok.decode(tokens);
}

}  // namespace

BatchSummary run_generation_batch(Model& model, const data::Tokenizer& tok,
                                  const BatchOptions& o) {
  const ModelConfig& c = model.config();
  const RequestSet set = read_generation_requests(o.in, tok, c.max_seq_len, o.defaults);
  std::map<int64_t, std::string> lines = read_finished_results(o.out, set);
  report_invalid(set, o);

  BatchSummary s;
  s.requests = set.count;
  s.invalid = static_cast<int64_t>(set.errors.size());
  s.already_done = static_cast<int64_t>(lines.size());
  std::vector<const GenerationRequest*> todo;
  for (const GenerationRequest& q : set.requests)
    if (!lines.count(q.index)) todo.push_back(&q);
  if (s.already_done > 0)
    std::fprintf(stderr, "resuming: %lld of the %lld requests already have results in %s\n",
                 static_cast<long long>(s.already_done), static_cast<long long>(set.count),
                 o.out.c_str());

  std::vector<std::vector<int32_t>> contexts;
  std::vector<double> priority;  // decoding per prompt token: the most first
  for (const GenerationRequest* q : todo) {
    contexts.push_back(q->context);
    priority.push_back(static_cast<double>(q->max_new_tokens) /
                       static_cast<double>(q->context.size()));
  }
  const PrefixTree tree(contexts);
  s.prompt_tokens = tree.prompt_tokens();
  s.shared_prefix_tokens = tree.prompt_tokens() - tree.tree_tokens();

  std::FILE* out = open_for_append(o.out, lines);
  const double start = now_seconds();
  {
    Progress progress("generate --batch", static_cast<int64_t>(todo.size()), "requests");
    int64_t done = 0;
    for (int64_t i : tree.order(priority)) {
      const GenerationRequest& q = *todo[i];
      const int64_t room = new_token_room(c, static_cast<int64_t>(q.context.size()),
                                          q.max_new_tokens);
      const int64_t kv = decode_state_bytes(c, static_cast<int64_t>(q.context.size()) + room);
      s.peak_kv_bytes = std::max(s.peak_kv_bytes, kv);
      const Generation g = generate(model, q.context, q.max_new_tokens, tok.eos_id(), q.sampling,
                                    q.seed);
      GenerationResult r;
      r.index = q.index;
      r.key = q.key;
      r.prompt_tokens = q.prompt_tokens();
      r.token_ids = g.tokens;
      r.text = continuation_text(tok, q.context, g.tokens);
      r.finish = g.finish;
      const std::string line = result_line(r);
      std::fprintf(out, "%s\n", line.c_str());
      std::fflush(out);
      lines[q.index] = line;
      s.generated_tokens += static_cast<int64_t>(g.tokens.size());
      ++done;
      if (!o.quiet)
        progress.update(done, fmt::format("{:.0f} tokens/s, KV {}",
                                          s.generated_tokens / std::max(1e-9, now_seconds() - start),
                                          format_bytes(static_cast<double>(kv))));
    }
    if (!o.quiet) progress.finish();
    s.generated = done;
  }
  std::fclose(out);
  s.seconds = now_seconds() - start;

  // OUT in index order, the invalid lines among the results.
  for (const RequestError& e : set.errors) lines[e.index] = error_line(e);
  std::string text;
  for (const auto& [index, line] : lines) text += line + "\n";
  write_file_atomic(o.out, text);
  return s;
}

}  // namespace foundry::infer
