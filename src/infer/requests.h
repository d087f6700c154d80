// The files of `foundry generate --batch`: requests in (JSONL, one a line), results out (JSONL,
// one a line, in the input's order), and what an earlier, interrupted run already wrote.
//
// A request: {"prompt": "text"} or {"prompt_ids": [ids]}, and optionally "max_new_tokens",
// "temperature", "top_k", "top_p", "seed", "ignore_eos" (the command's options give the
// defaults; the seed's default is --seed plus the request's index). Blank lines are skipped; request i is the i-th
// line that is not blank. A line that is not a valid request is reported by its line number
// and leaves the others to run.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "infer/generation.h"
#include "infer/sampling.h"

namespace foundry::infer {

struct RequestDefaults {
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;
  uint64_t seed = 0;
  bool ignore_eos = false;
  // What computes the results (a hash of the checkpoint, tokenizer, precision and device
  // kind; 0: not said): part of every request's key, so OUT's results of another model are not
  // kept.
  uint64_t model = 0;
};

struct GenerationRequest {
  int64_t index = 0;             // among the file's requests, from 0
  int64_t line = 0;              // in the file, from 1
  std::vector<int32_t> context;  // the document's leading EOS, then the prompt's tokens
  int64_t max_new_tokens = 0;
  SamplingOptions sampling;
  uint64_t seed = 0;
  bool ignore_eos = false;  // generate max_new_tokens whatever the tokens (no stop at EOS)
  uint64_t key = 0;         // a hash of the line and the model: a result in OUT belongs to the
                            // request (and model) it names
  int64_t prompt_tokens() const { return static_cast<int64_t>(context.size()) - 1; }
};

struct RequestError {
  int64_t index = 0, line = 0;
  std::string message;  // names the key and the fix
};
// The first five errors, a line each ("\n  line 3: ..."), and how many more there are.
std::string first_errors(const std::vector<RequestError>& errors);

struct RequestSet {
  std::vector<GenerationRequest> requests;  // the valid ones, by index
  std::vector<RequestError> errors;         // the others, by index
  int64_t count = 0;                        // requests in the file, valid or not
};

// Reads `path`: each request tokenized with `tok` (prompt_ids checked against its vocabulary)
// and checked against `max_seq_len` (the context must leave room for one new token). Fails
// (Error) only on a file it cannot read or one with no requests.
RequestSet read_generation_requests(const std::string& path, const data::Tokenizer& tok,
                                    int64_t max_seq_len, const RequestDefaults& defaults);

struct GenerationResult {
  int64_t index = 0;
  uint64_t key = 0;
  int64_t prompt_tokens = 0;
  std::vector<int32_t> token_ids;
  std::string text;  // what the tokens add to the prompt's text
  FinishReason finish = FinishReason::length;
};

// One line of OUT (no newline): {"index", "text", "token_ids", "finish_reason",
// "prompt_tokens", "generated_tokens", "request"}; an invalid request's line is
// {"index", "line", "error"}.
std::string result_line(const GenerationResult& result);
std::string error_line(const RequestError& error);

// Where a line is in its file: its first byte, and its length without the newline.
struct LineSpan {
  int64_t offset = 0, bytes = 0;
};

// The results an earlier run wrote to `out_path` (none when it does not exist), by index, for
// the requests of `set`: where their lines are (the file is read a line at a time; a request's
// last line counts). A last line cut short (a killed run: `{"…` without its newline) is
// dropped; error lines are not results (they are written again). Fails (Error, naming the
// file and line) when OUT holds something else: a line that is not a result of `generate
// --batch`, or a result whose request is not the one at its index in `set` (OUT belongs to
// another input).
std::map<int64_t, LineSpan> read_finished_results(const std::string& out_path,
                                                  const RequestSet& set);

}  // namespace foundry::infer
