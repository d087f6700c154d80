#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "optim/slab_chunks.h"

namespace foundry {

namespace {

constexpr int kLanes = 8;    // double accumulators per array: element i goes to lane i % 8
constexpr int kStreams = 8;  // arrays read side by side
// How far ahead each array is prefetched (into L2), in elements: 1 KB. On a 2-core Xeon the
// pass reads 16% faster with it (30 against 26 GB/s).
constexpr int64_t kPrefetchAhead = 256;

double combine(const double* lane) {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// out[s] = the sum of x[s][i]² over n elements for S arrays read side by side, each in eight
// double lanes (element i to lane i % 8) combined pairwise: the order is fixed by the code,
// not by the vector width, the alignment or S. On a slab in DRAM, eight streams in flight
// read it about 1.6× as fast as one chunk after another.
template <int S>
void sums_of_squares(const float* const* x, int64_t n, double* out) {
  double lane[S][kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    if (i % 16 == 0) {  // once per 64-byte line of each array
      const int64_t ahead = std::min(i + kPrefetchAhead, n - 1);  // within the arrays
#pragma GCC unroll 8
      for (int s = 0; s < S; ++s) __builtin_prefetch(x[s] + ahead, 0, 2);
    }
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s)
#pragma omp simd
      for (int j = 0; j < kLanes; ++j) {
        const double xj = x[s][i + j];
        lane[s][j] += xj * xj;
      }
  }
  for (int s = 0; s < S; ++s) {
    for (int j = 0; i + j < n; ++j) {
      const double xj = x[s][i + j];
      lane[s][j] += xj * xj;
    }
    out[s] = combine(lane[s]);
  }
}

}  // namespace

double sum_of_squares(const float* x, int64_t n) {
  double sum;
  sums_of_squares<1>(&x, n, &sum);
  return sum;
}

void chunk_sums_of_squares(std::span<const SlabChunk> chunks,
                           const std::function<const float*(int64_t offset)>& at, double* out) {
  const int64_t n = static_cast<int64_t>(chunks.size()), groups = (n + kStreams - 1) / kStreams;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t first = g * kStreams, count = std::min<int64_t>(kStreams, n - first);
    bool same_size = count == kStreams;
    for (int64_t c = first + 1; same_size && c < first + count; ++c)
      same_size = chunks[c].size == chunks[first].size;
    if (same_size) {
      const float* x[kStreams];
      for (int s = 0; s < kStreams; ++s) x[s] = at(chunks[first + s].offset);
      sums_of_squares<kStreams>(x, chunks[first].size, out + first);
    } else {
      for (int64_t c = first; c < first + count; ++c)
        out[c] = sum_of_squares(at(chunks[c].offset), chunks[c].size);
    }
  }
}

void scale_in_place(float* x, int64_t n, float factor) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}


double grad_norm(const float* grads, const ParamTable& table) {
  const std::vector<SlabChunk> chunks = slab_chunks(table, nullptr);
  const int64_t n_chunks = static_cast<int64_t>(chunks.size());
  std::vector<double> partial(n_chunks);
  chunk_sums_of_squares(chunks, [&](int64_t offset) { return grads + offset; }, partial.data());
  double total = 0;
  for (double s : partial) total += s;  // fixed order
  return std::sqrt(total);
}

void check_max_norm(double max_norm) {
  if (!(max_norm >= 0))
    fail(fmt::format("gradient clip norm {} must be >= 0", max_norm),
         "set train.grad_clip to 0 (off) or a positive norm");
}

float clip_factor(double norm, double max_norm) {
  check_max_norm(max_norm);
  if (!std::isfinite(norm) || max_norm == 0 || norm <= max_norm) return 1.0f;
  return static_cast<float>(max_norm / norm);
}

double clip_grad_norm(float* grads, const ParamTable& table, double max_norm) {
  check_max_norm(max_norm);  // before any work
  const double norm = grad_norm(grads, table);
  const float factor = clip_factor(norm, max_norm);
  if (factor == 1.0f) return norm;

  const std::vector<SlabChunk> chunks = slab_chunks(table, nullptr);
  const int64_t n_chunks = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n_chunks; ++c)
    scale_in_place(grads + chunks[c].offset, chunks[c].size, factor);
  return norm;
}

}  // namespace foundry
