#include "infer/scoring.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "base/config_reader.h"
#include "base/error.h"
#include "base/io.h"
#include "base/progress.h"
#include "ckpt/checkpoint_dir.h"
#include "infer/generation.h"

namespace foundry::infer {
namespace {

using nlohmann::json;

struct LineError {
  std::string message;
};

// The tokens of choice `c` as they follow the context in running text: those of context and
// choice written together, after the context's own (`context_ids`). Encoding the choice alone
// would give it the start of a document's tokens (the tokenizer's dummy "▁" for the space
// before a first word, then the choice's own space as a second). A choice that merges with the
// context's last word into one token has no tokens of its own to score.
std::vector<int32_t> choice_tokens(const data::Tokenizer& tok, const std::string& context,
                                   const std::vector<int32_t>& context_ids,
                                   const std::string& choice, size_t c) {
  const std::vector<int32_t> whole = tok.encode(context + choice);
  if (whole.size() <= context_ids.size() ||
      !std::equal(context_ids.begin(), context_ids.end(), whole.begin())) {
    // The space belongs to the word after it (the tokenizer's pieces start with it).
    const bool context_ends_in_space = !context.empty() && context.back() == ' ';
    const std::string fix =
        context_ends_in_space
            ? fmt::format(
                  "end the context before its last space and start the choice with it "
                  "(\" {}\")",
                  choice)
            : fmt::format(
                  "start the choice with the space before it (\" {}\"), or end the "
                  "context before the word the choice completes",
                  choice);
    throw LineError{fmt::format(
        "\"choices\"[{}] ({}) runs into the context's last word: their tokens are not the "
        "context's followed by the choice's; {}",
        c, json(choice).dump(), fix)};
  }
  return std::vector<int32_t>(whole.begin() + static_cast<std::ptrdiff_t>(context_ids.size()),
                              whole.end());
}

ChoiceItem parse_item(const std::string& text, const data::Tokenizer& tok, int64_t max_seq_len) {
  json j;
  std::string repeated;
  try {
    j = parse_json_noting_repeats(text, repeated);
  } catch (const json::parse_error& e) {
    throw LineError{fmt::format("not JSON ({})", e.what())};
  }
  if (!repeated.empty())
    throw LineError{fmt::format("\"{}\" appears twice (JSON would keep only the last)", repeated)};
  if (!j.is_object()) throw LineError{"not a JSON object"};
  for (const auto& item : j.items())
    if (item.key() != "context" && item.key() != "choices" && item.key() != "answer")
      throw LineError{fmt::format("unknown key \"{}\" (an item has context, choices, answer)",
                                  item.key())};
  if (!j.contains("context")) throw LineError{"\"context\" (a string) is missing"};
  if (!j["context"].is_string())
    throw LineError{fmt::format("\"context\" must be a string, got {}", j["context"].dump())};
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].size() < 2)
    throw LineError{"\"choices\" must be an array of at least two strings"};
  ChoiceItem item;
  const std::string context = j["context"].get<std::string>();
  const std::vector<int32_t> context_ids = tok.encode(context);
  item.context.push_back(tok.eos_id());
  item.context.insert(item.context.end(), context_ids.begin(), context_ids.end());
  for (size_t c = 0; c < j["choices"].size(); ++c) {
    const json& choice = j["choices"][c];
    if (!choice.is_string() || choice.get<std::string>().empty())
      throw LineError{fmt::format("\"choices\"[{}] is {}: choices are non-empty strings", c,
                                  choice.dump())};
    item.choices.push_back(choice_tokens(tok, context, context_ids, choice.get<std::string>(), c));
    const int64_t total =
        static_cast<int64_t>(item.context.size() + item.choices.back().size());
    if (total > max_seq_len)
      throw LineError{fmt::format("context and choice {} are {} tokens with the leading EOS; "
                                  "model.max_seq_len is {}: shorten them",
                                  c, total, max_seq_len)};
  }
  if (j.contains("answer")) {
    const json& a = j["answer"];
    if (!a.is_number_integer() || a.get<int64_t>() < 0 ||
        a.get<int64_t>() >= static_cast<int64_t>(item.choices.size()))
      throw LineError{fmt::format("\"answer\" is {}: it is the index of a choice, 0 to {}",
                                  a.dump(), item.choices.size() - 1)};
    item.answer = a.get<int64_t>();
  }
  return item;
}

}  // namespace

