#include "bench/cpu_peak.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <sstream>
#include <utility>

namespace foundry {

namespace {

std::string trim(const std::string& s) {
  const auto start = s.find_first_not_of(" \t");
  if (start == std::string::npos) return "";
  const auto end = s.find_last_not_of(" \t\r");
  return s.substr(start, end - start + 1);
}

int to_int(const std::string& s, int fallback) {
  try {
    return std::stoi(s);
  } catch (...) {
    return fallback;
  }
}

double to_double(const std::string& s, double fallback) {
  try {
    return std::stod(s);
  } catch (...) {
    return fallback;
  }
}

// The vector-unit shape of one core: `units` FMA pipes, each doing `fp32_lanes` fp32 or
// `bf16_lanes` bf16 multiply-adds per cycle, with the reason in words.
struct VectorShape {
  std::string isa;
  int units = 1;
  int fp32_lanes = 4;
  int bf16_lanes = 4;
  std::string note;
};

VectorShape vector_shape(const CpuInfo& cpu) {
  VectorShape v;
  if (cpu.has("avx512f")) {
    v.isa = "avx512";
    v.units = 2;
    v.fp32_lanes = 16;
    if (cpu.vendor == "AuthenticAMD" && cpu.family == 0x19) {
      // Zen 4 executes a 512-bit FMA as two halves on its two 256-bit FMA pipes, so a core
      // retires 16 fp32 FMAs per cycle, the same as with AVX2.
      v.fp32_lanes = 8;
      v.note = "Zen 4 runs 512-bit FMAs on two 256-bit pipes";
    } else if (cpu.vendor == "AuthenticAMD") {
      v.note = "AMD with full 512-bit FMA pipes (Zen 5 or later)";
    } else {
      v.note = "assumes 2 AVX-512 FMA units per core (some Xeon Silver/Bronze have 1)";
    }
    // VDPBF16PS multiplies two bf16 pairs per fp32 lane, twice the fp32 rate. Without it,
    // oneDNN converts bf16 to fp32 and multiplies at the fp32 rate.
    v.bf16_lanes = cpu.has("avx512_bf16") ? 2 * v.fp32_lanes : v.fp32_lanes;
    if (!cpu.has("avx512_bf16")) v.note += "; no avx512_bf16: bf16 at the fp32 rate";
  } else if (cpu.has("avx2") && cpu.has("fma")) {
    v.isa = "avx2";
    v.units = 2;
    v.fp32_lanes = v.bf16_lanes = 8;
    v.note = "assumes 2 FMA units per core; bf16 at the fp32 rate";
  } else {
    v.isa = "sse";
    v.units = 1;
    v.fp32_lanes = v.bf16_lanes = 4;
    v.note = "no FMA: one add and one multiply pipe counted as one FMA unit";
  }
  return v;
}

std::string ghz(double hz) { return fmt::format("{:.2f} GHz", hz / 1e9); }

DtypePeak make_peak(int cores, double clock_hz, int units, int lanes, const char* unit_name,
                    const char* lane_name, const std::string& clock_source,
                    const std::string& note) {
  DtypePeak p;
  p.cores = cores;
  p.clock_hz = clock_hz;
  p.units = units;
  p.lanes = lanes;
  p.flops_per_s = static_cast<double>(cores) * clock_hz * units * lanes * 2.0;
  p.basis = fmt::format("{} core{} × {} × {} {} × {} {} lanes × 2 = {:.1f} GFLOP/s; clock: {}",
                        cores, cores == 1 ? "" : "s", ghz(clock_hz), units, unit_name, lanes,
                        lane_name, p.flops_per_s / 1e9, clock_source);
  if (!note.empty()) p.basis += "; " + note;
  return p;
}

}  // namespace

CpuInfo parse_cpuinfo(const std::string& text) {
  CpuInfo cpu;
  std::istringstream in(text);
  std::string line;
  std::set<std::pair<int, int>> cores;  // (physical id, core id)
  int physical_id = -1;
  bool first = true;  // fields of the first processor block only, except the counts
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    const std::string value = trim(line.substr(colon + 1));
    if (key == "processor") {
      if (cpu.logical_cpus > 0) first = false;
      ++cpu.logical_cpus;
    } else if (key == "physical id") {
      physical_id = to_int(value, -1);
    } else if (key == "core id") {
      cores.emplace(physical_id, to_int(value, -1));
    } else if (!first) {
      continue;
    } else if (key == "vendor_id") {
      cpu.vendor = value;
    } else if (key == "model name") {
      cpu.model_name = value;
    } else if (key == "cpu family") {
      cpu.family = to_int(value, -1);
    } else if (key == "model") {
      cpu.model = to_int(value, -1);
    } else if (key == "cpu MHz") {
      cpu.cpuinfo_mhz = to_double(value, 0);
    } else if (key == "flags") {
      std::istringstream words(value);
      std::string flag;
      while (words >> flag) cpu.flags.insert(flag);
    }
  }
  cpu.physical_cores = cores.empty() ? cpu.logical_cpus : static_cast<int>(cores.size());
  return cpu;
}

