#include "kernels/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "base/error.h"
#include "kernels/kernel_support.h"

namespace foundry::ops {
namespace {

// A batch of matrices inside a larger tensor: batch dims with their strides, then a row and
// a column stride (elements). Sub-blocks of it become oneDNN matmul operands.
struct Strided {
  const void* data;
  DType dtype;
  std::vector<int64_t> batch_dims, batch_strides;
  int64_t row_stride, col_stride;

  Strided offset(int64_t elements) const {
    Strided s = *this;
    const size_t bytes = dtype == DType::bf16 ? sizeof(bf16) : sizeof(float);
    s.data = static_cast<const char*>(data) + elements * static_cast<int64_t>(bytes);
    return s;
  }
  Strided transposed() const {
    Strided s = *this;
    std::swap(s.row_stride, s.col_stride);
    return s;
  }
  // Rows [r0, r1) and columns [c0, c1) of every matrix in the batch.
  MatView block(int64_t r0, int64_t r1, int64_t c0, int64_t c1) const {
    const Strided s = offset(r0 * row_stride + c0 * col_stride);
    MatView v{s.data, dtype, batch_dims, batch_strides};
    v.dims.insert(v.dims.end(), {r1 - r0, c1 - c0});
    v.strides.insert(v.strides.end(), {row_stride, col_stride});
    return v;
  }
  OutView out_block(int64_t r0, int64_t r1, int64_t c0, int64_t c1) const {
    FOUNDRY_CHECK(dtype == DType::f32);
    const MatView v = block(r0, r1, c0, c1);
    return OutView{static_cast<float*>(const_cast<void*>(v.data)), v.dims, v.strides};
  }
};

// The layouts of the attention tensors as batches over [B, KVH, G] (G = H / KVH query heads
// per kv head), so that one matmul covers every head and kv heads broadcast over G.
struct Layouts {
  int64_t b, t, h, kvh, d, g;
  explicit Layouts(const AttentionShape& s)
      : b(s.b), t(s.t), h(s.h), kvh(s.kvh), d(s.d), g(s.h / s.kvh) {}

  // q, out, dq, dout [B, T, H, D] as [B, KVH, G] × [T, D].
  Strided query(const void* p, DType dt) const {
    return {p, dt, {b, kvh, g}, {t * h * d, g * d, d}, h * d, 1};
  }
  // k, v, dk, dv [B, T, KVH, D] as [B, KVH, 1] × [T, D].
  Strided key(const void* p, DType dt) const {
    return {p, dt, {b, kvh, 1}, {t * kvh * d, d, d}, kvh * d, 1};
  }
  // probs and score-shaped scratch [B, H, T, T] as [B, KVH, G] × [T, T].
  Strided scores(const void* p, DType dt) const {
    return {p, dt, {b, kvh, g}, {h * t * t, g * t * t, t * t}, t, 1};
  }
  // For the dK, dV sums over each group: query head j of every group, and the kv heads, as
  // [B, KVH] × [T, D] (or × [T, T] for scores).
  Strided query_head(const void* p, DType dt, int64_t j) const {
    return Strided{p, dt, {b, kvh}, {t * h * d, g * d}, h * d, 1}.offset(j * d);
  }
  Strided key_4d(const void* p, DType dt) const {
    return {p, dt, {b, kvh}, {t * kvh * d, d}, kvh * d, 1};
  }
  Strided scores_head(const void* p, DType dt, int64_t j) const {
    return Strided{p, dt, {b, kvh}, {h * t * t, g * t * t}, t, 1}.offset(j * t * t);
  }
};

// Causal block split of the T positions. Query block [r0, r1) only meets keys [0, r1), and
// key block [c0, c1) only meets queries [c0, T): the score products skip the blocks above the
// diagonal (with n blocks they do (n+1)/2n of the full work).
std::vector<int64_t> block_bounds(int64_t t) {
  constexpr int64_t kTargetRows = 64, kMaxBlocks = 8, kAlign = 16;
  const int64_t blocks = std::clamp<int64_t>((t + kTargetRows - 1) / kTargetRows, 1, kMaxBlocks);
  const int64_t rows = (t + blocks - 1) / blocks;
  const int64_t aligned = blocks == 1 ? t : (rows + kAlign - 1) / kAlign * kAlign;
  std::vector<int64_t> bounds{0};
  while (bounds.back() < t) bounds.push_back(std::min(t, bounds.back() + aligned));
  return bounds;
}

void check_shape(const AttentionShape& s) {
  FOUNDRY_CHECK(s.b > 0 && s.t > 0 && s.h > 0 && s.kvh > 0 && s.d > 0);
  FOUNDRY_CHECK(s.h % s.kvh == 0);
}

// The GEMM operands of a call: the float inputs themselves for fp32; for bf16, copies (same
// layout) converted in a single parallel region.
class GemmOperands {
 public:
  static constexpr size_t kMaxInputs = 4;

