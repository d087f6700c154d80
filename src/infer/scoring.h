// Multiple-choice scoring (`foundry eval --choices`): each candidate continuation's
// log-likelihood under the model, its context computed once for all its candidates.
//
// A line: {"context": "...", "choices": ["...", "..."], "answer": 1} ("answer", the index of
// the right choice, is optional). The context gets the document's leading EOS; each choice is
// tokenized on its own and follows the context directly (write " Paris", with its space, where
// the text needs one). A line that is not a valid item is reported by its number and skipped.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "infer/requests.h"
#include "model/model.h"

namespace foundry::infer {

struct ChoiceItem {
  int64_t index = 0, line = 0;
  std::vector<int32_t> context;               // the leading EOS, then the context's tokens
  std::vector<std::vector<int32_t>> choices;  // each non-empty
  int64_t answer = -1;                        // -1: not given
};

struct ChoiceFile {
  std::vector<ChoiceItem> items;
  std::vector<RequestError> errors;  // the invalid lines
  int64_t count = 0;                                    // items in the file, valid or not
};

// Reads `path`; each context + choice must fit model.max_seq_len. Fails (Error) only on a file
// it cannot read or one with no items.
ChoiceFile read_choice_items(const std::string& path, const data::Tokenizer& tok,
                             int64_t max_seq_len);

struct ChoiceScore {
  std::vector<double> token_logprobs;  // log p(token | everything before it), per choice token
  double sum = 0;                      // their sum: the choice's log-likelihood
  double mean() const { return token_logprobs.empty() ? 0 : sum / token_logprobs.size(); }
};

// Every choice of `item` scored: the context decoded once into a shared segment, then every
// choice's tokens over it, as many a step as `state` (Model::new_rows_state) has rows. A
// choice's scores are the bits of scoring it alone, whatever the rows beside it.
std::vector<ChoiceScore> score_choices(Model& model, Model::DecodeState& state,
                                       const ChoiceItem& item);

struct ChoiceSummary {
  int64_t items = 0, invalid = 0, with_answer = 0;
  int64_t correct = 0, correct_by_mean = 0;  // argmax of the sum, of the per-token mean
};
// Every item of `in` scored; with `out`, one line per item in input order: {"index",
// "scores" (each choice's summed log-likelihood), "mean_logprobs", "token_logprobs",
// "prediction" (the choice with the highest sum), and with an answer "answer", "correct"}; an
// invalid line gives {"index", "line", "error"} and a warning. `progress` after each item.
ChoiceSummary run_choice_eval(Model& model, const data::Tokenizer& tok, const std::string& in,
                              const std::string& out, bool quiet);
// Whether `contents` is such an OUT: every non-empty line a JSON object with "index" (what
// --out may replace).
bool is_choice_scores(const std::string& contents);

// log softmax(logits[0 … v))[token], in double.
double token_logprob(const float* logits, int64_t v, int32_t token);

}  // namespace foundry::infer
