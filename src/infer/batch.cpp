#include "infer/batch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <vector>

#include "base/error.h"
#include "base/format.h"
#include "base/io.h"
#include "base/progress.h"
#include "base/timer.h"
#include "ckpt/checkpoint_dir.h"
#include "infer/engine.h"
#include "infer/generation.h"

namespace foundry::infer {
namespace {

// The first line of a --trace file.
constexpr const char* kTraceHeader =
    "seconds\trequests_done\tgenerated_tokens\tkv_bytes\trunning\tprefill_tokens\t"
    "decode_tokens\n";

// The invalid lines, reported; a failure naming the first ones with stop_on_error, or else when
// no line is valid (the run would do nothing: most likely the wrong file, or a format mistake
// repeated on every line).
void report_invalid(const RequestSet& set, const BatchOptions& o) {
  if (set.errors.empty()) return;
  const std::string list = first_errors(set.errors);
  if (o.stop_on_error)
    fail(fmt::format("{} of the {} requests in '{}' are invalid:{}", set.errors.size(),
                     set.count, o.in, list),
         "fix those lines, or leave out --stop-on-error to run the valid requests and get an "
         "\"error\" line in --out for each invalid one");
  if (set.requests.empty())
    fail(fmt::format("none of the {} requests in '{}' is valid:{}", set.count, o.in, list),
         "fix those lines (docs/formats.md, \"Batch generation\"): nothing would run; --out is "
         "left as it is");
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

// One finished result appended to OUT, at once: a run stopped by a failed write keeps what
// OUT held (`kept` results) for a resume, and loses none of the work after it unsaid.
void append_result(std::FILE* out, const std::string& line, const std::string& path, size_t kept) {
  errno = 0;
  if (std::fprintf(out, "%s\n", line.c_str()) >= 0 && std::fflush(out) == 0) return;
  const int err = errno;
  fail(fmt::format("cannot append a result to --out '{}': {} ({} results are in it; the "
                   "requests running now are lost)",
                   path, std::strerror(err), kept),
       io_error_hint(err, path, "check the file system of --out") +
           "; then run the same command again: it resumes after the results kept");
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

// The result line of a finished request.
std::string result_of(const GenerationRequest& q, const Generation& g,
                      const data::Tokenizer& tok) {
  GenerationResult r;
  r.index = q.index;
  r.key = q.key;
  r.prompt_tokens = q.prompt_tokens();
  r.token_ids = g.tokens;
  r.text = continuation_text(tok, q.context, g.tokens);
  r.finish = g.finish;
  return result_line(r);
}

// The requests without a result in OUT yet, said when there are some.
std::vector<const GenerationRequest*> still_to_run(const RequestSet& set,
                                                  const std::map<int64_t, std::string>& done,
                                                  const std::string& out) {
  std::vector<const GenerationRequest*> todo;
  for (const GenerationRequest& q : set.requests)
    if (!done.count(q.index)) todo.push_back(&q);
  if (!done.empty())
    std::fprintf(stderr, "resuming: %zu of the %lld requests already have results in %s\n",
                 done.size(), static_cast<long long>(set.count), out.c_str());
  return todo;
}

// OUT in index order, the invalid lines among the results.
void write_in_order(const std::string& path, std::map<int64_t, std::string> lines,
                    const RequestSet& set) {
  for (const RequestError& e : set.errors) lines[e.index] = error_line(e);
  std::string text;
  for (const auto& [index, line] : lines) text += line + "\n";
  write_file_atomic(path, text);
}

}  // namespace

bool is_batch_trace(const std::string& contents) { return contents.rfind(kTraceHeader, 0) == 0; }

BatchSummary run_generation_batch(Model& model, const data::Tokenizer& tok,
                                  const BatchOptions& o) {
  const RequestSet set = read_generation_requests(o.in, tok, model.config().max_seq_len,
                                                  o.defaults);
  std::map<int64_t, std::string> lines = read_finished_results(o.out, set);
  report_invalid(set, o);
  const std::vector<const GenerationRequest*> todo = still_to_run(set, lines, o.out);
  BatchSummary s;
  s.requests = set.count;
  s.invalid = static_cast<int64_t>(set.errors.size());
  s.already_done = static_cast<int64_t>(lines.size());
  for (const GenerationRequest* q : todo)
    s.prompt_tokens += static_cast<int64_t>(q->context.size());

  GenerationEngine engine(model, tok.eos_id(), o.engine);
  engine.check_budget(todo);  // before OUT is touched
  std::FILE* trace = o.trace.empty() ? nullptr : std::fopen(o.trace.c_str(), "wb");
  if (!o.trace.empty() && !trace)
    fail(fmt::format("cannot write --trace '{}'", o.trace),
         "check that its directory exists and is writable");
  if (trace) std::fputs(kTraceHeader, trace);
  // A regular OUT gets each result as it finishes (what a resume reads back); a pipe or
  // device (/dev/stdout) gets the results once, in request order, at the end.
  std::FILE* out = is_stream_file(o.out) ? nullptr : open_for_append(o.out, lines);
  const double start = now_seconds();
  Progress progress("generate --batch", static_cast<int64_t>(todo.size()), "requests");
  const EngineStats stats = engine.run(
      todo,
      [&](const GenerationRequest& q, const Generation& g) {
        const std::string line = result_of(q, g, tok);
        if (out) append_result(out, line, o.out, lines.size());
        lines[q.index] = line;
      },
      [&](const EngineStats& e) {
        if (trace)
          std::fprintf(trace, "%.4f\t%lld\t%lld\t%lld\t%lld\t%lld\t%lld\n",
                       now_seconds() - start, static_cast<long long>(e.requests_done),
                       static_cast<long long>(e.generated_tokens),
                       static_cast<long long>(e.kv_bytes), static_cast<long long>(e.running),
                       static_cast<long long>(e.prefill_tokens),
                       static_cast<long long>(e.decode_tokens));
        if (o.quiet) return;
        progress.update(e.requests_done,
                        fmt::format("{:.0f} tokens/s, KV {}",
                                    e.generated_tokens / std::max(1e-9, now_seconds() - start),
                                    format_bytes(static_cast<double>(e.kv_bytes))));
      });
  if (!o.quiet && !todo.empty()) progress.finish();
  if (out) std::fclose(out);
  errno = 0;
  const bool trace_failed = trace && (std::fflush(trace) != 0 || std::ferror(trace) != 0);
  const int trace_errno = errno != 0 ? errno : EIO;
  if (trace) std::fclose(trace);
  s.seconds = now_seconds() - start;
  s.evictions = stats.evictions;
  s.generated = stats.requests_done;
  s.generated_tokens = stats.generated_tokens;
  s.prefill_tokens = stats.prefill_tokens;
  s.shared_prefix_tokens = s.prompt_tokens - stats.prefill_tokens;
  s.steps = stats.steps;
  s.peak_kv_bytes = stats.peak_kv_bytes;
  s.kv_bytes_at_end = stats.kv_bytes;
  write_in_order(o.out, lines, set);
  if (trace_failed)
    fail(fmt::format("cannot write --trace '{}': {} (the results in '{}' are complete)", o.trace,
                     std::strerror(trace_errno), o.out),
         io_error_hint(trace_errno, o.trace, "check the file system of the trace"));
  return s;
}

}  // namespace foundry::infer
