#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/error.h"

namespace foundry {

double learning_rate(const LrSchedule& s, int64_t step) {
  if (step < 1) fail(fmt::format("learning-rate step {} must be >= 1 (steps are 1-based)", step));
  const double peak = s.lr;
  const double floor = s.lr * s.min_lr_ratio;
  const int64_t warmup = s.warmup_steps;
  const int64_t total = s.total_steps;
  if (step <= warmup) return peak * static_cast<double>(step) / static_cast<double>(warmup);

  if (s.kind == "constant") return peak;
  if (s.kind == "cosine") {
    const double progress =
        total > warmup ? std::min(1.0, static_cast<double>(step - warmup) /
                                           static_cast<double>(total - warmup))
                       : 1.0;
    return floor + (peak - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
  if (s.kind == "wsd") {
    const int64_t decay_steps =
        std::llround(std::clamp(s.decay_fraction, 0.0, 1.0) * static_cast<double>(total));
    const int64_t decay_start = total - decay_steps;  // last stable step
    if (step <= decay_start || decay_steps == 0) return peak;
    const double progress = std::min(
        1.0, static_cast<double>(step - decay_start) / static_cast<double>(decay_steps));
    return peak - (peak - floor) * progress;
  }
  fail(fmt::format("unknown learning-rate schedule '{}'", s.kind),
       "use one of: cosine, wsd, constant");
}

}  // namespace foundry
