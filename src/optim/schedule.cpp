#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/error.h"

namespace foundry {

std::optional<ScheduleKind> parse_schedule(std::string_view name) {
  if (name == "cosine") return ScheduleKind::cosine;
  if (name == "wsd") return ScheduleKind::wsd;
  if (name == "constant") return ScheduleKind::constant;
  return std::nullopt;
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::cosine: return "cosine";
    case ScheduleKind::wsd: return "wsd";
    case ScheduleKind::constant: return "constant";
  }
  return "?";
}

namespace {

double cosine(const LrSchedule& s, int64_t step) {
  const double floor = s.lr * s.min_lr_ratio;
  const int64_t warmup = s.warmup_steps, total = s.total_steps;
  const double progress =
      total > warmup ? std::min(1.0, static_cast<double>(step - warmup) /
                                         static_cast<double>(total - warmup))
                     : 1.0;
  return floor + (s.lr - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

double wsd(const LrSchedule& s, int64_t step) {
  const double floor = s.lr * s.min_lr_ratio;
  const int64_t total = s.total_steps;
  const int64_t decay_steps =
      std::llround(std::clamp(s.decay_fraction, 0.0, 1.0) * static_cast<double>(total));
  const int64_t decay_start = total - decay_steps;  // last stable step
  if (step <= decay_start || decay_steps == 0) return s.lr;
  const double progress = std::min(
      1.0, static_cast<double>(step - decay_start) / static_cast<double>(decay_steps));
  return s.lr - (s.lr - floor) * progress;
}

}  // namespace

double learning_rate(const LrSchedule& s, int64_t step) {
  if (step < 1) fail(fmt::format("learning-rate step {} must be >= 1 (steps are 1-based)", step));
  if (step <= s.warmup_steps)
    return s.lr * static_cast<double>(step) / static_cast<double>(s.warmup_steps);
  if (s.kind == ScheduleKind::constant) return s.lr;
  return s.kind == ScheduleKind::cosine ? cosine(s, step) : wsd(s, step);
}

}  // namespace foundry
