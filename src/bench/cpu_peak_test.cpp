#include "bench/cpu_peak.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace foundry {
namespace {

// Two processor blocks as the kernel prints them (trimmed to the fields that matter).
std::string cpuinfo_text(const std::string& vendor, int family, const std::string& flags,
                         int processors, int cores_per_socket, double mhz = 2596.138) {
  std::string out;
  for (int p = 0; p < processors; ++p) {
    out += "processor\t: " + std::to_string(p) + "\n";
    out += "vendor_id\t: " + vendor + "\n";
    out += "cpu family\t: " + std::to_string(family) + "\n";
    out += "model\t\t: 17\n";
    out += "model name\t: Test CPU " + std::to_string(p) + "\n";
    out += "cpu MHz\t\t: " + std::to_string(mhz + p) + "\n";  // later blocks differ: ignored
    out += "physical id\t: 0\n";
    out += "core id\t\t: " + std::to_string(p % cores_per_socket) + "\n";
    out += "flags\t\t: " + flags + "\n\n";
  }
  return out;
}

const char* kZen4Flags = "fpu sse sse2 avx fma avx2 avx512f avx512dq avx512bw avx512_bf16";

TEST(CpuPeak, ParsesCpuinfo) {
  const CpuInfo cpu = parse_cpuinfo(cpuinfo_text("AuthenticAMD", 25, kZen4Flags, 2, 2));
  EXPECT_EQ(cpu.vendor, "AuthenticAMD");
  EXPECT_EQ(cpu.model_name, "Test CPU 0");
  EXPECT_EQ(cpu.family, 25);
  EXPECT_EQ(cpu.model, 17);
  EXPECT_EQ(cpu.logical_cpus, 2);
  EXPECT_EQ(cpu.physical_cores, 2);
  EXPECT_DOUBLE_EQ(cpu.cpuinfo_mhz, 2596.138);
  EXPECT_TRUE(cpu.has("avx512f"));
  EXPECT_TRUE(cpu.has("avx512_bf16"));
  EXPECT_FALSE(cpu.has("amx_bf16"));
}

TEST(CpuPeak, CountsPhysicalCoresUnderSmt) {
  // Four logical CPUs on two cores (core ids 0, 1, 0, 1).
  const CpuInfo cpu = parse_cpuinfo(cpuinfo_text("GenuineIntel", 6, "avx2 fma", 4, 2));
  EXPECT_EQ(cpu.logical_cpus, 4);
  EXPECT_EQ(cpu.physical_cores, 2);
  EXPECT_EQ(cpu_peak(cpu, 0).fp32.cores, 2);  // 0 = all physical cores
}

TEST(CpuPeak, Zen4CountsTwo256BitPipes) {
  const CpuInfo cpu = parse_cpuinfo(cpuinfo_text("AuthenticAMD", 25, kZen4Flags, 2, 2, 2600.0));
  const CpuPeak peak = cpu_peak(cpu, 2);
  EXPECT_EQ(peak.isa, "avx512");
  // 2 cores × 2.6 GHz × 2 FMA × 8 fp32 lanes × 2, and twice that for bf16 (VDPBF16PS).
  EXPECT_DOUBLE_EQ(peak.fp32.flops_per_s, 2 * 2.6e9 * 2 * 8 * 2);
  EXPECT_DOUBLE_EQ(peak.bf16.flops_per_s, 2 * 2.6e9 * 2 * 16 * 2);
  EXPECT_NE(peak.fp32.basis.find("2 cores × 2.60 GHz × 2 FMA × 8 fp32 lanes × 2"),
            std::string::npos)
      << peak.fp32.basis;
  EXPECT_NE(peak.fp32.basis.find("cpu MHz"), std::string::npos) << peak.fp32.basis;
  EXPECT_NE(peak.bf16.basis.find("16 bf16 lanes"), std::string::npos) << peak.bf16.basis;
}

TEST(CpuPeak, IntelAvx512UsesMaxFrequency) {
  CpuInfo cpu = parse_cpuinfo(
      cpuinfo_text("GenuineIntel", 6, "avx2 fma avx512f avx512_bf16", 4, 4, 2000.0));
  cpu.max_freq_hz = 3.5e9;
  const CpuPeak peak = cpu_peak(cpu, 4);
  EXPECT_DOUBLE_EQ(peak.fp32.flops_per_s, 4 * 3.5e9 * 2 * 16 * 2);
  EXPECT_DOUBLE_EQ(peak.bf16.flops_per_s, 4 * 3.5e9 * 2 * 32 * 2);
  EXPECT_NE(peak.fp32.basis.find("cpuinfo_max_freq"), std::string::npos);
}

TEST(CpuPeak, Avx512WithoutBf16RunsBf16AtFp32Rate) {
  CpuInfo cpu = parse_cpuinfo(cpuinfo_text("GenuineIntel", 6, "avx2 fma avx512f", 1, 1, 3000.0));
  const CpuPeak peak = cpu_peak(cpu, 1);
  EXPECT_DOUBLE_EQ(peak.bf16.flops_per_s, peak.fp32.flops_per_s);
}

TEST(CpuPeak, AmxDrivesBf16Peak) {
  CpuInfo cpu = parse_cpuinfo(cpuinfo_text(
      "GenuineIntel", 6, "avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile", 8, 8, 2000.0));
  const CpuPeak peak = cpu_peak(cpu, 8);
  EXPECT_EQ(peak.isa, "avx512+amx");
  EXPECT_DOUBLE_EQ(peak.bf16.flops_per_s, 8 * 2.0e9 * 1 * 512 * 2);
  EXPECT_DOUBLE_EQ(peak.fp32.flops_per_s, 8 * 2.0e9 * 2 * 16 * 2);
  EXPECT_NE(peak.bf16.basis.find("AMX"), std::string::npos);
}

TEST(CpuPeak, Avx2AndSse) {
  const CpuPeak avx2 =
      cpu_peak(parse_cpuinfo(cpuinfo_text("GenuineIntel", 6, "avx2 fma", 2, 2, 3000.0)), 2);
  EXPECT_EQ(avx2.isa, "avx2");
  EXPECT_DOUBLE_EQ(avx2.fp32.flops_per_s, 2 * 3e9 * 2 * 8 * 2);
  EXPECT_DOUBLE_EQ(avx2.bf16.flops_per_s, avx2.fp32.flops_per_s);
  const CpuPeak sse =
      cpu_peak(parse_cpuinfo(cpuinfo_text("GenuineIntel", 6, "sse sse2", 1, 1, 1000.0)), 1);
  EXPECT_EQ(sse.isa, "sse");
  EXPECT_DOUBLE_EQ(sse.fp32.flops_per_s, 1e9 * 1 * 4 * 2);
}

TEST(CpuPeak, OverridesReplaceDetectedFactors) {
  const CpuInfo cpu = parse_cpuinfo(cpuinfo_text("AuthenticAMD", 25, kZen4Flags, 2, 2, 2600.0));
  const CpuPeak peak = cpu_peak(cpu, 2, PeakOverrides{3.7e9, 4});
  EXPECT_DOUBLE_EQ(peak.fp32.flops_per_s, 2 * 3.7e9 * 4 * 8 * 2);
  EXPECT_EQ(peak.clock_source, "set by hand");
  EXPECT_NE(peak.fp32.basis.find("set by hand"), std::string::npos);
}

TEST(CpuPeak, UnknownClockGivesNoPeak) {
  CpuInfo cpu = parse_cpuinfo("processor : 0\nflags : avx2 fma\n");
  const CpuPeak peak = cpu_peak(cpu, 1);
  EXPECT_EQ(peak.fp32.flops_per_s, 0);
  EXPECT_TRUE(to_json(peak.fp32)["spec_flops_per_s"].is_null());
  EXPECT_NE(to_json(peak.fp32)["spec_basis"].get<std::string>().find("unknown"), std::string::npos);
}

TEST(CpuPeak, MeasuredClockWinsOverCpuinfoButNotCpufreq) {
  CpuInfo cpu = parse_cpuinfo(cpuinfo_text("AuthenticAMD", 25, kZen4Flags, 2, 2, 2600.0));
  cpu.measured_clock_hz = 3.6e9;
  CpuPeak peak = cpu_peak(cpu, 2);
  EXPECT_DOUBLE_EQ(peak.fp32.clock_hz, 3.6e9);
  EXPECT_NE(peak.clock_source.find("measured"), std::string::npos);
  EXPECT_NE(peak.clock_source.find("2.60 GHz"), std::string::npos);
  cpu.max_freq_hz = 3.7e9;
  EXPECT_DOUBLE_EQ(cpu_peak(cpu, 2).fp32.clock_hz, 3.7e9);
  EXPECT_DOUBLE_EQ(cpu_peak(cpu, 2, PeakOverrides{2.0e9, 0}).fp32.clock_hz, 2.0e9);
}

TEST(CpuPeak, MeasuresAPlausibleClock) {
#if defined(__x86_64__)
  const ClockReading clock = measure_clock();
  EXPECT_GT(clock.hz, 0.5e9);
  EXPECT_LT(clock.hz, kMaxPlausibleClockHz);
  // The multiply chain has no shortcut on any core: on its own it must read a real clock.
  EXPECT_GT(clock.mul_chain_hz, 0.5e9);
  EXPECT_LT(clock.mul_chain_hz, kMaxPlausibleClockHz);
  // The kernel's "cpu MHz" (the base clock in most VMs, the current one elsewhere) is within a
  // factor of 2.5 of the clock a core sustains.
  const CpuInfo cpu = read_cpu_info();
  if (cpu.cpuinfo_mhz > 0) {
    EXPECT_GT(clock.hz, cpu.cpuinfo_mhz * 1e6 / 2.5) << cpu.model_name;
    EXPECT_LT(clock.hz, cpu.cpuinfo_mhz * 1e6 * 2.5) << cpu.model_name;
  }
  std::printf("[ clock ] %.2f GHz (add chain %.2f, multiply chain %.2f, cpu MHz %.0f)\n",
              clock.hz / 1e9, clock.add_chain_hz / 1e9, clock.mul_chain_hz / 1e9,
              cpu.cpuinfo_mhz);
#endif
}

TEST(CpuPeak, ReadsCpuinfoAndCpufreqFiles) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(testing::TempDir()) / "cpu_peak_fake_sysfs";
  fs::remove_all(dir);
  fs::create_directories(dir / "cpu0" / "cpufreq");
  std::ofstream(dir / "cpuinfo") << cpuinfo_text("AuthenticAMD", 25, kZen4Flags, 2, 2);
  std::ofstream(dir / "cpu0" / "cpufreq" / "cpuinfo_max_freq") << "3700000\n";
  const CpuInfo cpu = read_cpu_info((dir / "cpuinfo").string(), dir.string());
  EXPECT_DOUBLE_EQ(cpu.max_freq_hz, 3.7e9);
  EXPECT_EQ(cpu.physical_cores, 2);
  EXPECT_DOUBLE_EQ(cpu_peak(cpu, 2).fp32.clock_hz, 3.7e9);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace foundry
