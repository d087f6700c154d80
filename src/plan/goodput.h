// Goodput at scale: the share of a run's wall time that trains, given failures, checkpoint
// saves and restarts, and the checkpoint interval that maximizes it.
//
// A run of N devices fails at λ per device-hour, so the job's mean time between failures is
// M = 1/(N·λ). Every τ seconds of training the loop stalls δ seconds for a checkpoint (the
// snapshot copy; the write goes on in the background and commits w seconds later). A failure
// costs the restart R plus the work since the latest committed checkpoint, on average half an
// interval plus the commit delay. To first order in 1/M:
//   goodput(τ) = τ/(τ + δ) · (1 − (R + w + (τ + δ)/2) / M)
// Young (1974): τ ≈ sqrt(2·δ·M). Daly (2006), higher order, for δ < 2M:
//   τ = sqrt(2·δ·M)·(1 + sqrt(δ/(2M))/3 + δ/(18M)) − δ, and τ = M beyond.
// An interval shorter than the write would start a save before the last one committed, so
// the best interval is at least w.
#pragma once
#include <cstdint>

namespace foundry {

struct GoodputInputs {
  int64_t devices = 1;
  double failures_per_device_hour = 0;  // λ
  double checkpoint_stall_s = 0;        // δ: the training loop blocked per save
  double checkpoint_write_s = 0;        // w: from the snapshot to the committed checkpoint
  double restart_s = 0;                 // R: from a failure to the first step of the restart
  double interval_s = 0;                // τ to evaluate; 0 = the best (Daly)
};

struct GoodputPrediction {
  double mtbf_s = 0;          // M (infinite without failures)
  double young_s = 0;         // Young's interval (0 without failures)
  double daly_s = 0;          // Daly's interval (0 without failures)
  double interval_s = 0;      // the interval evaluated (0 = never: no failures)
  double lost_per_failure_s = 0;  // R + w + (τ + δ)/2
  double goodput = 1;
};

double young_interval_s(double stall_s, double mtbf_s);
double daly_interval_s(double stall_s, double mtbf_s);
// goodput(τ) above, clamped to [0, 1]; 1 with M infinite and δ = 0.
double goodput_at(double interval_s, double stall_s, double write_s, double restart_s,
                  double mtbf_s);
GoodputPrediction predict_goodput(const GoodputInputs& in);

// Defaults for a run whose checkpoint holds `checkpoint_bytes` (fp32 weights and optimizer
// state) over `devices`, when none are given (docs/planning.md, "Goodput"):
//   δ = a device's share / the snapshot copy rate: 25 GB/s device-to-host on a GPU (an
//       assumption), 7 GB/s on a CPU (measured: PERFORMANCE.md, "Checkpoints");
//   w = all of it / the aggregate write bandwidth: 1 GB/s per device (measured here:
//       0.36–1.1 GB/s per rank) up to 100 GB/s (a parallel file system; an assumption);
//   R = 3.5 s (foundry launch's measured restart, fault to first step) + reading it back at
//       the write bandwidth.
GoodputInputs goodput_defaults(double checkpoint_bytes, int64_t devices, bool gpu);

}  // namespace foundry