  GemmOperands(DType dtype, std::initializer_list<std::pair<const float*, int64_t>> inputs)
      : dtype_(dtype) {
    FOUNDRY_CHECK(inputs.size() <= kMaxInputs);
    thread_local std::array<detail::ScratchBuffer<bf16>, kMaxInputs> scratch;
    std::array<std::pair<const float*, int64_t>, kMaxInputs> src{};
    std::array<bf16*, kMaxInputs> dst{};
    size_t count = 0;
    for (const auto& input : inputs) {
      src[count] = input;
      if (dtype == DType::bf16) dst[count] = scratch[count].get(input.second);
      base_[count] = dtype == DType::bf16 ? static_cast<const void*>(dst[count]) : input.first;
      ++count;
    }
    if (dtype != DType::bf16) return;
    constexpr int64_t kBlock = 8192;
#pragma omp parallel
    for (size_t i = 0; i < count; ++i) {
      const int64_t n = src[i].second;
#pragma omp for schedule(static) nowait
      for (int64_t start = 0; start < n; start += kBlock)
        detail::to_bf16_serial(src[i].first + start, dst[i] + start, std::min(kBlock, n - start));
    }
  }

  // Element `offset` of input i, in the GEMM dtype.
  const void* at(size_t i, int64_t offset) const {
    const int64_t bytes = dtype_ == DType::bf16 ? sizeof(bf16) : sizeof(float);
    return static_cast<const char*>(base_[i]) + offset * bytes;
  }

 private:
  DType dtype_;
  std::array<const void*, kMaxInputs> base_{};
};

// Forward on one batch chunk: S = Q·K^T (causal blocks) into probs, softmax(S/sqrt(D)) in
// place with the future masked to exactly 0, then out = P·V. qg, kg, vg are q, k, v in the
// GEMM dtype.
void forward_chunk(float* out, float* probs, const void* qg, const void* kg, const void* vg,
                   const AttentionShape& s, DType dtype) {
  const Layouts lay(s);
  const int64_t t = s.t;
  thread_local detail::ScratchBuffer<bf16> probs_scratch;
  const int64_t score_count = s.b * s.h * t * t;
  bf16* probs_bf16 = dtype == DType::bf16 ? probs_scratch.get(score_count) : nullptr;

  const std::vector<int64_t> bounds = block_bounds(t);
  const Strided q_mats = lay.query(qg, dtype), k_mats = lay.key(kg, dtype);
  const Strided score_mats = lay.scores(probs, DType::f32);
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    const int64_t r0 = bounds[i], r1 = bounds[i + 1];
    matmul(q_mats.block(r0, r1, 0, s.d), k_mats.transposed().block(0, s.d, 0, r1),
           score_mats.out_block(r0, r1, 0, r1));
  }

  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < s.b * s.h * t; ++row) {
    const int64_t ti = row % t;
    float* p = probs + row * t;
    const float max_score = detail::max_of(p, ti + 1);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j <= ti; ++j) {
      p[j] = detail::exp_fast((p[j] - max_score) * scale);
      sum += p[j];
    }
    const float inv_sum = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j <= ti; ++j) p[j] *= inv_sum;
    std::fill(p + ti + 1, p + t, 0.0f);
    if (probs_bf16) detail::to_bf16_serial(p, probs_bf16 + row * t, t);
  }

  const Strided p_mats = lay.scores(probs_bf16 ? static_cast<const void*>(probs_bf16) : probs,
                                    dtype);
  const Strided v_mats = lay.key(vg, dtype), out_mats = lay.query(out, DType::f32);
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    const int64_t r0 = bounds[i], r1 = bounds[i + 1];
    matmul(p_mats.block(r0, r1, 0, r1), v_mats.block(0, r1, 0, s.d),
           out_mats.out_block(r0, r1, 0, s.d));
  }
}

struct BackwardScratch {
  detail::ScratchBuffer<bf16> probs, dscores;
  detail::ScratchBuffer<float> dscores_f32;
};