ChoiceFile read_choice_items(const std::string& path, const data::Tokenizer& tok,
                             int64_t max_seq_len) {
  std::ifstream in = open_text_file(
      path, "the choices file",
      "pass a JSONL file with one item a line, e.g. {\"context\": \"...\", \"choices\": "
      "[\"...\", \"...\"], \"answer\": 0}");
  ChoiceFile f;
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const int64_t index = f.count++;
    try {
      ChoiceItem item = parse_item(text, tok, max_seq_len);
      item.index = index;
      item.line = line;
      f.items.push_back(std::move(item));
    } catch (const LineError& e) {
      f.errors.push_back({index, line, e.message});
    }
  }
  if (f.count == 0)
    fail(fmt::format("the choices file '{}' has no items", path),
         "write one JSON object a line: {\"context\": \"...\", \"choices\": [\"...\", \"...\"]}");
  return f;
}

bool is_choice_scores(const std::string& contents) {
  std::stringstream lines(contents);
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("index") || !j["index"].is_number_integer()) return false;
    // A scored item, or an invalid one's error line.
    const bool scored = j.contains("scores") && j.contains("prediction");
    const bool error = j.contains("error") && j.contains("line");
    if (!scored && !error) return false;
  }
  return true;
}

double token_logprob(const float* logits, int64_t v, int32_t token) {
  // As sampling refuses them: a score from non-finite logits would be NaN, and a NaN score
  // compares as neither better nor worse, so the prediction would be made up.
  const int64_t bad = std::count_if(logits, logits + v, [](float x) { return !std::isfinite(x); });
  if (bad > 0)
    fail(fmt::format("{} of the {} logits are not finite", bad, v),
         "the weights are finite, so the forward pass overflowed; try --set "
         "train.precision=fp32, or an earlier checkpoint (--checkpoint)");
  double max_logit = -INFINITY;
  for (int64_t i = 0; i < v; ++i) max_logit = std::max(max_logit, double(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < v; ++i) sum += std::exp(double(logits[i]) - max_logit);
  return double(logits[token]) - max_logit - std::log(sum);
}

std::vector<ChoiceScore> score_choices(Model& model, Model::DecodeState& state,
                                       const ChoiceItem& item) {
  const int64_t Vp = model.config().padded_vocab(), V = model.config().vocab_size;
  const int64_t n = static_cast<int64_t>(item.context.size());
  const int64_t k = static_cast<int64_t>(item.choices.size());
  // The context, once: its last position's logits predict every choice's first token.
  Model::KvSegment context = model.new_kv_segment(0, n);
  const float* logits = feed_tokens(model, state, {&context}, item.context.data(), n);
  std::vector<float> after_context(logits, logits + Vp);

  std::vector<ChoiceScore> scores(k);
  std::vector<Model::KvSegment> own;
  own.reserve(k);
  for (int64_t c = 0; c < k; ++c) {
    const int64_t len = static_cast<int64_t>(item.choices[c].size());
    scores[c].token_logprobs.push_back(token_logprob(after_context.data(), V, item.choices[c][0]));
    // Room for every choice token but the last (its logits are not needed).
    own.push_back(model.new_kv_segment(n, std::max<int64_t>(1, len - 1), &context));
  }
  // Choice tokens j = 0 … len − 2 go in, each choice's in order, as many a step as the state
  // has rows; each gives the log-probability of token j + 1.
  struct Fed {
    int64_t choice, j;
  };
  std::vector<Fed> feed;
  for (int64_t c = 0; c < k; ++c)
    for (int64_t j = 0; j + 1 < static_cast<int64_t>(item.choices[c].size()); ++j)
      feed.push_back({c, j});
  std::vector<Model::DecodeRow> rows;
  for (size_t at = 0; at < feed.size(); at += static_cast<size_t>(state.batch)) {
    const size_t end = std::min(feed.size(), at + static_cast<size_t>(state.batch));
    rows.clear();
    for (size_t f = at; f < end; ++f)
      rows.push_back({item.choices[feed[f].choice][feed[f].j], {&context, &own[feed[f].choice]}});
    const float* out = model.decode_rows(state, rows);
    for (size_t f = at; f < end; ++f) {
      const std::vector<int32_t>& choice = item.choices[feed[f].choice];
      scores[feed[f].choice].token_logprobs.push_back(
          token_logprob(out + static_cast<int64_t>(f - at) * Vp, V, choice[feed[f].j + 1]));
    }
  }
  for (ChoiceScore& s : scores)
    for (double lp : s.token_logprobs) s.sum += lp;
  return scores;
}

namespace {

// One item scored: its line of OUT, and its counts added to `s`.
std::string score_line(Model& model, Model::DecodeState& state, const ChoiceItem& item,
                       ChoiceSummary& s) {
  const std::vector<ChoiceScore> scores = score_choices(model, state, item);
  int64_t best = 0, best_mean = 0;
  json j = {{"index", item.index}};
  for (size_t c = 0; c < scores.size(); ++c) {
    j["scores"].push_back(scores[c].sum);
    j["mean_logprobs"].push_back(scores[c].mean());
    j["token_logprobs"].push_back(scores[c].token_logprobs);
    if (scores[c].sum > scores[best].sum) best = static_cast<int64_t>(c);
    if (scores[c].mean() > scores[best_mean].mean()) best_mean = static_cast<int64_t>(c);
  }
  j["prediction"] = best;
  if (item.answer >= 0) {
    j["answer"] = item.answer;
    j["correct"] = best == item.answer;
    ++s.with_answer;
    s.correct += best == item.answer;
    s.correct_by_mean += best_mean == item.answer;
  }
  return j.dump();
}

}  // namespace

ChoiceSummary run_choice_eval(Model& model, const data::Tokenizer& tok, const std::string& in,
                              const std::string& out, bool quiet) {
  const ChoiceFile file = read_choice_items(in, tok, model.config().max_seq_len);
  ChoiceSummary s;
  s.items = file.count;
  s.invalid = static_cast<int64_t>(file.errors.size());
  if (file.items.empty())
    fail(fmt::format("none of the {} items in '{}' is valid:{}", file.count, in,
                     first_errors(file.errors)),
         "fix those lines (docs/formats.md, \"Multiple-choice items and scores\"): nothing would "
         "be scored; --out is left as it is");
  for (const RequestError& e : file.errors)
    warn(fmt::format("'{}' line {}: {} (skipped)", in, e.line, e.message));
  Model::DecodeState state = model.new_rows_state(kPromptRun);
  // OUT in index order as the items are scored (items and errors both come by index): a
  // regular file through its staging copy, replaced at the end; a pipe or device gets the
  // text at the end.
  std::optional<AtomicFileWriter> writer;
  if (!out.empty() && !is_stream_file(out)) writer.emplace(out);
  std::string text;
  const auto put = [&](const std::string& line) {
    if (writer) {
      writer->write(line);
      writer->write("\n", 1);
    } else if (!out.empty()) {
      text += line + "\n";
    }
  };
  auto error = file.errors.begin();
  const auto put_errors_before = [&](int64_t index) {
    for (; error != file.errors.end() && error->index < index; ++error) put(error_line(*error));
  };
  Progress progress("eval --choices", static_cast<int64_t>(file.items.size()), "items");
  int64_t scored = 0;
  for (const ChoiceItem& item : file.items) {
    put_errors_before(item.index);
    try {
      put(score_line(model, state, item, s));
    } catch (const Error& e) {
      fail(fmt::format("item {} (line {}): {}", item.index, item.line, e.what()), e.hint());
    }
    if (!quiet) progress.update(++scored);
  }
  put_errors_before(std::numeric_limits<int64_t>::max());
  if (!quiet && !file.items.empty()) progress.finish();
  if (writer)
    writer->commit();
  else if (!out.empty())
    write_file_atomic(out, text);
  return s;
}

}  // namespace foundry::infer
