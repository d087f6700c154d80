// gpu::adamw_update against a float64 evaluation of the same update (optim/adamw.h's
// formula), over ranges with and without decay, with gaps between them left untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/bf16.h"
#include "base/rng.h"
#include "cuda/adamw.h"
#include "cuda/runtime.h"
#include "cuda/test_support.h"

namespace foundry {
namespace {

TEST(GpuAdamW, UpdatesEveryRangeLikeTheFormulaAndNothingElse) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 100000;
  // Three ranges with gaps: [10, 30010) decays, [30010, 30011) does not, [40000, 99999) decays.
  const std::vector<gpu::AdamWRange> ranges = {{10, 30000, 1}, {30010, 1, 0}, {40000, 59999, 1}};
  Rng rng(3);
  std::vector<float> p(n), g(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = static_cast<float>(rng.normal());
    g[i] = static_cast<float>(rng.normal() * 1e-2);
    m[i] = static_cast<float>(rng.normal() * 1e-3);
    v[i] = static_cast<float>(rng.uniform() * 1e-4);
  }
  const double lr = 3e-4, wd = 0.1, b1 = 0.9, b2 = 0.95, eps = 1e-8, grad_scale = 0.5;
  const int64_t step = 7;
  const double c1 = 1 - std::pow(b1, step), c2 = 1 - std::pow(b2, step);
  const gpu::AdamWCoefficients c{static_cast<float>(b1), static_cast<float>(1 - b1),
                                 static_cast<float>(b2), static_cast<float>(1 - b2),
                                 static_cast<float>(lr / c1), static_cast<float>(std::sqrt(c2)),
                                 static_cast<float>(eps), static_cast<float>(1 - lr * wd)};
  auto up = [](const std::vector<float>& x) {
    gpu::DeviceBuffer b(static_cast<int64_t>(x.size()) * 4);
    b.upload(x.data(), static_cast<int64_t>(x.size()) * 4);
    return b;
  };
  auto dp = up(p), dg = up(g), dm = up(m), dv = up(v);
  gpu::DeviceBuffer dranges(static_cast<int64_t>(ranges.size() * sizeof(gpu::AdamWRange)));
  dranges.upload(ranges.data(), dranges.bytes());
  gpu::DeviceBuffer d16(n * 2);
  d16.fill_bytes(0);
  gpu::adamw_update(dp.as<float>(), dg.as<float>(), dm.as<float>(), dv.as<float>(),
                    d16.as<uint16_t>(), dranges.as<gpu::AdamWRange>(),
                    static_cast<int64_t>(ranges.size()), c, static_cast<float>(grad_scale));
  std::vector<float> p2(n), m2(n), v2(n);
  std::vector<bf16> p16(n);
  dp.download(p2.data(), n * 4);
  dm.download(m2.data(), n * 4);
  dv.download(v2.data(), n * 4);
  d16.download(p16.data(), n * 2);

  std::vector<int> in_range(n, -1);
  for (size_t r = 0; r < ranges.size(); ++r)
    for (int64_t i = ranges[r].offset; i < ranges[r].offset + ranges[r].size; ++i)
      in_range[i] = static_cast<int>(r);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    if (in_range[i] < 0) {  // outside every range: untouched
      if (p2[i] != p[i] || m2[i] != m[i] || v2[i] != v[i] || p16[i] != 0) {
        ADD_FAILURE() << "element " << i << " outside the ranges was changed";
        ++bad;
      }
      continue;
    }
    const double gi = g[i] * grad_scale;
    const double mi = b1 * m[i] + (1 - b1) * gi, vi = b2 * v[i] + (1 - b2) * gi * gi;
    const double keep = ranges[in_range[i]].decay ? 1 - lr * wd : 1.0;
    const double denom = std::sqrt(vi) / std::sqrt(c2) + eps;
    const double pi = p[i] * keep - lr / c1 * mi / denom;
    // m is a sum of two signed terms: fp32 rounds it relative to them, not to a cancelled m;
    // that error reaches p through the update, beside p's own rounding.
    const double m_tol = 1e-6 * (b1 * std::abs(m[i]) + (1 - b1) * std::abs(gi)) + 1e-12;
    const bool ok = std::abs(m2[i] - mi) <= m_tol &&
                    std::abs(v2[i] - vi) <= 1e-6 * vi + 1e-15 &&
                    std::abs(p2[i] - pi) <= 2e-7 * std::abs(pi) + 1e-9 + lr / c1 * m_tol / denom &&
                    p16[i] == float_to_bf16(p2[i]);
    if (!ok) {
      ADD_FAILURE() << "element " << i << ": p " << p2[i] << " (want " << pi << "), m " << m2[i]
                    << " (" << mi << "), v " << v2[i] << " (" << vi << ")";
      ++bad;
    }
  }
}

}  // namespace
}  // namespace foundry