// Backward on one batch chunk: dP = dO·V^T, dS = P∘(dP − rowsum(dP∘P)) / sqrt(D), dQ = dS·K,
// and per kv head dV = Σ_g P_g^T·dO_g, dK = Σ_g dS_g^T·Q_g over the G query heads sharing it.
// doutg, qg, kg, vg are dout, q, k, v in the GEMM dtype; probs are the saved probabilities.
void backward_chunk(float* dq, float* dk, float* dv, const void* doutg, const float* probs,
                    const void* qg, const void* kg, const void* vg, const AttentionShape& s,
                    DType dtype) {
  const Layouts lay(s);
  const int64_t t = s.t;
  thread_local BackwardScratch scratch;
  const int64_t score_count = s.b * s.h * t * t;
  float* dscores = scratch.dscores_f32.get(score_count);
  bf16* dscores_bf16 = dtype == DType::bf16 ? scratch.dscores.get(score_count) : nullptr;
  bf16* probs_bf16 = dtype == DType::bf16 ? scratch.probs.get(score_count) : nullptr;

  const std::vector<int64_t> bounds = block_bounds(t);
  const size_t blocks = bounds.size() - 1;
  const Strided dout_mats = lay.query(doutg, dtype), v_mats = lay.key(vg, dtype);
  const Strided dscore_mats = lay.scores(dscores, DType::f32);
  for (size_t i = 0; i < blocks; ++i) {
    const int64_t r0 = bounds[i], r1 = bounds[i + 1];
    matmul(dout_mats.block(r0, r1, 0, s.d), v_mats.transposed().block(0, s.d, 0, r1),
           dscore_mats.out_block(r0, r1, 0, r1));
  }

  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < s.b * s.h * t; ++row) {
    const int64_t ti = row % t;
    const float* p = probs + row * t;
    float* ds = dscores + row * t;
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j <= ti; ++j) dot += ds[j] * p[j];
#pragma omp simd
    for (int64_t j = 0; j <= ti; ++j) ds[j] = p[j] * (ds[j] - dot) * scale;
    std::fill(ds + ti + 1, ds + t, 0.0f);
    if (dscores_bf16) {
      detail::to_bf16_serial(ds, dscores_bf16 + row * t, t);
      detail::to_bf16_serial(p, probs_bf16 + row * t, t);
    }
  }

  const void* dsg = dscores_bf16 ? static_cast<const void*>(dscores_bf16) : dscores;
  const void* pg = probs_bf16 ? static_cast<const void*>(probs_bf16) : probs;
  // dQ, by query block.
  const Strided ds_mats = lay.scores(dsg, dtype), k_mats = lay.key(kg, dtype);
  const Strided dq_mats = lay.query(dq, DType::f32);
  for (size_t i = 0; i < blocks; ++i) {
    const int64_t r0 = bounds[i], r1 = bounds[i + 1];
    matmul(ds_mats.block(r0, r1, 0, r1), k_mats.block(0, r1, 0, s.d),
           dq_mats.out_block(r0, r1, 0, s.d));
  }
  // dK and dV, by key block; the first query head of each group writes, the others add.
  const Strided dk_mats = lay.key_4d(dk, DType::f32), dv_mats = lay.key_4d(dv, DType::f32);
  for (int64_t j = 0; j < lay.g; ++j) {
    const Strided p_t = lay.scores_head(pg, dtype, j).transposed();
    const Strided ds_t = lay.scores_head(dsg, dtype, j).transposed();
    const Strided dout_j = lay.query_head(doutg, dtype, j), q_j = lay.query_head(qg, dtype, j);
    for (size_t i = 0; i < blocks; ++i) {
      const int64_t c0 = bounds[i], c1 = bounds[i + 1];
      matmul(p_t.block(c0, c1, c0, t), dout_j.block(c0, t, 0, s.d),
             dv_mats.out_block(c0, c1, 0, s.d), /*accumulate=*/j > 0);
      matmul(ds_t.block(c0, c1, c0, t), q_j.block(c0, t, 0, s.d),
             dk_mats.out_block(c0, c1, 0, s.d), /*accumulate=*/j > 0);
    }
  }
}

