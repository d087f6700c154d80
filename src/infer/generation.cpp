#include "infer/generation.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"

namespace foundry::infer {

const char* finish_reason_name(FinishReason reason) {
  return reason == FinishReason::eos ? "eos" : "length";
}

int64_t new_token_room(const ModelConfig& config, int64_t context_tokens,
                       int64_t max_new_tokens) {
  return std::max<int64_t>(0, std::min(max_new_tokens, config.max_seq_len - context_tokens));
}

Generation generate(Model& model, const std::vector<int32_t>& context, int64_t max_new_tokens,
                    int32_t eos_id, const SamplingOptions& sampling, uint64_t seed) {
  const ModelConfig& c = model.config();
  const int64_t n = static_cast<int64_t>(context.size());
  if (n == 0 || n >= c.max_seq_len)
    fail(fmt::format("the context is {} tokens; model.max_seq_len is {}", n, c.max_seq_len),
         "shorten the prompt");
  const int64_t room = new_token_room(c, n, max_new_tokens);
  Generation g;
  if (room == 0) return g;
  // Positions 0 … n + room − 2: the last new token is not fed back.
  Model::KvSegment sequence = model.new_kv_segment(0, n + room - 1);
  auto state = model.new_rows_state(std::min(n, kPromptRun));
  const float* logits = feed_tokens(model, state, {&sequence}, context.data(), n);
  Rng rng(seed);
  while (true) {
    const int64_t position = n + static_cast<int64_t>(g.tokens.size()) - 1;
    const int32_t next = sample_token(logits, c.vocab_size, position, sampling, rng);
    if (next == eos_id) {
      g.finish = FinishReason::eos;
      break;
    }
    g.tokens.push_back(next);
    if (static_cast<int64_t>(g.tokens.size()) >= room) break;
    logits = model.decode_rows(state, {{next, {&sequence}}});
  }
  return g;
}

const float* feed_tokens(Model& model, Model::DecodeState& state,
                         const std::vector<Model::KvSegment*>& chain, const int32_t* tokens,
                         int64_t n) {
  FOUNDRY_CHECK(n >= 1);
  const float* logits = nullptr;
  std::vector<Model::DecodeRow> rows;
  for (int64_t t = 0; t < n; t += state.batch) {
    const int64_t run = std::min(state.batch, n - t);
    rows.clear();
    for (int64_t k = 0; k < run; ++k) rows.push_back({tokens[t + k], chain});
    logits = model.decode_rows(state, rows) + (run - 1) * model.config().padded_vocab();
  }
  return logits;
}

}  // namespace foundry::infer
