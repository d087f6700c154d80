#include "optim/clip.h"

#include <cmath>
#include <vector>

#include "base/error.h"
#include "optim/slab_chunks.h"

namespace foundry {

// Eight independent double accumulators (element i goes to lane i % 8), combined in a fixed
// order: the summation order is set by the code, not by the compiler's vector width or the
// buffer's alignment, and the lanes still vectorize.
double sum_of_squares(const float* x, int64_t n) {
  constexpr int kLanes = 8;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const double xj = x[i + j];
      lane[j] += xj * xj;
    }
  for (int j = 0; i + j < n; ++j) {
    const double xj = x[i + j];
    lane[j] += xj * xj;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

void scale_in_place(float* x, int64_t n, float factor) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}


double grad_norm(const float* grads, const ParamTable& table) {
  const std::vector<SlabChunk> chunks = slab_chunks(table, nullptr);
  const int64_t n_chunks = static_cast<int64_t>(chunks.size());
  std::vector<double> partial(n_chunks);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n_chunks; ++c)
    partial[c] = sum_of_squares(grads + chunks[c].offset, chunks[c].size);
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
