// Choosing the next token from a model's logits: greedy (temperature 0), or a draw after
// temperature, top-k and top-p (nucleus) filtering. The draw depends only on the logits and
// the generator's state, so a request with its own seed samples the same tokens whatever else
// runs beside it.
#pragma once
#include <cstdint>

#include "base/rng.h"

namespace foundry::infer {

struct SamplingOptions {
  double temperature = 0.8;  // 0: greedy (the first of equal maxima)
  int64_t top_k = 0;         // keep the k most likely tokens (0: all)
  double top_p = 0.95;       // keep the most likely tokens up to this mass (1: all)
};

// A token from logits [v]. Fails unless every logit is finite (they are the model's output at
// `position`, named in the error), so there is always a candidate. Greedy draws nothing from
// `rng`; a sampled token draws one uniform number.
int32_t sample_token(const float* logits, int64_t v, int64_t position,
                     const SamplingOptions& options, Rng& rng);

}  // namespace foundry::infer
