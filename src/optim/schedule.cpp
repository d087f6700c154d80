#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/error.h"
// Only the plain TrainConfig struct is used (no code from the train layer is linked).
#include "train/run_config.h"

namespace foundry {

LrSchedule lr_schedule(const TrainConfig& config) {
  LrSchedule s;
  s.kind = config.schedule;
  s.lr = config.lr;
  s.min_lr_ratio = config.min_lr_ratio;
  s.warmup_steps = config.warmup_steps;
  s.total_steps = config.steps;
  s.decay_fraction = config.decay_fraction;
  return s;
}

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

double learning_rate(const TrainConfig& config, int64_t step) {
  return learning_rate(lr_schedule(config), step);
}

}  // namespace foundry
