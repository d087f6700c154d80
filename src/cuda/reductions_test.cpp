// gpu::ops' norms, clipping and Newton–Schulz against double-precision references.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/rng.h"
#include "cuda/reductions.h"
#include "cuda/runtime.h"
#include "cuda/test_support.h"

namespace foundry {
namespace {

using gpu::testing::to_device;
using gpu::testing::to_host;

TEST(GpuReductions, SumOfSquaresAndClippingOverRanges) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 300000;
  Rng rng(1);
  std::vector<float> g(n);
  for (float& x : g) x = static_cast<float>(rng.normal());
  const std::vector<gpu::AdamWRange> ranges = {{0, 1000, 0}, {5000, 200000, 1}, {250000, 7, 0}};
  double want = 0;
  for (const auto& r : ranges)
    for (int64_t i = r.offset; i < r.offset + r.size; ++i) want += double(g[i]) * g[i];
  auto dg = to_device(g), dranges = to_device(ranges);
  gpu::DeviceBuffer squares(8), factor(4);
  gpu::Workspace workspace;
  gpu::ops::sum_of_squares(squares.as<double>(), dg.as<float>(), dranges.as<gpu::AdamWRange>(), 3,
                           workspace);
  const double got = to_host<double>(squares, 1)[0];
  EXPECT_NEAR(got, want, 1e-12 * want);
  for (double max_norm : {0.0, 1e9, 100.0}) {
    auto dx = to_device(g);
    gpu::ops::clip_factor(factor.as<float>(), squares.as<double>(), max_norm);
    gpu::ops::scale_ranges(dx.as<float>(), dranges.as<gpu::AdamWRange>(), 3, factor.as<float>());
    const float f = to_host<float>(factor, 1)[0];
    const float expected = max_norm > 0 && std::sqrt(want) > max_norm
                               ? static_cast<float>(max_norm / std::sqrt(want))
                               : 1.0f;
    EXPECT_NEAR(f, expected, 1e-6 * expected) << max_norm;
    const std::vector<float> x = to_host<float>(dx, n);
    EXPECT_EQ(x[4000], g[4000]);                 // outside every range
    EXPECT_EQ(x[6000], g[6000] * f);             // inside one
    EXPECT_EQ(x[250006], g[250006] * f);
  }
  // Deterministic: the same bits again.
  gpu::ops::sum_of_squares(squares.as<double>(), dg.as<float>(), dranges.as<gpu::AdamWRange>(), 3,
                           workspace);
  EXPECT_EQ(to_host<double>(squares, 1)[0], got);
}

// Newton–Schulz in double on the host: the reference iteration of optim/muon.h.
std::vector<double> newton_schulz_reference(const std::vector<float>& g, int64_t rows,
                                            int64_t cols, int steps) {
  const bool tall = rows > cols;
  // Work on the wide orientation: transpose a tall matrix, iterate, transpose back.
  const int64_t r = tall ? cols : rows, c = tall ? rows : cols;
  std::vector<double> x(r * c);
  double norm = 0;
  for (float v : g) norm += double(v) * v;
  norm = std::sqrt(norm) + 1e-7;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      (tall ? x[j * c + i] : x[i * c + j]) = g[i * cols + j] / norm;
  const double a = 3.4445, b = -4.7750, cc = 2.0315;
  for (int s = 0; s < steps; ++s) {
    std::vector<double> A(r * r, 0), B(r * r, 0), y(r * c, 0);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < r; ++j)
        for (int64_t k = 0; k < c; ++k) A[i * r + j] += x[i * c + k] * x[j * c + k];
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < r; ++j) {
        double aa = 0;
        for (int64_t k = 0; k < r; ++k) aa += A[i * r + k] * A[k * r + j];
        B[i * r + j] = b * A[i * r + j] + cc * aa;
      }
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) {
        double bx = 0;
        for (int64_t k = 0; k < r; ++k) bx += B[i * r + k] * x[k * c + j];
        y[i * c + j] = a * x[i * c + j] + bx;
      }
    x = y;
  }
  std::vector<double> out(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = tall ? x[j * c + i] : x[i * c + j];
  return out;
}

TEST(GpuReductions, NewtonSchulzFollowsTheReferenceIterationWideAndTall) {
  SKIP_WITHOUT_GPU();
  gpu::Workspace workspace;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{24, 40}, {40, 24}, {16, 16}}) {
    Rng rng(rows * 100 + cols);
    std::vector<float> g(rows * cols);
    for (float& x : g) x = static_cast<float>(rng.normal());
    const std::vector<double> want = newton_schulz_reference(g, rows, cols, 5);
    for (bool in_place : {false, true}) {
      auto dg = to_device(g);
      gpu::DeviceBuffer dout(rows * cols * 4);
      dout.fill_bytes(0xFF);
      float* out = in_place ? dg.as<float>() : dout.as<float>();
      gpu::ops::newton_schulz(dg.as<float>(), out, rows, cols, 5, false, workspace);
      const std::vector<float> got = to_host<float>(in_place ? dg : dout, rows * cols);
      for (int64_t i = 0; i < rows * cols; ++i)
        ASSERT_NEAR(got[i], want[i], 1e-3 * (std::abs(want[i]) + 0.05))
            << rows << "x" << cols << " at " << i << (in_place ? " in place" : "");
    }
    // bf16 inputs: the same iteration to bf16's precision.
    auto dg = to_device(g);
    gpu::ops::newton_schulz(dg.as<float>(), dg.as<float>(), rows, cols, 5, true, workspace);
    const std::vector<float> got = to_host<float>(dg, rows * cols);
    double err = 0, scale = 0;
    for (int64_t i = 0; i < rows * cols; ++i) {
      err += (got[i] - want[i]) * (got[i] - want[i]);
      scale += want[i] * want[i];
    }
    EXPECT_LT(std::sqrt(err / scale), 0.05) << rows << "x" << cols << " bf16";
  }
}

}  // namespace
}  // namespace foundry
