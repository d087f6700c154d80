#include "base/memory_budget.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "base/test_expect_error.h"

namespace foundry {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kGiB = int64_t{1} << 30;

// A fake /proc/self/cgroup, cgroup mount and /proc/meminfo in a fresh directory.
class FakeMemoryFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(root_);
    fs::create_directories(root_ / "cgroup");
    files_ = {(root_ / "proc_cgroup").string(), (root_ / "cgroup").string(),
              (root_ / "meminfo").string()};
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  void cgroup_file(const std::string& dir, const std::string& name, const std::string& text) {
    write(root_ / "cgroup" / dir / name, text);
  }
  void meminfo_available_gib(int64_t gib) {
    write(files_.meminfo, "MemTotal:       99999999 kB\nMemFree:         1000 kB\n"
                          "MemAvailable:   " + std::to_string(gib * 1024 * 1024) + " kB\n");
  }

  fs::path root_;
  MemoryFiles files_;
};

TEST_F(FakeMemoryFiles, MemAvailableBoundsAProcessOutsideAnyLimitedCgroup) {
  write(files_.proc_cgroup, "0::/user.slice\n");
  cgroup_file("user.slice", "memory.max", "max\n");
  cgroup_file("user.slice", "memory.current", "123456\n");
  meminfo_available_gib(20);
  const MemoryBudget b = detect_memory_budget(files_);
  EXPECT_EQ(b.source, BudgetSource::meminfo);
  EXPECT_EQ(b.bytes, 20 * kGiB);
}

TEST_F(FakeMemoryFiles, CgroupV2LimitMinusUsageWithoutReclaimableCache) {
  write(files_.proc_cgroup, "0::/job\n");
  cgroup_file("job", "memory.max", std::to_string(8 * kGiB) + "\n");
  cgroup_file("job", "memory.current", std::to_string(3 * kGiB) + "\n");
  cgroup_file("job", "memory.stat", "anon 100\nfile 2000\ninactive_file " +
                                        std::to_string(kGiB) + "\nactive_file 5\n");
  meminfo_available_gib(20);
  const MemoryBudget b = detect_memory_budget(files_);
  EXPECT_EQ(b.source, BudgetSource::cgroup_v2);
  EXPECT_EQ(b.bytes, 6 * kGiB);  // 8 − (3 − 1)
}

TEST_F(FakeMemoryFiles, AParentCgroupsLimitBindsItsChildren) {
  write(files_.proc_cgroup, "0::/a/b\n");
  cgroup_file("a/b", "memory.max", "max\n");
  cgroup_file("a", "memory.max", std::to_string(4 * kGiB));
  cgroup_file("a", "memory.current", std::to_string(kGiB));
  meminfo_available_gib(20);
  const MemoryBudget b = detect_memory_budget(files_);
  EXPECT_EQ(b.source, BudgetSource::cgroup_v2);
  EXPECT_EQ(b.bytes, 3 * kGiB);
}

TEST_F(FakeMemoryFiles, CgroupV1MemoryControllerAndItsNoLimitValue) {
  write(files_.proc_cgroup, "5:cpu,cpuacct:/x\n4:memory:/job\n0::/\n");
  cgroup_file("memory/job", "memory.limit_in_bytes", std::to_string(2 * kGiB));
  cgroup_file("memory/job", "memory.usage_in_bytes", std::to_string(kGiB / 2));
  cgroup_file("memory", "memory.limit_in_bytes", "9223372036854771712");
  meminfo_available_gib(20);
  const MemoryBudget b = detect_memory_budget(files_);
  EXPECT_EQ(b.source, BudgetSource::cgroup_v1);
  EXPECT_EQ(b.bytes, 2 * kGiB - kGiB / 2);
}

TEST_F(FakeMemoryFiles, UsageAboveTheLimitLeavesNothing) {
  write(files_.proc_cgroup, "0::/\n");
  cgroup_file("", "memory.max", "1000");
  cgroup_file("", "memory.current", "5000");
  meminfo_available_gib(20);
  EXPECT_EQ(detect_memory_budget(files_).bytes, 0);
}

TEST_F(FakeMemoryFiles, NoFilesMeanNoLimit) {
  const MemoryBudget b = detect_memory_budget(files_);
  EXPECT_EQ(b.source, BudgetSource::unknown);
  EXPECT_FALSE(b.limited());
  EXPECT_TRUE(fits({"x", {{"all", int64_t{1} << 60}}}, b));
}