CpuInfo read_cpu_info(const std::string& cpuinfo_path, const std::string& cpu_sysfs_dir) {
  std::ifstream in(cpuinfo_path);
  std::stringstream text;
  text << in.rdbuf();
  CpuInfo cpu = parse_cpuinfo(text.str());
  std::ifstream freq(cpu_sysfs_dir + "/cpu0/cpufreq/cpuinfo_max_freq");
  double khz = 0;
  if (freq >> khz && khz > 0) cpu.max_freq_hz = khz * 1e3;
  return cpu;
}

CpuPeak cpu_peak(const CpuInfo& cpu, int cores, const PeakOverrides& overrides) {
  CpuPeak peak;
  if (cores <= 0) cores = cpu.physical_cores > 0 ? cpu.physical_cores : 1;
  double clock_hz = 0;
  if (overrides.clock_hz > 0) {
    clock_hz = overrides.clock_hz;
    peak.clock_source = "set by hand";
  } else if (cpu.max_freq_hz > 0) {
    clock_hz = cpu.max_freq_hz;
    peak.clock_source = "cpufreq cpuinfo_max_freq (the boost clock; AVX-512 may run lower)";
  } else if (cpu.measured_clock_hz > 0) {
    clock_hz = cpu.measured_clock_hz;
    peak.clock_source =
        cpu.cpuinfo_mhz > 0
            ? fmt::format(
                  "measured by dependent add and multiply chains (no cpufreq; /proc/cpuinfo "
                  "says {:.2f} GHz)",
                  cpu.cpuinfo_mhz / 1e3)
            : std::string("measured by dependent add and multiply chains (no cpufreq)");
  } else if (cpu.cpuinfo_mhz > 0) {
    clock_hz = cpu.cpuinfo_mhz * 1e6;
    peak.clock_source = "/proc/cpuinfo cpu MHz (often the base clock; boost may be higher)";
  } else {
    peak.clock_source = "unknown (no cpufreq and no cpu MHz): peak not estimated";
  }

  VectorShape v = vector_shape(cpu);
  if (overrides.fma_units > 0) {
    v.units = overrides.fma_units;
    v.note = "FMA units set by hand";
  }
  peak.isa = v.isa;
  peak.fp32 = make_peak(cores, clock_hz, v.units, v.fp32_lanes, "FMA", "fp32",
                        peak.clock_source, v.note);
  if (cpu.has("amx_bf16") && cpu.has("amx_tile")) {
    // One AMX tile unit per core does 512 bf16 multiply-adds per cycle (1024 FLOPs), and
    // oneDNN uses it for bf16 matmul when present.
    peak.isa += "+amx";
    peak.bf16 = make_peak(cores, clock_hz, 1, 512, "AMX TMUL", "bf16", peak.clock_source,
                          "AMX bf16 tile multiply");
  } else {
    peak.bf16 = make_peak(cores, clock_hz, v.units, v.bf16_lanes, "FMA", "bf16",
                          peak.clock_source, v.note);
  }
  return peak;
}

namespace {

#if defined(__x86_64__)
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Cycles per second implied by a chain of `ops` dependent instructions of `latency` cycles
// each, run by `chain`: the best of five trials.
template <typename Chain>
double chain_rate(Chain chain, int64_t ops, int latency) {
  double best = 0;
  for (int trial = 0; trial < 5; ++trial) {
    const double start = thread_cpu_seconds();
    chain();
    const double seconds = thread_cpu_seconds() - start;
    if (seconds > 0) best = std::max(best, static_cast<double>(ops) * latency / seconds);
  }
  return best;
}
#endif

}  // namespace

ClockReading measure_clock() {
  ClockReading r;
#if defined(__x86_64__)
  constexpr int64_t kLoops = 50000, kOpsPerLoop = 1000;
  // Register-register adds: one cycle each, and no renamer can fold them (some Intel cores
  // execute chains of add-immediate at rename, many a cycle, which is why the addend is a
  // register whose value the core cannot know in advance).
  r.add_chain_hz = chain_rate(
      [] {
        uint64_t x = 0, one = 1;
        asm volatile("" : "+r"(one));
        for (int64_t i = 0; i < kLoops; ++i)
          asm volatile(".rept 1000\n\taddq %1, %0\n\t.endr" : "+r"(x) : "r"(one));
      },
      kLoops * kOpsPerLoop, 1);
  // 64-bit multiplies: three cycles each on every x86-64 core of the last fifteen years.
  r.mul_chain_hz = chain_rate(
      [] {
        uint64_t x = 3, k = 0x9E3779B97F4A7C15ull;
        asm volatile("" : "+r"(k));
        for (int64_t i = 0; i < kLoops / 3; ++i)
          asm volatile(".rept 1000\n\timulq %1, %0\n\t.endr" : "+r"(x) : "r"(k));
      },
      kLoops / 3 * kOpsPerLoop, 3);
  // A shortcut can only make a chain look faster than the clock, never slower: the lower of
  // the two is the clock. Outside the range of real cores, neither is.
  const double hz = std::min(r.add_chain_hz, r.mul_chain_hz);
  if (hz >= kMinPlausibleClockHz && hz <= kMaxPlausibleClockHz) r.hz = hz;
#endif
  return r;
}

double measure_clock_hz() { return measure_clock().hz; }

nlohmann::json to_json(const DtypePeak& p) {
  nlohmann::json j;
  j["spec_flops_per_s"] = p.flops_per_s > 0 ? nlohmann::json(p.flops_per_s) : nlohmann::json();
  j["spec_basis"] = p.basis;
  return j;
}

}  // namespace foundry
