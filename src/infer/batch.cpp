#include "infer/batch.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/format.h"
#include "base/io.h"
#include "base/progress.h"
#include "base/timer.h"
#include "ckpt/checkpoint_dir.h"
#include "infer/engine.h"
#include "infer/generation.h"
#include "train/signals.h"

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

// Rewrites `path` with one line per index of `spans` and `extra` together, in index order:
// those of `spans` read from where they are in the file as it is now, those of `extra` as
// given. Returns where each line of `spans` is in the new file.
std::map<int64_t, LineSpan> rewrite_in_order(const std::string& path,
                                             const std::map<int64_t, LineSpan>& spans,
                                             const std::map<int64_t, std::string>& extra) {
  std::map<int64_t, LineSpan> moved;
  const int fd = spans.empty() ? -1 : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (!spans.empty() && fd < 0)
    fail(fmt::format("cannot read --out '{}': {}", path, std::strerror(errno)),
         io_error_hint(errno, path, "check the file system of --out"));
  struct Close {
    int fd;
    ~Close() {
      if (fd >= 0) ::close(fd);
    }
  } close_fd{fd};
  AtomicFileWriter file(path);
  int64_t at = 0;
  std::string line;
  const auto put = [&](const std::string& text) {
    file.write(text);
    file.write("\n", 1);
    at += static_cast<int64_t>(text.size()) + 1;
  };
  auto s = spans.begin();
  auto e = extra.begin();
  while (s != spans.end() || e != extra.end()) {
    if (e != extra.end() && (s == spans.end() || e->first <= s->first)) {
      if (s != spans.end() && s->first == e->first) ++s;  // the given line stands
      put((e++)->second);
      continue;
    }
    line.resize(static_cast<size_t>(s->second.bytes));
    errno = 0;
    if (::pread(fd, line.data(), line.size(), s->second.offset) !=
        static_cast<ssize_t>(line.size()))
      fail(fmt::format("cannot read back --out '{}' (line at byte {}): {}", path, s->second.offset,
                       errno ? std::strerror(errno) : "the file is shorter"),
           "another process changed the file meanwhile: run the same command again to resume");
    moved[s->first] = {at, s->second.bytes};
    put(line);
    ++s;
  }
  file.commit();
  return moved;
}

// OUT as this run writes it. A regular file gets each result appended as it finishes (what a
// resume reads back) and the run keeps only where each line is: the file is rewritten in
// request order from itself at the end. A pipe or device (/dev/stdout) gets every line once,
// in request order, at the end: its lines are kept in memory until then.
class ResultsOut {
 public:
  // A regular OUT starts with the earlier run's results `kept` alone (its error lines and a
  // line cut short go), whole lines, opened to append.
  ResultsOut(const std::string& path, const std::map<int64_t, LineSpan>& kept)
      : path_(path), stream_(is_stream_file(path)) {
    if (stream_) return;
    spans_ = rewrite_in_order(path, kept, {});
    for (const auto& [index, span] : spans_) end_ = std::max(end_, span.offset + span.bytes + 1);
    out_ = std::fopen(path.c_str(), "ab");
    if (!out_)
      fail(fmt::format("cannot write --out '{}'", path),
           "check that its directory exists and is writable");
  }
  ~ResultsOut() {
    if (out_) std::fclose(out_);
  }
  ResultsOut(const ResultsOut&) = delete;
  ResultsOut& operator=(const ResultsOut&) = delete;

  // One finished result, appended to a regular OUT at once: a run stopped by a failed write
  // keeps what OUT held for a resume, and loses none of the work after it unsaid.
  void add(int64_t index, const std::string& line) {
    if (stream_) {
      lines_[index] = line;
      return;
    }
    errno = 0;
    if (std::fprintf(out_, "%s\n", line.c_str()) >= 0 && std::fflush(out_) == 0) {
      spans_[index] = {end_, static_cast<int64_t>(line.size())};
      end_ += static_cast<int64_t>(line.size()) + 1;
      return;
    }
    const int err = errno;
    fail(fmt::format("cannot append a result to --out '{}': {} ({} results are in it; the "
                     "requests running now are lost)",
                     path_, std::strerror(err), spans_.size()),
         io_error_hint(err, path_, "check the file system of --out") +
             "; then run the same command again: it resumes after the results kept");
  }

  // Every line in index order, the invalid requests' error lines among the results.
  void finish(const RequestSet& set) {
    std::map<int64_t, std::string> errors;
    for (const RequestError& e : set.errors) errors[e.index] = error_line(e);
    if (!stream_) {
      std::fclose(out_);
      out_ = nullptr;
      rewrite_in_order(path_, spans_, errors);
      return;
    }
    lines_.merge(errors);
    std::string text;
    for (const auto& [index, line] : lines_) text += line + "\n";
    write_file_atomic(path_, text);
  }