TEST_F(FakeMemoryFiles, MalformedFilesAreErrorsNamingTheFile) {
  write(files_.proc_cgroup, "0::/job\n");
  cgroup_file("job", "memory.max", "lots\n");
  meminfo_available_gib(20);
  expect_error([&] { detect_memory_budget(files_); }, "memory.max: 'lots' is not a byte count");
  cgroup_file("job", "memory.max", "1000\n");
  cgroup_file("job", "memory.current", "-5\n");
  expect_error([&] { detect_memory_budget(files_); }, "memory.current: '-5'");
  cgroup_file("job", "memory.current", "5\n");
  write(files_.meminfo, "MemAvailable: 12 MB\n");
  expect_error([&] { detect_memory_budget(files_); }, "cannot read 'MemAvailable: 12 MB'");
}

TEST_F(FakeMemoryFiles, TheEnvironmentReplacesOrSwitchesOffTheDetectedBudget) {
  meminfo_available_gib(20);
  EXPECT_EQ(memory_budget(nullptr, files_).source, BudgetSource::meminfo);
  const MemoryBudget set = memory_budget("3G", files_);
  EXPECT_EQ(set.source, BudgetSource::environment);
  EXPECT_EQ(set.bytes, 3 * kGiB);
  const MemoryBudget off = memory_budget("off", files_);
  EXPECT_EQ(off.source, BudgetSource::off);
  EXPECT_TRUE(fits({"x", {{"all", int64_t{1} << 60}}}, off));
  expect_error([&] { memory_budget("lots", files_); },
               "FOUNDRY_MEMORY_LIMIT='lots' is not a memory size");
}

TEST(MemorySize, BytesOrPowersOf1024) {
  EXPECT_EQ(parse_memory_size("123", "X"), 123);
  EXPECT_EQ(parse_memory_size("64k", "X"), 64 << 10);
  EXPECT_EQ(parse_memory_size("1.5G", "X"), 3 * kGiB / 2);
  EXPECT_EQ(parse_memory_size("2T", "X"), 2048 * kGiB);
  for (const char* bad : {"", "G", "-1", "0", "1.2.3", "12Q", "12GB", "1e9", " 5", "inf"})
    expect_error([&] { parse_memory_size(bad, "X"); },
                 "X='" + std::string(bad) + "' is not a memory size");
  for (const char* huge : {"18446744073709551615", "5000000T"})
    expect_error([&] { parse_memory_size(huge, "X"); },
                 "X='" + std::string(huge) + "' is too large");
  // "off" turns off only the memory limit's check: the hint offers it there alone.
  for (const char* what : {"FOUNDRY_MEMORY_LIMIT", "--kv-memory"}) {
    try {
      parse_memory_size("off", what);
      ADD_FAILURE() << what << "=off was taken as a size";
    } catch (const Error& e) {
      EXPECT_EQ(e.hint().find("=off") != std::string::npos,
                std::string(what) == "FOUNDRY_MEMORY_LIMIT")
          << e.hint();
    }
  }
}

TEST(MemoryNeed, ComparesTheNeedOfEveryProcessOnTheHostWithTheBudget) {
  const MemoryNeed need{"training", {{"weights", 3 * kGiB}, {"activations", kGiB}}, 2};
  EXPECT_EQ(need.per_process(), 4 * kGiB);
  EXPECT_TRUE(fits(need, {BudgetSource::cgroup_v2, 8 * kGiB}));
  EXPECT_FALSE(fits(need, {BudgetSource::cgroup_v2, 8 * kGiB - 1}));
  EXPECT_EQ(memory_shortfall(need, {BudgetSource::cgroup_v2, 6 * kGiB}),
            "training needs about 4.0 GiB per process (weights 3.0 GiB, activations 1.0 GiB) × 2 "
            "ranks on this host, but this process may use 6.0 GiB (cgroup memory.max)");
  const MemoryNeed one{"bench gemm", {{"buffers", 1 << 20}}};
  expect_error([&] { check_memory(one, {BudgetSource::meminfo, 1 << 19}, "lower --sizes"); },
               "bench gemm needs about 1.0 MiB per process (buffers 1.0 MiB), but this process "
               "may use 512.0 KiB (MemAvailable)");
  try {
    check_memory(one, {BudgetSource::meminfo, 1 << 19}, "lower --sizes");
  } catch (const Error& e) {
    EXPECT_TRUE(
        e.hint().starts_with("lower --sizes; if that limit is wrong, set FOUNDRY_MEMORY_LIMIT"))
        << e.hint();
  }
  EXPECT_NO_THROW(check_memory(one, {BudgetSource::meminfo, 1 << 20}, "lower --sizes"));
}

}  // namespace
}  // namespace foundry
