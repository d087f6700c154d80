// The theoretical compute peak of this CPU, per GEMM input dtype: cores × clock × FMA units ×
// vector lanes × 2 FLOPs per fused multiply-add.
//
// It is an estimate. /proc/cpuinfo tells the instruction sets (avx512f, avx512_bf16, amx_bf16)
// but not how many FMA pipes a core has nor the clock it sustains under AVX-512 load, so the
// result carries its basis as a sentence ("2 cores × 2.60 GHz × 2 FMA × 16 fp32 lanes × 2")
// and every factor can be overridden. The second denominator, the best measured GEMM rate,
// comes from gemm_bench.
#pragma once
#include <nlohmann/json.hpp>

#include <set>
#include <string>

namespace foundry {

// What /proc/cpuinfo and sysfs say about the CPU.
struct CpuInfo {
  std::string vendor;       // "AuthenticAMD", "GenuineIntel"
  std::string model_name;   // "AMD EPYC 9454"
  int family = -1;          // "cpu family"
  int model = -1;           // "model"
  std::set<std::string> flags;
  int logical_cpus = 0;     // "processor" entries
  int physical_cores = 0;   // distinct (physical id, core id) pairs; logical_cpus if absent
  double cpuinfo_mhz = 0;   // "cpu MHz" of the first processor (often the base clock in VMs)
  double max_freq_hz = 0;   // cpufreq/cpuinfo_max_freq, 0 when absent
  double measured_clock_hz = 0;  // measure_clock_hz(), when the caller ran it

  bool has(const std::string& flag) const { return flags.count(flag) > 0; }
};

// Parses the text of /proc/cpuinfo (pure; the tests feed it fixtures).
CpuInfo parse_cpuinfo(const std::string& text);
// Reads /proc/cpuinfo and <cpu_sysfs_dir>/cpu0/cpufreq/cpuinfo_max_freq (kHz).
CpuInfo read_cpu_info(const std::string& cpuinfo_path = "/proc/cpuinfo",
                      const std::string& cpu_sysfs_dir = "/sys/devices/system/cpu");

// The clock this core actually runs at, timed in thread CPU time (so preemption does not
// count) over two chains of dependent instructions of known latency: register-register adds
// (one cycle) and 64-bit multiplies (three). Virtual machines often have no cpufreq and
// report the base clock as "cpu MHz" while the core boosts well above it. A core may run a
// chain faster than its latency says (Intel's Golden Cove folds add-immediate chains at
// rename, many a cycle), never slower, so the clock is the lower of the two; a reading
// outside [0.3, 7] GHz is no reading. Takes about 0.4 s.
struct ClockReading {
  double hz = 0;            // the clock; 0 where it cannot be measured (not x86-64)
  double add_chain_hz = 0;  // what each chain alone implies
  double mul_chain_hz = 0;
};
inline constexpr double kMinPlausibleClockHz = 0.3e9, kMaxPlausibleClockHz = 7e9;
ClockReading measure_clock();
double measure_clock_hz();  // measure_clock().hz

// Factors of the estimate set by hand (0 = detect).
struct PeakOverrides {
  double clock_hz = 0;
  int fma_units = 0;  // FMA pipes per core for the vector unit (AMX unaffected)
};

// One dtype's estimate: flops_per_s = cores × clock_hz × units × lanes × 2.
struct DtypePeak {
  double flops_per_s = 0;
  int cores = 0;
  double clock_hz = 0;
  int units = 0;           // FMA pipes (or AMX tile units) per core
  int lanes = 0;           // multiply-adds per unit per cycle
  std::string basis;       // the formula with its numbers and where each came from
};

struct CpuPeak {
  std::string isa;            // "avx512", "avx512+amx", "avx2", "sse"
  std::string clock_source;   // where the clock came from
  DtypePeak fp32, bf16;
};

// The estimate for `cores` cores (the cores the benchmark runs on; 0 = all physical cores).
// The clock is, in order: the override, cpufreq's maximum, the measured clock, "cpu MHz".
// Pure.
CpuPeak cpu_peak(const CpuInfo& cpu, int cores, const PeakOverrides& overrides = {});

// {"spec_flops_per_s", "spec_basis"} of one dtype (the profile's "compute" section adds the
// measured rate, see gemm_bench.h).
nlohmann::json to_json(const DtypePeak& p);

}  // namespace foundry
