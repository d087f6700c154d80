#include "infer/sampling.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "base/error.h"

namespace foundry::infer {

int32_t sample_token(const float* logits, int64_t v, int64_t position,
                     const SamplingOptions& options, Rng& rng) {
  const int64_t bad = std::count_if(logits, logits + v, [](float x) { return !std::isfinite(x); });
  if (bad > 0)
    fail(fmt::format("{} of the {} logits at position {} are not finite", bad, v, position),
         "the weights are finite, so the forward pass overflowed; try --set "
         "train.precision=fp32, or an earlier checkpoint (--checkpoint)");
  if (options.temperature <= 0) {
    int64_t best = 0;
    for (int64_t i = 1; i < v; ++i)
      if (logits[i] > logits[best]) best = i;
    return static_cast<int32_t>(best);
  }
  // Candidates by weight exp((logit − max) / temperature), heaviest first (ties: lower id).
  std::vector<std::pair<double, int32_t>> cand;
  cand.reserve(v);
  double max_logit = -INFINITY;
  for (int64_t i = 0; i < v; ++i) max_logit = std::max(max_logit, double(logits[i]));
  for (int64_t i = 0; i < v; ++i)
    cand.emplace_back(std::exp((logits[i] - max_logit) / options.temperature),
                      static_cast<int32_t>(i));
  std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  if (options.top_k > 0 && static_cast<int64_t>(cand.size()) > options.top_k)
    cand.resize(options.top_k);
  double total = 0;
  for (const auto& c : cand) total += c.first;
  if (options.top_p < 1.0) {
    double cum = 0;
    size_t keep = 0;
    while (keep < cand.size()) {
      cum += cand[keep].first / total;
      ++keep;
      if (cum >= options.top_p) break;
    }
    cand.resize(keep);
    total = 0;
    for (const auto& c : cand) total += c.first;
  }
  double r = rng.uniform() * total;
  for (const auto& c : cand) {
    r -= c.first;
    if (r <= 0) return c.second;
  }
  return cand.back().second;
}

}  // namespace foundry::infer
