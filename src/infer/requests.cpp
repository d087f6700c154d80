#include "infer/requests.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "base/config_reader.h"
#include "base/error.h"
#include "base/hash.h"
#include "base/io.h"

namespace foundry::infer {
namespace {

using nlohmann::json;

const std::set<std::string> kRequestKeys = {"prompt",      "prompt_ids", "max_new_tokens",
                                            "temperature", "top_k",      "top_p",
                                            "seed",        "ignore_eos"};

// A request line parsed, or the reason it is not one (thrown as a plain message).
struct LineError {
  std::string message;
};

double number(const json& j, const char* key, double low, double high, const char* range) {
  if (!j.is_number())
    throw LineError{fmt::format("\"{}\" is {}, not a number", key, j.dump())};
  const double x = j.get<double>();
  if (!(x >= low && x <= high))
    throw LineError{fmt::format("\"{}\" is {}; it must be {}", key, j.dump(), range)};
  return x;
}

int64_t integer(const json& j, const char* key, int64_t low, int64_t high, const char* range) {
  if (!j.is_number_integer())
    throw LineError{fmt::format("\"{}\" is {}, not an integer", key, j.dump())};
  const int64_t x = j.get<int64_t>();
  if (x < low || x > high)
    throw LineError{fmt::format("\"{}\" is {}; it must be {}", key, j.dump(), range)};
  return x;
}

std::vector<int32_t> prompt_of(const json& r, const data::Tokenizer& tok) {
  const bool text = r.contains("prompt"), ids = r.contains("prompt_ids");
  if (text == ids)
    throw LineError{text ? "it has both \"prompt\" and \"prompt_ids\": give one"
                         : "it has neither \"prompt\" (text) nor \"prompt_ids\" (token ids)"};
  if (text) {
    if (!r["prompt"].is_string())
      throw LineError{fmt::format("\"prompt\" is {}, not a string", r["prompt"].dump())};
    return tok.encode(r["prompt"].get<std::string>());
  }
  const json& a = r["prompt_ids"];
  if (!a.is_array())
    throw LineError{fmt::format("\"prompt_ids\" is {}, not an array of token ids", a.dump())};
  std::vector<int32_t> out;
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_number_integer() || a[i].get<int64_t>() < 0 ||
        a[i].get<int64_t>() >= tok.vocab_size())
      throw LineError{fmt::format("\"prompt_ids\"[{}] is {}: token ids are integers in [0, {})",
                                  i, a[i].dump(), tok.vocab_size())};
    out.push_back(a[i].get<int32_t>());
  }
  return out;
}

GenerationRequest parse_request(const std::string& text, int64_t index,
                                const data::Tokenizer& tok, int64_t max_seq_len,
                                const RequestDefaults& d) {
  json r;
  std::string repeated;
  try {
    r = parse_json_noting_repeats(text, repeated);
  } catch (const json::parse_error& e) {
    throw LineError{fmt::format("not JSON ({})", e.what())};
  }
  if (!repeated.empty())
    throw LineError{fmt::format("\"{}\" appears twice (JSON would keep only the last)", repeated)};
  if (!r.is_object()) throw LineError{"not a JSON object"};
  for (const auto& item : r.items())
    if (!kRequestKeys.count(item.key()))
      throw LineError{fmt::format(
          "unknown key \"{}\" (a request has prompt or prompt_ids, max_new_tokens, "
          "temperature, top_k, top_p, seed, ignore_eos)",
          item.key())};
  GenerationRequest q;
  q.context.push_back(tok.eos_id());  // training streams documents after an EOS
  const std::vector<int32_t> prompt = prompt_of(r, tok);
  q.context.insert(q.context.end(), prompt.begin(), prompt.end());
  if (static_cast<int64_t>(q.context.size()) >= max_seq_len)
    throw LineError{fmt::format(
        "the prompt is {} tokens ({} with the leading EOS); model.max_seq_len is {}, so no "
        "token fits after it: shorten the prompt",
        prompt.size(), q.context.size(), max_seq_len)};
  q.max_new_tokens = r.contains("max_new_tokens")
                         ? integer(r["max_new_tokens"], "max_new_tokens", 1, int64_t{1} << 20,
                                   "between 1 and 2^20")
                         : d.max_new_tokens;
  q.sampling = d.sampling;
  if (r.contains("temperature"))
    q.sampling.temperature = number(r["temperature"], "temperature", 0, 100, "in [0, 100]");
  if (r.contains("top_k"))
    q.sampling.top_k =
        integer(r["top_k"], "top_k", 0, int64_t{1} << 24, "from 0 (all) to 16777216");
  if (r.contains("top_p"))
    q.sampling.top_p = number(r["top_p"], "top_p", 0, 1, "in [0, 1]");
  q.seed = d.seed + static_cast<uint64_t>(index);
  if (r.contains("seed")) {
    if (!r["seed"].is_number_unsigned())
      throw LineError{fmt::format("\"seed\" is {}, not an integer ≥ 0", r["seed"].dump())};
    q.seed = r["seed"].get<uint64_t>();
  }
  q.ignore_eos = d.ignore_eos;
  if (r.contains("ignore_eos")) {
    if (!r["ignore_eos"].is_boolean())
      throw LineError{fmt::format("\"ignore_eos\" is {}, not true or false",
                                  r["ignore_eos"].dump())};
    q.ignore_eos = r["ignore_eos"].get<bool>();
  }
  q.index = index;
  // What decides the result: the line, the settings the command's options filled in, and
  // the model.
  std::string identity =
      fmt::format("{}\n{} {} {} {} {}{}", text, q.max_new_tokens, q.sampling.temperature,
                  q.sampling.top_k, q.sampling.top_p, q.seed, q.ignore_eos ? " ignore_eos" : "");
  if (d.model != 0) identity += fmt::format(" model {:016x}", d.model);
  q.key = hash64(identity.data(), identity.size());
  return q;
}

}  // namespace

