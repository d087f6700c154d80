#include "train/mfu.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include "base/bf16.h"
#include "base/config_reader.h"
#include "base/io.h"
#include "base/timer.h"
#include "comm/agree.h"
#include "comm/comm.h"
#include "cuda/blas.h"
#include "cuda/runtime.h"
#include "kernels/gemm.h"
#include "train/processes.h"
#include "train/run_config.h"

namespace foundry {

namespace {

// The number of devices the job runs on: its hosts for a CPU profile, its ranks otherwise.
int64_t devices_in_job(const Processes& procs, bool device_is_host) {
  if (!device_is_host || !procs.world()) return device_is_host ? 1 : procs.ranks();
  const std::vector<std::string> hosts = allgather_strings(*procs.world(), host_name());
  return static_cast<int64_t>(std::set<std::string>(hosts.begin(), hosts.end()).size());
}

// The job peak the run directory's metrics.jsonl records last, if its source is `source`;
// 0 when there is none.
double earlier_measured_peak(const std::string& run_dir, const std::string& source) {
  std::string last;
  for_each_line_from_end(run_dir + "/metrics.jsonl", [&](std::string_view line, int64_t) {
    last = line;
    return line.empty();
  });
  const json m = json::parse(last, nullptr, /*allow_exceptions=*/false);
  if (!m.is_object() || m.value("peak_source", "") != source) return 0;
  const double gflops = m.value("peak_gflops", 0.0);
  return gflops > 0 ? gflops * 1e9 : 0;
}

}  // namespace

double measure_gemm_peak(bool use_bf16, int bursts) {
  const int64_t n = 2048;
  std::vector<float> a(n * n, 0.5f), c(n * n);
  std::vector<bf16> ah(n * n);
  convert_to_bf16(a.data(), ah.data(), n * n);
  const void* ap = use_bf16 ? static_cast<const void*>(ah.data()) : a.data();
  const DType dt = use_bf16 ? DType::bf16 : DType::f32;
  gemm(ap, false, ap, true, c.data(), n, n, n, dt);  // warm-up and primitive creation
  double best = 1e30;
  for (int burst = 0; burst < bursts; ++burst) {
    if (burst > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (int rep = 0; rep < 3; ++rep) {
      const double t0 = now_seconds();
      gemm(ap, false, ap, true, c.data(), n, n, n, dt);
      best = std::min(best, now_seconds() - t0);
    }
  }
  return 2.0 * n * n * n / best;
}

double measure_gpu_gemm_peak(bool use_bf16, int bursts) {
  const int64_t n = 8192;
  const int64_t elem = use_bf16 ? 2 : 4;
  gpu::DeviceBuffer a(n * n * elem), c(n * n * 4);
  a.fill_bytes(0x3c);  // small normal values in both precisions
  const DType dt = use_bf16 ? DType::bf16 : DType::f32;
  gpu::gemm(a.data(), false, a.data(), true, c.as<float>(), n, n, n, dt);  // warm-up, plan
  gpu::GpuTimer timer;
  double best = 1e30;
  for (int burst = 0; burst < bursts; ++burst) {
    for (int rep = 0; rep < 3; ++rep) {
      timer.start();
      gpu::gemm(a.data(), false, a.data(), true, c.as<float>(), n, n, n, dt);
      best = std::min(best, timer.seconds());
    }
  }
  return 2.0 * n * n * n / best;
}

MfuPeak choose_mfu_peak(const TrainConfig& tc, const std::optional<DevicePeak>& profile,
                        const Processes& procs, bool resuming) {
  if (tc.peak_gflops > 0)
    return {tc.peak_gflops * 1e9 * procs.ranks(),
            fmt::format("train.peak_gflops {:g} per process", tc.peak_gflops)};
  if (profile) {
    const int64_t devices = devices_in_job(procs, profile->device_is_host);
    return {profile->flops_per_s * static_cast<double>(devices),
            fmt::format("{} × {} {}", profile->source, devices,
                        profile->device_is_host ? (devices == 1 ? "host" : "hosts")
                                                : (devices == 1 ? "device" : "devices"))};
  }
  const std::string measured =
      fmt::format("measured at start: best {} {}GEMM of 5 bursts{}", dtype_name(tc.precision),
                  tc.device.cuda ? fmt::format("cuBLASLt ({}) ", tc.device.name()) : "",
                  procs.ranks() > 1 ? fmt::format(", summed over {} ranks", procs.ranks()) : "");
  // A resumed run divides by the peak its first attempt measured (the same source, so the same
  // precision and ranks): its MFU figures stay comparable, and a restart saves the seconds.
  double peak = resuming && procs.root() ? earlier_measured_peak(tc.run_dir, measured) : 0;
  if (procs.world()) procs.world()->broadcast(&peak, 1, 0);
  if (peak > 0) return {peak, measured};
  // Every rank measures at once, so on a shared host each sees its share of the cores: the
  // sum is the job's peak.
  peak = tc.device.cuda ? measure_gpu_gemm_peak(tc.precision == DType::bf16)
                        : measure_gemm_peak(tc.precision == DType::bf16);
  if (procs.world()) procs.world()->allreduce(&peak, &peak, 1);
  return {peak, measured};
}

std::string MfuWatch::check(int64_t step, double mfu) {
  if (mfu <= 1.0 || warned_) return {};
  warned_ = true;
  return fmt::format(
      "step {}: MFU {:.1f}% is above 100%, so the peak it divides by ({:.0f} GFLOP/s, {}) is "
      "below what the step achieved, or the model FLOP count is wrong; MFU figures of this "
      "run are not trustworthy. Give the machine's measured peak: train.hardware_profile "
      "(a profile from `foundry bench all`) or train.peak_gflops",
      step, 100 * mfu, peak_.flops_per_s / 1e9, peak_.source);
}

}  // namespace foundry
