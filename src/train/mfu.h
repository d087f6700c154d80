// The denominator of MFU and the watch on its numerator.
//
// MFU = model FLOPs per step (train_flops_per_token · tokens, model/info.h) / step time /
// the job's peak FLOP/s for the run's GEMM precision. The peak comes from, in this order:
//   1. train.peak_gflops (per process, times the ranks): a number the user vouches for;
//   2. train.hardware_profile: the profile's measured GEMM peak (`foundry bench`), per device,
//      times the devices the job uses (a CPU profile's device is one host);
//   3. otherwise a measurement at the start of the run: the best of several bursts of large
//      GEMMs spread over about a second, so one busy moment does not set it.
// The log's header, every metrics.jsonl line (`peak_gflops`, `peak_source`) and the summary
// say which. A step above 100% means the peak or the FLOP count is wrong: MfuWatch reports
// the first such step with what to do.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace foundry {

class Processes;
struct TrainConfig;

// A per-device peak read from a hardware profile (the command line resolves
// train.hardware_profile, since profiles belong to the bench layer).
struct DevicePeak {
  double flops_per_s = 0;
  std::string source;          // e.g. "profile profiles/dev-machine.json, measured bf16 GEMM peak"
  bool device_is_host = true;  // CPU profiles: one device per host; GPU profiles: per rank
};

struct MfuPeak {
  double flops_per_s = 0;  // the whole job's
  std::string source;
};

// Collective over the job's ranks (they measure at once and agree on one value). `resuming`:
// a measured peak is taken from the run directory's metrics.jsonl when the earlier attempt
// measured it under the same precision and ranks.
MfuPeak choose_mfu_peak(const TrainConfig& tc, const std::optional<DevicePeak>& profile,
                        const Processes& procs, bool resuming);

// The best rate of 2048³ oneDNN matmuls in the given precision over `bursts` bursts of three,
// 50 ms apart, on this process's threads (FLOP/s).
double measure_gemm_peak(bool use_bf16, int bursts = 5);
// The same on the current GPU: 8192³ cuBLASLt products timed with CUDA events.
double measure_gpu_gemm_peak(bool use_bf16, int bursts = 5);

// Sees every step's MFU; the first above 100% gets one message (rank 0's log).
class MfuWatch {
 public:
  explicit MfuWatch(MfuPeak peak) : peak_(std::move(peak)) {}
  const MfuPeak& peak() const { return peak_; }
  double mfu(double model_flops_per_s) const { return model_flops_per_s / peak_.flops_per_s; }
  // The warning for `step` at `mfu` if it is the first above 1, else empty.
  std::string check(int64_t step, double mfu);

 private:
  MfuPeak peak_;
  bool warned_ = false;
};

}  // namespace foundry
