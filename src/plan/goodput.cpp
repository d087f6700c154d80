#include "plan/goodput.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace foundry {

double young_interval_s(double stall_s, double mtbf_s) {
  if (!std::isfinite(mtbf_s) || mtbf_s <= 0) return 0;
  return std::sqrt(2.0 * stall_s * mtbf_s);
}

double daly_interval_s(double stall_s, double mtbf_s) {
  if (!std::isfinite(mtbf_s) || mtbf_s <= 0) return 0;
  if (stall_s >= 2.0 * mtbf_s) return mtbf_s;
  const double r = stall_s / (2.0 * mtbf_s);
  return std::sqrt(2.0 * stall_s * mtbf_s) * (1.0 + std::sqrt(r) / 3.0 + r / 9.0) - stall_s;
}

double goodput_at(double interval_s, double stall_s, double write_s, double restart_s,
                  double mtbf_s) {
  const double cycle = interval_s + stall_s;
  const double saving = cycle > 0 ? interval_s / cycle : 1.0;
  if (!std::isfinite(mtbf_s)) return saving;
  const double lost = restart_s + write_s + cycle / 2.0;
  return std::clamp(saving * (1.0 - lost / mtbf_s), 0.0, 1.0);
}

GoodputPrediction predict_goodput(const GoodputInputs& in) {
  GoodputPrediction g;
  const double rate_per_s = double(in.devices) * in.failures_per_device_hour / 3600.0;
  g.mtbf_s = rate_per_s > 0 ? 1.0 / rate_per_s : std::numeric_limits<double>::infinity();
  g.young_s = young_interval_s(in.checkpoint_stall_s, g.mtbf_s);
  g.daly_s = daly_interval_s(in.checkpoint_stall_s, g.mtbf_s);
  if (in.interval_s > 0) {
    g.interval_s = in.interval_s;
  } else if (std::isfinite(g.mtbf_s)) {
    g.interval_s = std::max(g.daly_s, in.checkpoint_write_s);
  }
  if (!std::isfinite(g.mtbf_s) && in.interval_s <= 0) return g;  // no failures, no saves
  g.lost_per_failure_s =
      in.restart_s + in.checkpoint_write_s + (g.interval_s + in.checkpoint_stall_s) / 2.0;
  g.goodput = goodput_at(g.interval_s, in.checkpoint_stall_s, in.checkpoint_write_s,
                         in.restart_s, g.mtbf_s);
  return g;
}

GoodputInputs goodput_defaults(double checkpoint_bytes, int64_t devices, bool gpu) {
  constexpr double kGpuSnapshot = 25e9, kCpuSnapshot = 7e9;       // bytes/s
  constexpr double kWritePerDevice = 1e9, kWriteAggregate = 100e9;  // bytes/s
  constexpr double kLaunchRestart = 3.5;                            // s
  GoodputInputs in;
  in.devices = devices;
  const double per_device = checkpoint_bytes / double(std::max<int64_t>(1, devices));
  in.checkpoint_stall_s = per_device / (gpu ? kGpuSnapshot : kCpuSnapshot);
  const double write_bw = std::min(kWriteAggregate, kWritePerDevice * double(devices));
  in.checkpoint_write_s = checkpoint_bytes / write_bw;
  in.restart_s = kLaunchRestart + in.checkpoint_write_s;
  return in;
}

}  // namespace foundry