RequestSet read_generation_requests(const std::string& path, const data::Tokenizer& tok,
                                    int64_t max_seq_len, const RequestDefaults& defaults) {
  std::ifstream in =
      open_text_file(path, "the requests file",
                     "pass a JSONL file with one request a line, e.g. {\"prompt\": \"...\", "
                     "\"max_new_tokens\": 64}");
  RequestSet set;
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const int64_t index = set.count++;
    try {
      GenerationRequest q = parse_request(text, index, tok, max_seq_len, defaults);
      q.line = line;
      set.requests.push_back(std::move(q));
    } catch (const LineError& e) {
      set.errors.push_back({index, line, e.message});
    }
  }
  if (set.count == 0)
    fail(fmt::format("the requests file '{}' has no requests", path),
         "write one JSON object a line, e.g. {\"prompt\": \"...\", \"max_new_tokens\": 64}");
  return set;
}

std::string first_errors(const std::vector<RequestError>& errors) {
  std::string list;
  for (size_t i = 0; i < errors.size() && i < 5; ++i)
    list += fmt::format("\n  line {}: {}", errors[i].line, errors[i].message);
  if (errors.size() > 5) list += fmt::format("\n  ... and {} more", errors.size() - 5);
  return list;
}

std::string result_line(const GenerationResult& r) {
  json j = {{"index", r.index},
            {"text", r.text},
            {"token_ids", r.token_ids},
            {"finish_reason", finish_reason_name(r.finish)},
            {"prompt_tokens", r.prompt_tokens},
            {"generated_tokens", r.token_ids.size()},
            {"request", hash64_hex(r.key)}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string error_line(const RequestError& e) {
  return json{{"index", e.index}, {"line", e.line}, {"error", e.message}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

std::map<int64_t, LineSpan> read_finished_results(const std::string& out_path,
                                                  const RequestSet& set) {
  std::map<int64_t, LineSpan> done;
  if (is_stream_file(out_path)) return done;  // a pipe or device holds no earlier results
  std::ifstream in(out_path, std::ios::binary);
  if (!in) return done;
  std::map<int64_t, const GenerationRequest*> by_index;
  for (const GenerationRequest& q : set.requests) by_index[q.index] = &q;
  const auto not_ours = [&](int64_t number, const std::string& why) {
    fail(fmt::format("--out '{}' line {}: {}", out_path, number, why),
         "it is not the results of these requests: pass another --out, or remove the file "
         "to start over");
  };
  int64_t offset = 0, number = 0;
  for (std::string line; std::getline(in, line); offset += static_cast<int64_t>(line.size()) + 1) {
    ++number;
    // A killed run's last line has no newline yet; every finished line has one.
    const bool cut_short = in.eof();
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error&) {
      // (a result line starts with its first key, "finish_reason", or an error line's "error";
      // a line cut within that key is a start of it)
      const auto starts_as = [&](std::string_view head) {
        return line.rfind(head, 0) == 0 || head.rfind(line, 0) == 0;
      };
      if (cut_short && (starts_as("{\"finish_reason\":") || starts_as("{\"error\":"))) break;
      not_ours(number, "not JSON");
    }
    if (!j.is_object() || !j.contains("index") || !j["index"].is_number_integer())
      not_ours(number, "not a result of `foundry generate --batch` (no \"index\")");
    const int64_t index = j["index"].get<int64_t>();
    if (j.contains("error")) continue;
    if (!j.contains("request") || !j.contains("token_ids") || !j.contains("text"))
      not_ours(number, "not a result of `foundry generate --batch`");
    const auto q = by_index.find(index);
    if (q == by_index.end() || j["request"] != hash64_hex(q->second->key))
      not_ours(number, fmt::format("the result of request {} was made for another request (its "
                                   "prompt, or -n, --seed, --temperature, --top-k, --top-p or "
                                   "--ignore-eos where it does not say), or by another model "
                                   "(checkpoint, tokenizer, precision or device)",
                                   index));
    done[index] = {offset, static_cast<int64_t>(line.size())};
  }
  if (in.bad())
    fail(fmt::format("cannot read --out '{}': {}", out_path, std::strerror(errno)),
         io_error_hint(errno, out_path, "check the file system of --out"));
  return done;
}

}  // namespace foundry::infer
