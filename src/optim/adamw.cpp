#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "base/error.h"

namespace foundry {

namespace {

// The parts of `chunks` that lie inside tensors selected by `keep`, each with its chunk's
// decay flag. Like the chunks themselves, the pieces depend only on the table and the
// predicate, never on the thread count.
std::vector<SlabChunk> restrict_chunks(const std::vector<SlabChunk>& chunks,
                                       const ParamTable& table,
                                       const std::function<bool(const ParamInfo&)>& keep) {
  // Selected tensors as [begin, end) slab intervals in slab order, touching ones merged.
  std::vector<std::pair<int64_t, int64_t>> kept;
  for (const ParamInfo& p : table.params()) {
    if (p.numel == 0 || !keep(p)) continue;
    if (!kept.empty() && kept.back().second == p.offset)
      kept.back().second += p.numel;
    else
      kept.emplace_back(p.offset, p.offset + p.numel);
  }
  std::vector<SlabChunk> pieces;
  size_t first = 0;
  for (const SlabChunk& chunk : chunks) {
    const int64_t end = chunk.offset + chunk.size;
    while (first < kept.size() && kept[first].second <= chunk.offset) ++first;
    for (size_t j = first; j < kept.size() && kept[j].first < end; ++j) {
      const int64_t begin = std::max(chunk.offset, kept[j].first);
      pieces.push_back({begin, std::min(end, kept[j].second) - begin, chunk.decay});
    }
  }
  return pieces;
}

}  // namespace

AdamW::AdamW(const ParamTable& table, const AdamWOptions& options)
    : options_(options),
      exp_avg_(static_cast<size_t>(table.total_elements())),
      exp_avg_sq_(static_cast<size_t>(table.total_elements())) {
  if (!(options.beta1 >= 0 && options.beta1 < 1) || !(options.beta2 >= 0 && options.beta2 < 1))
    fail(fmt::format("AdamW betas ({}, {}) must lie in [0, 1)", options.beta1, options.beta2),
         "set train.beta1 and train.beta2 below 1");
  if (!(options.eps >= 0) || !(options.weight_decay >= 0))
    fail(fmt::format("AdamW eps = {} and weight_decay = {} must be non-negative", options.eps,
                     options.weight_decay));
  chunks_ = slab_chunks(table, [this](const ParamInfo& info) { return decays(info); });
  if (options_.applies) chunks_ = restrict_chunks(chunks_, table, options_.applies);
}

bool AdamW::updates(const ParamInfo& info) const {
  return !options_.applies || options_.applies(info);
}

bool AdamW::decays(const ParamInfo& info) const {
  if (info.kind == ParamKind::embedding) return options_.decay_embeddings;
  return info.weight_decay;
}

AdamWScalars adamw_scalars(const AdamWOptions& o, double lr, int64_t step) {
  const double correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
  const double correction2 = 1.0 - std::pow(o.beta2, static_cast<double>(step));
  AdamWScalars s;
  s.beta1 = static_cast<float>(o.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  s.beta2 = static_cast<float>(o.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  s.step_size = static_cast<float>(lr / correction1);
  s.sqrt_correction2 = static_cast<float>(std::sqrt(correction2));
  s.eps = static_cast<float>(o.eps);
  s.decay_factor = static_cast<float>(1.0 - lr * o.weight_decay);
  return s;
}

namespace {

void adamw_elements(float* __restrict p, const float* __restrict g, float* __restrict m,
                    float* __restrict v, int64_t n, const AdamWScalars& s, float keep,
                    float grad_scale) {
  const float b1 = s.beta1, c1 = s.one_minus_beta1, b2 = s.beta2, c2 = s.one_minus_beta2;
  const float step_size = s.step_size, sqrt_c2 = s.sqrt_correction2, eps = s.eps;
  auto update = [&](int64_t i) {
    // Every use of gi is a product, so no fused multiply-add can absorb the scaling: gi is
    // rounded to float exactly as a clipped slab would hold it (optimizer_test checks the
    // bits against clipping first).
    const float gi = g[i] * grad_scale;
    const float mi = b1 * m[i] + c1 * gi;
    const float vi = b2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / sqrt_c2 + eps;
    p[i] = p[i] * keep - step_size * (mi / denom);
  };
  // A 64-byte line of each array at a time, the four arrays prefetched 1 KB ahead.
  constexpr int64_t kLine = 16, kAhead = 256;
  int64_t i = 0;
  for (; i + kLine <= n; i += kLine) {
    const int64_t ahead = std::min(i + kAhead, n - 1);  // within the arrays
    __builtin_prefetch(p + ahead, 1, 2);
    __builtin_prefetch(g + ahead, 0, 2);
    __builtin_prefetch(m + ahead, 1, 2);
    __builtin_prefetch(v + ahead, 1, 2);
#pragma omp simd
    for (int64_t j = i; j < i + kLine; ++j) update(j);
  }
#pragma omp simd
  for (int64_t j = i; j < n; ++j) update(j);
}

}  // namespace

void adamw_chunk(float* __restrict p, const float* __restrict g, float* __restrict m,
                 float* __restrict v, int64_t n, const AdamWScalars& s, bool decay,
                 float grad_scale, bf16* __restrict p16) {
  const float keep = decay ? s.decay_factor : 1.0f;
  if (!p16) return adamw_elements(p, g, m, v, n, s, keep, grad_scale);
  // Blocks small enough that the updated weights are converted from L1.
  constexpr int64_t kBlock = 1024;
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t len = std::min(kBlock, n - i);
    adamw_elements(p + i, g + i, m + i, v + i, len, s, keep, grad_scale);
    to_bf16_streaming(p + i, p16 + i, len);
  }
  stream_fence();
}

void AdamW::step(float* params, const float* grads, double lr, int64_t step,
                 const StepFusion& fusion) {
  if (step < 1) fail(fmt::format("AdamW step number {} must be >= 1 (steps are 1-based)", step));
  const AdamWScalars s = adamw_scalars(options_, lr, step);

  const int64_t n_chunks = static_cast<int64_t>(chunks_.size());
  float* m = exp_avg_.data();
  float* v = exp_avg_sq_.data();
  bf16* p16 = fusion.weights_bf16;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n_chunks; ++c) {
    const SlabChunk& chunk = chunks_[c];
    const int64_t at = chunk.offset;
    adamw_chunk(params + at, grads + at, m + at, v + at, chunk.size, s, chunk.decay,
                fusion.grad_scale, p16 ? p16 + at : nullptr);
  }
}

const std::vector<std::string>& AdamW::state_names() {
  static const std::vector<std::string> names = {"exp_avg", "exp_avg_sq"};
  return names;
}

std::span<float> AdamW::state(std::string_view name) {
  if (name == "exp_avg") return exp_avg_;
  if (name == "exp_avg_sq") return exp_avg_sq_;
  fail(fmt::format("AdamW has no state named '{}'", name), "the states are exp_avg, exp_avg_sq");
}

std::span<const float> AdamW::state(std::string_view name) const {
  return const_cast<AdamW*>(this)->state(name);
}

void AdamW::reset() {
  std::fill(exp_avg_.begin(), exp_avg_.end(), 0.0f);
  std::fill(exp_avg_sq_.begin(), exp_avg_sq_.end(), 0.0f);
}

}  // namespace foundry