// Batch elements go through in chunks whose scores (H·T·T floats each) fit in about 2 MB, the
// L2 of this class of machine, so that each chunk's softmax reads scores the GEMM has just
// written and the value product reads probabilities still in cache. Every tensor has the
// batch outermost, so a chunk is the same computation at an offset.
template <typename Fn>
void for_each_batch_chunk(const AttentionShape& s, Fn&& fn) {
  constexpr int64_t kChunkScoreBytes = 2 << 20;
  const int64_t per_batch = s.h * s.t * s.t * static_cast<int64_t>(sizeof(float));
  const int64_t chunk = std::clamp<int64_t>(kChunkScoreBytes / per_batch, 1, s.b);
  for (int64_t b0 = 0; b0 < s.b; b0 += chunk) {
    AttentionShape part = s;
    part.b = std::min(chunk, s.b - b0);
    fn(part, b0 * s.t * s.h * s.d, b0 * s.t * s.kvh * s.d, b0 * s.h * s.t * s.t);
  }
}

}  // namespace

void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v,
                       const AttentionShape& s, DType dtype) {
  check_shape(s);
  const int64_t q_count = s.b * s.t * s.h * s.d, kv_count = s.b * s.t * s.kvh * s.d;
  const GemmOperands in(dtype, {{q, q_count}, {k, kv_count}, {v, kv_count}});
  for_each_batch_chunk(s, [&](const AttentionShape& part, int64_t q_off, int64_t kv_off,
                              int64_t p_off) {
    forward_chunk(out + q_off, probs + p_off, in.at(0, q_off), in.at(1, kv_off),
                  in.at(2, kv_off), part, dtype);
  });
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs,
                        const float* q, const float* k, const float* v, const AttentionShape& s,
                        DType dtype) {
  check_shape(s);
  const int64_t q_count = s.b * s.t * s.h * s.d, kv_count = s.b * s.t * s.kvh * s.d;
  const GemmOperands in(dtype, {{dout, q_count}, {q, q_count}, {k, kv_count}, {v, kv_count}});
  for_each_batch_chunk(s, [&](const AttentionShape& part, int64_t q_off, int64_t kv_off,
                              int64_t p_off) {
    backward_chunk(dq + q_off, dk + kv_off, dv + kv_off, in.at(0, q_off), probs + p_off,
                   in.at(1, q_off), in.at(2, kv_off), in.at(3, kv_off), part, dtype);
  });
}

void attention_decode(float* out, float* scores, const float* q, const float* k_cache,
                      const float* v_cache, int64_t len, int64_t h, int64_t kvh, int64_t d) {
  const int64_t group = h / kvh, row = kvh * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t hh = 0; hh < h; ++hh) {
    const int64_t g = hh / group;
    const float* qh = q + hh * d;
    float max_score = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < len; ++t) {
      const float* kt = k_cache + t * row + g * d;
      float dot = 0;
      for (int64_t i = 0; i < d; ++i) dot += qh[i] * kt[i];
      scores[t] = dot * scale;
      max_score = std::max(max_score, scores[t]);
    }
    double sum = 0;
    for (int64_t t = 0; t < len; ++t) {
      scores[t] = std::exp(scores[t] - max_score);
      sum += scores[t];
    }
    float* o = out + hh * d;
    std::fill(o, o + d, 0.0f);
    for (int64_t t = 0; t < len; ++t) {
      const float w = static_cast<float>(scores[t] / sum);
      const float* vt = v_cache + t * row + g * d;
      for (int64_t i = 0; i < d; ++i) o[i] += w * vt[i];
    }
  }
}

void attention_reference(double* out, const double* q, const double* k, const double* v,
                         const AttentionShape& s) {
  check_shape(s);
  const int64_t g = s.h / s.kvh;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<double> weights(s.t);
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.h; ++h)
      for (int64_t i = 0; i < s.t; ++i) {
        const double* qi = q + ((b * s.t + i) * s.h + h) * s.d;
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          const double* kj = k + ((b * s.t + j) * s.kvh + h / g) * s.d;
          double dot = 0;
          for (int64_t x = 0; x < s.d; ++x) dot += qi[x] * kj[x];
          weights[j] = dot * scale;
          max_score = std::max(max_score, weights[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          weights[j] = std::exp(weights[j] - max_score);
          sum += weights[j];
        }
        double* oi = out + ((b * s.t + i) * s.h + h) * s.d;
        for (int64_t x = 0; x < s.d; ++x) oi[x] = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const double* vj = v + ((b * s.t + j) * s.kvh + h / g) * s.d;
          for (int64_t x = 0; x < s.d; ++x) oi[x] += weights[j] / sum * vj[x];
        }
      }
}

}  // namespace foundry::ops
