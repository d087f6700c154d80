#include "bench/latbw_fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace foundry {

LatBwFit fit_latency_bandwidth(std::span<const LatBwSample> samples) {
  if (samples.size() < 2)
    fail(fmt::format("the latency-bandwidth fit needs at least 2 message sizes (got {})",
                     samples.size()),
         "measure a size range, e.g. -b 8 -e 64M");
  LatBwFit fit;
  fit.samples = static_cast<int>(samples.size());
  fit.min_bytes = fit.max_bytes = samples[0].bytes;
  for (const LatBwSample& s : samples) {
    if (!(s.seconds > 0) || !std::isfinite(s.seconds) || s.bytes < 0)
      fail(fmt::format("latency-bandwidth fit: bad sample ({} bytes, {} s)", s.bytes, s.seconds));
    fit.min_bytes = std::min(fit.min_bytes, s.bytes);
    fit.max_bytes = std::max(fit.max_bytes, s.bytes);
  }
  if (fit.min_bytes == fit.max_bytes)
    fail("the latency-bandwidth fit needs at least 2 distinct message sizes",
         "measure a size range, e.g. -b 8 -e 64M");

  // Relative residual r_i = (α + γ S_i − t_i) / t_i = α u_i + γ v_i − 1 with u_i = 1/t_i and
  // v_i = S_i/t_i: ordinary least squares of the constant 1 on (u, v). Sizes are scaled to
  // MiB inside the sums so the normal equations stay well conditioned.
  const double scale = 1048576.0;
  double uu = 0, uv = 0, vv = 0, u1 = 0, v1 = 0;
  for (const LatBwSample& s : samples) {
    const double u = 1.0 / s.seconds;
    const double v = (s.bytes / scale) / s.seconds;
    uu += u * u;
    uv += u * v;
    vv += v * v;
    u1 += u;
    v1 += v;
  }
  double alpha = 0, gamma = 0;  // gamma: seconds per MiB
  const double det = uu * vv - uv * uv;
  if (det > 1e-12 * uu * vv) {
    alpha = (u1 * vv - v1 * uv) / det;
    gamma = (v1 * uu - u1 * uv) / det;
  }
  // Non-negativity: when the unconstrained optimum has a negative coefficient, the
  // constrained optimum lies on that boundary, where the other coefficient is a
  // one-variable least-squares fit.
  if (!(alpha >= 0) || !(gamma >= 0)) {
    const double alpha_only = u1 / uu, gamma_only = v1 / vv;
    auto cost = [&](double a, double g) {
      double sum = 0;
      for (const LatBwSample& s : samples) {
        const double r = (a + g * s.bytes / scale - s.seconds) / s.seconds;
        sum += r * r;
      }
      return sum;
    };
    if (cost(alpha_only, 0) <= cost(0, gamma_only)) {
      alpha = alpha_only;
      gamma = 0;
    } else {
      alpha = 0;
      gamma = gamma_only;
    }
  }
  // A size term that stays at rounding level over the whole range is no bandwidth at all.
  double max_seconds = 0;
  for (const LatBwSample& s : samples) max_seconds = std::max(max_seconds, s.seconds);
  if (gamma * fit.max_bytes / scale <= 1e-9 * max_seconds) gamma = 0;
  fit.alpha_s = alpha;
  fit.beta_bytes_per_s = gamma > 0 ? scale / gamma : 0.0;
  for (const LatBwSample& s : samples)
    fit.max_rel_residual =
        std::max(fit.max_rel_residual, std::abs(fit.predict(s.bytes) - s.seconds) / s.seconds);
  return fit;
}

}  // namespace foundry
