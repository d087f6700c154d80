// Learning-rate schedules. Steps are 1-based: step 1 is the first optimizer update.
//
// With peak rate lr, floor lr_min = lr * min_lr_ratio, W = warmup_steps, S = steps (the last
// step of the run):
//
//   warmup (every schedule), 1 <= step <= W:
//       lr(step) = lr * step / W                        (step 1 gets lr / W, step W gets lr)
//   "constant", step > W:
//       lr(step) = lr
//   "cosine", step > W:
//       progress = min(1, (step - W) / (S - W))         (1 when S <= W)
//       lr(step) = lr_min + (lr - lr_min) * (1 + cos(pi * progress)) / 2
//       (lr right after warmup, lr_min at step S and after)
//   "wsd" (warmup, stable, decay), step > W, with D = round(decay_fraction * S) decay steps:
//       step <= S - D:  lr(step) = lr                                           (stable)
//       step >  S - D:  lr(step) = lr - (lr - lr_min) * min(1, (step - (S - D)) / D)
//       (the first decay step is already below lr; step S gets lr_min)
//
// Steps past S keep the final rate (lr_min; lr for "constant" and for "wsd" with D = 0).
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace foundry {

enum class ScheduleKind { cosine, wsd, constant };
// The schedule named "cosine", "wsd" or "constant"; empty for any other name.
std::optional<ScheduleKind> parse_schedule(std::string_view name);
const char* schedule_name(ScheduleKind kind);  // the name parse_schedule reads

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::cosine;
  double lr = 3e-4;             // peak
  double min_lr_ratio = 0.1;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;      // S
  double decay_fraction = 0.2;  // wsd only
};

// The learning rate for 1-based `step` (formulas above). Fails on step < 1.
double learning_rate(const LrSchedule& schedule, int64_t step);

}  // namespace foundry
