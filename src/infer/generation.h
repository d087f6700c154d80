// One request's generation: its context through the model's decoder, then tokens sampled one
// at a time until the end-of-sequence token, the request's token budget or model.max_seq_len.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "infer/sampling.h"
#include "model/model.h"

namespace foundry::infer {

enum class FinishReason { length, eos };
const char* finish_reason_name(FinishReason reason);  // "length" | "eos"

struct Generation {
  std::vector<int32_t> tokens;  // generated, without the end-of-sequence token
  FinishReason finish = FinishReason::length;
};

// The tokens a context can grow by: max_new_tokens, or fewer where context + new tokens
// would pass model.max_seq_len.
int64_t new_token_room(const ModelConfig& config, int64_t context_tokens, int64_t max_new_tokens);

// Feeds tokens [n] to the sequence whose caches are `chain` (its last segment takes them, at
// its next positions), in runs of up to state.batch tokens a step (Model::decode_rows: each
// token's logits are those of decoding it alone); returns the last one's logits
// [padded_vocab], valid until the next step on `state`. n ≥ 1.
const float* feed_tokens(Model& model, Model::DecodeState& state,
                         const std::vector<Model::KvSegment*>& chain, const int32_t* tokens,
                         int64_t n);

// Tokens of a prompt computed in one step (the runs of feed_tokens in generate).
constexpr int64_t kPromptRun = 64;

// Continues `context` (token ids, the document's leading EOS first, as training streams
// documents) by up to new_token_room(...) tokens, stopping before `eos_id`. Sampling draws
// from Rng(seed) alone: the same request and seed give the same tokens. The context must be
// non-empty and shorter than model.max_seq_len (Error otherwise).
Generation generate(Model& model, const std::vector<int32_t>& context, int64_t max_new_tokens,
                    int32_t eos_id, const SamplingOptions& sampling, uint64_t seed);

}  // namespace foundry::infer