 private:
  std::string path_;
  bool stream_;
  std::FILE* out_ = nullptr;
  std::map<int64_t, LineSpan> spans_;     // a regular OUT's results
  int64_t end_ = 0;                       // its size
  std::map<int64_t, std::string> lines_;  // a stream's
};

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
                                                   const std::map<int64_t, LineSpan>& done,
                                                   const std::string& out) {
  std::vector<const GenerationRequest*> todo;
  for (const GenerationRequest& q : set.requests)
    if (!done.count(q.index)) todo.push_back(&q);
  if (!done.empty())
    std::fprintf(stderr, "resuming: %zu of the %lld requests already have results in %s\n",
                 done.size(), static_cast<long long>(set.count), out.c_str());
  return todo;
}

}  // namespace

bool is_batch_trace(const std::string& contents) { return contents.rfind(kTraceHeader, 0) == 0; }

namespace {

// --trace: a line per engine step; write errors are reported at the end (the results are
// complete by then).
class TraceFile {
 public:
  explicit TraceFile(const std::string& path) {
    if (path.empty()) return;
    file_ = std::fopen(path.c_str(), "wb");
    if (!file_)
      fail(fmt::format("cannot write --trace '{}'", path),
           "check that its directory exists and is writable");
    std::fputs(kTraceHeader, file_);
  }
  ~TraceFile() {
    if (file_) std::fclose(file_);
  }
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;

  void step(double seconds, const EngineStats& e) {
    if (!file_) return;
    std::fprintf(file_, "%.4f\t%lld\t%lld\t%lld\t%lld\t%lld\t%lld\n", seconds,
                 static_cast<long long>(e.requests_done),
                 static_cast<long long>(e.generated_tokens), static_cast<long long>(e.kv_bytes),
                 static_cast<long long>(e.running), static_cast<long long>(e.prefill_tokens),
                 static_cast<long long>(e.decode_tokens));
  }
  // Closes it: the errno of a write that failed (0: none did).
  int close() {
    if (!file_) return 0;
    errno = 0;
    const bool failed = std::fflush(file_) != 0 || std::ferror(file_) != 0;
    const int err = failed ? (errno != 0 ? errno : EIO) : 0;
    std::fclose(std::exchange(file_, nullptr));
    return err;
  }

 private:
  std::FILE* file_ = nullptr;
};

// Thrown from the engine's progress callback after a SIGINT or SIGTERM: the run stops after
// the step it was in, with the results finished so far.
struct Interrupted {};

}  // namespace

BatchSummary run_generation_batch(Model& model, const data::Tokenizer& tok,
                                  const BatchOptions& o) {
  const RequestSet set = read_generation_requests(o.in, tok, model.config().max_seq_len,
                                                  o.defaults);
  const std::map<int64_t, LineSpan> kept = read_finished_results(o.out, set);
  report_invalid(set, o);
  const std::vector<const GenerationRequest*> todo = still_to_run(set, kept, o.out);
  BatchSummary s;
  s.requests = set.count;
  s.invalid = static_cast<int64_t>(set.errors.size());
  s.already_done = static_cast<int64_t>(kept.size());
  for (const GenerationRequest* q : todo)
    s.prompt_tokens += static_cast<int64_t>(q->context.size());

  GenerationEngine engine(model, tok.eos_id(), o.engine);
  engine.check_budget(todo);  // before OUT is touched
  TraceFile trace(o.trace);
  ResultsOut out(o.out, kept);
  // From here a signal stops the run after its step, and OUT is still written in order.
  StopSignals signals(/*block_on_workers=*/true);  // decoding runs oneDNN on OpenMP threads
  const double start = now_seconds();
  Progress progress("generate --batch", static_cast<int64_t>(todo.size()), "requests");
  EngineStats stats;
  try {
    stats = engine.run(
        todo,
        [&](const GenerationRequest& q, const Generation& g) {
          out.add(q.index, result_of(q, g, tok));
        },
        [&](const EngineStats& e) {
          stats = e;
          trace.step(now_seconds() - start, e);
          if (!o.quiet)
            progress.update(e.requests_done,
                            fmt::format("{:.0f} tokens/s, KV {}",
                                        e.generated_tokens / std::max(1e-9, now_seconds() - start),
                                        format_bytes(static_cast<double>(e.kv_bytes))));
          if (signals.received() && e.requests_done < static_cast<int64_t>(todo.size()))
            throw Interrupted{};
        });
    if (!o.quiet && !todo.empty()) progress.finish();
  } catch (const Interrupted&) {
    s.interrupted_by = signals.received();
  }
  const int trace_errno = trace.close();
  s.seconds = now_seconds() - start;
  s.evictions = stats.evictions;
  s.generated = stats.requests_done;
  s.generated_tokens = stats.generated_tokens;
  s.prefill_tokens = stats.prefill_tokens;
  s.shared_prefix_tokens = s.prompt_tokens - stats.prefill_tokens;
  s.steps = stats.steps;
  s.peak_kv_bytes = stats.peak_kv_bytes;
  s.kv_bytes_at_end = stats.kv_bytes;
  out.finish(set);
  if (trace_errno != 0)
    fail(fmt::format("cannot write --trace '{}': {} (the results in '{}' are {})", o.trace,
                     std::strerror(trace_errno), o.out,
                     s.interrupted_by ? "those finished" : "complete"),
         io_error_hint(trace_errno, o.trace, "check the file system of the trace"));
  return s;
}

}  // namespace foundry::infer
