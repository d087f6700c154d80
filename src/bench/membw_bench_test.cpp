#include "bench/membw_bench.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "base/error.h"
#include "base/test_expect_error.h"

namespace foundry {
namespace {

namespace fs = std::filesystem;


void write_index(const fs::path& dir, int index, int level, const std::string& type,
                 const std::string& size, const std::string& shared) {
  const fs::path d = dir / ("index" + std::to_string(index));
  fs::create_directories(d);
  std::ofstream(d / "level") << level << "\n";
  std::ofstream(d / "type") << type << "\n";
  std::ofstream(d / "size") << size << "\n";
  std::ofstream(d / "shared_cpu_list") << shared << "\n";
}

TEST(Caches, ParsesSizesAndCpuLists) {
  EXPECT_EQ(parse_cache_size("32K"), 32768);
  EXPECT_EQ(parse_cache_size("1024K"), 1 << 20);
  EXPECT_EQ(parse_cache_size("32M"), 32 << 20);
  EXPECT_EQ(parse_cache_size("1G"), int64_t{1} << 30);
  EXPECT_EQ(parse_cache_size("512"), 512);
  EXPECT_EQ(parse_cache_size(""), -1);
  EXPECT_EQ(parse_cache_size("big"), -1);
  EXPECT_EQ(parse_cache_size("12Q"), -1);
  EXPECT_EQ(count_cpu_list("0-1"), 2);
  EXPECT_EQ(count_cpu_list("0,2,4-7"), 6);
  EXPECT_EQ(count_cpu_list("3"), 1);
  EXPECT_EQ(count_cpu_list("x"), 0);
  EXPECT_EQ(count_cpu_list("5-2"), 0);
}

TEST(Caches, ReadsFakeSysfs) {
  // 8 CPUs, 2 threads per core: L1d and L2 per core, one L3 for all.
  const fs::path dir = fs::path(testing::TempDir()) / "membw_fake_cache";
  fs::remove_all(dir);
  write_index(dir, 3, 3, "Unified", "32768K", "0-7");  // out of order on purpose
  write_index(dir, 0, 1, "Data", "48K", "0,4");
  write_index(dir, 1, 1, "Instruction", "32K", "0,4");
  write_index(dir, 2, 2, "Unified", "2048K", "0,4");
  const std::vector<CacheLevel> caches = read_cache_levels(dir.string(), 8, false);
  ASSERT_EQ(caches.size(), 3u);  // the instruction cache is skipped
  EXPECT_EQ(caches[0].level, 1);
  EXPECT_EQ(caches[0].type, "Data");
  EXPECT_EQ(caches[0].bytes, 48 << 10);
  EXPECT_EQ(caches[0].shared_cpus, 2);
  EXPECT_EQ(caches[0].instances, 4);
  EXPECT_EQ(caches[1].level, 2);
  EXPECT_EQ(caches[1].bytes, 2 << 20);
  EXPECT_EQ(caches[2].level, 3);
  EXPECT_EQ(caches[2].instances, 1);
  EXPECT_EQ(llc_bytes(caches), 32 << 20);
  // Two threads reach two L1 instances (96 KiB) but one L3.
  EXPECT_EQ(cache_level_holding(caches, 96 << 10, 2), "L1");
  EXPECT_EQ(cache_level_holding(caches, (96 << 10) + 8, 2), "L2");
  EXPECT_EQ(cache_level_holding(caches, 4 << 20, 2), "L2");
  EXPECT_EQ(cache_level_holding(caches, 5 << 20, 2), "L3");
  EXPECT_EQ(cache_level_holding(caches, 33 << 20, 8), "DRAM");
  EXPECT_EQ(cache_level_holding(caches, 96 << 10, 1), "L2");  // one thread: one L1
  fs::remove_all(dir);
  EXPECT_TRUE(read_cache_levels(dir.string(), 8, false).empty());
}

TEST(Stream, BytesPerKernel) {
  EXPECT_EQ(stream_bytes(StreamKernel::copy, 1000), 2 * 8 * 1000);
  EXPECT_EQ(stream_bytes(StreamKernel::scale, 1000), 2 * 8 * 1000);
  EXPECT_EQ(stream_bytes(StreamKernel::add, 1000), 3 * 8 * 1000);
  EXPECT_EQ(stream_bytes(StreamKernel::triad, 1000), 3 * 8 * 1000);
  EXPECT_STREQ(kernel_name(StreamKernel::add), "add");
}

// Runs `iterations` STREAM rounds on fresh arrays.
struct Arrays {
  explicit Arrays(int64_t n) : a(n, 1.0), b(n, 2.0), c(n, 0.0) {}
  void run(int iterations) {
    for (int i = 0; i < iterations; ++i)
      for (StreamKernel k : kStreamKernels)
        stream_kernel(k, a.data(), b.data(), c.data(), static_cast<int64_t>(a.size()),
                      kStreamScalar);
  }
  std::vector<double> a, b, c;
};

TEST(Stream, KernelsComputeWhatTheyClaim) {
  std::vector<double> a = {1, 2, 3}, b = {10, 20, 30}, c = {0, 0, 0};
  stream_kernel(StreamKernel::copy, a.data(), b.data(), c.data(), 3, 3.0);
  EXPECT_EQ(c, (std::vector<double>{1, 2, 3}));
  stream_kernel(StreamKernel::scale, a.data(), b.data(), c.data(), 3, 3.0);
  EXPECT_EQ(b, (std::vector<double>{3, 6, 9}));
  stream_kernel(StreamKernel::add, a.data(), b.data(), c.data(), 3, 3.0);
  EXPECT_EQ(c, (std::vector<double>{4, 8, 12}));
  stream_kernel(StreamKernel::triad, a.data(), b.data(), c.data(), 3, 3.0);
  EXPECT_EQ(a, (std::vector<double>{15, 30, 45}));
}

TEST(Stream, ValidationAcceptsCorrectArrays) {
  Arrays x(1001);
  x.run(7);
  const StreamCheck check = validate_stream(x.a.data(), x.b.data(), x.c.data(), 1001, 7);
  EXPECT_TRUE(check.valid);
  EXPECT_EQ(check.first_bad, -1);
  EXPECT_LE(check.a_error, 1e-13);
  // The wrong iteration count is caught: the values grow 15× per round.
  EXPECT_FALSE(validate_stream(x.a.data(), x.b.data(), x.c.data(), 1001, 6).valid);
}

TEST(Stream, ValidationCatchesACorruptedElement) {
  Arrays x(1001);
  x.run(5);
  x.b[617] *= 1.0 + 1e-9;  // far below what a print would show, far above 1e-13
  StreamCheck check = validate_stream(x.a.data(), x.b.data(), x.c.data(), 1001, 5);
  EXPECT_FALSE(check.valid);
  EXPECT_EQ(check.first_bad, 617);
  EXPECT_EQ(check.first_bad_array, "b");
  EXPECT_GT(check.b_error, 1e-10);
  EXPECT_EQ(check.a_error, 0);

  Arrays y(64);
  y.run(3);
  y.c[0] = std::numeric_limits<double>::quiet_NaN();
  check = validate_stream(y.a.data(), y.b.data(), y.c.data(), 64, 3);
  EXPECT_FALSE(check.valid);
  EXPECT_EQ(check.first_bad_array, "c");
  EXPECT_EQ(check.first_bad, 0);
}

TEST(Membw, OptionErrorsNameTheFlag) {
  auto with = [](auto change) {
    MembwOptions o;
    change(o);
    return o;
  };
  expect_error([&] { validate(with([](MembwOptions& o) { o.threads = {0}; })); }, "--threads 0");
  expect_error([&] { validate(with([](MembwOptions& o) { o.repeats = 1; })); }, "--repeats 1");
  expect_error([&] { validate(with([](MembwOptions& o) { o.array_bytes = 1000; })); },
               "--array-bytes");
  expect_error([&] { validate(with([](MembwOptions& o) { o.min_bytes = 100; })); }, "--min-bytes");
  expect_error([&] {
    validate(with([](MembwOptions& o) {
      o.min_bytes = 1 << 20;
      o.max_bytes = 64 << 10;
    }));
  }, "--max-bytes 64 KiB is below --min-bytes 1 MiB");
  expect_error([&] { validate(with([](MembwOptions& o) { o.points_per_doubling = 0; })); },
               "--points-per-doubling");
  // A default maximum below an explicit minimum is caught once the default is known.
  expect_error([&] {
    run_membw_bench(with([](MembwOptions& o) {
      o.stream = false;
      o.min_bytes = int64_t{1} << 40;
    }));
  }, "--min-bytes");
}

TEST(Membw, ParsesByteSizes) {
  EXPECT_EQ(parse_bytes("--x", "64M"), 64 << 20);
  EXPECT_EQ(parse_bytes("--x", "64MiB"), 64 << 20);
  EXPECT_EQ(parse_bytes("--x", "1.5K"), 1536);
  EXPECT_EQ(parse_bytes("--x", "2g"), int64_t{2} << 30);
  EXPECT_EQ(parse_bytes("--x", "4096"), 4096);
  expect_error([] { parse_bytes("--max-bytes", "0"); }, "--max-bytes '0'");
  expect_error([] { parse_bytes("--max-bytes", "lots"); }, "--max-bytes 'lots'");
  expect_error([] { parse_bytes("--min-bytes", "12X"); }, "unknown unit 'X'");
  expect_error([] { parse_bytes("--min-bytes", "-5M"); }, "--min-bytes");
  EXPECT_EQ(format_size(512), "512 B");
  EXPECT_EQ(format_size(32768), "32 KiB");
  EXPECT_EQ(format_size(3 << 19), "1.5 MiB");
}

TEST(Membw, ACapKeepsTheLlcDerivedSizesOfAHugeReportedCacheShort) {
  // A VM reporting a 1 GiB L3: by default STREAM's arrays are 4 GiB each.
  const fs::path dir = fs::path(testing::TempDir()) / "membw_huge_llc";
  fs::remove_all(dir);
  write_index(dir, 0, 1, "Data", "48K", "0");
  write_index(dir, 1, 3, "Unified", "1048576K", "0-1");
  MembwOptions o;
  o.cache_dir = dir.string();
  EXPECT_EQ(membw_bench_bytes(o), 3 * (int64_t{4} << 30));
  o.auto_bytes_cap = 512 << 20;
  EXPECT_EQ(membw_bench_bytes(o), 3 * (512 << 20));
  o.stream = false;
  EXPECT_EQ(membw_bench_bytes(o), 512 << 20);  // the sweep's largest size
  o.max_bytes = 1 << 30;                       // a size given is not capped
  EXPECT_EQ(membw_bench_bytes(o), 1 << 30);

  // A run under the cap says its arrays were below 4× the LLC.
  MembwOptions small;
  small.cache_dir = dir.string();
  small.auto_bytes_cap = 1 << 20;
  small.threads = {1};
  small.repeats = 2;
  small.points_per_doubling = 1;
  small.bytes_per_run = 1 << 20;
  const MembwResult r = run_membw_bench(small);
  ASSERT_FALSE(r.stream.empty());
  EXPECT_EQ(r.stream[0].array_bytes, 1 << 20);
  EXPECT_LE(r.working_set.back().bytes, 1 << 20);
  bool noted = false;
  for (const std::string& note : r.notes)
    noted |= note.find("below 4× the last-level") != std::string::npos;
  EXPECT_TRUE(noted);
  fs::remove_all(dir);
}

TEST(Membw, TinyRunIsValidAndComplete) {
  MembwOptions o;
  o.threads = {1, 2};
  o.array_bytes = 256 << 10;
  o.repeats = 3;
  o.min_bytes = 16 << 10;
  o.max_bytes = 64 << 10;
  o.points_per_doubling = 1;
  o.bytes_per_run = 1 << 20;
  int64_t last_done = 0, last_total = 0;
  o.on_progress = [&](int64_t done, int64_t total, const std::string&) {
    last_done = done;
    last_total = total;
  };
  const MembwResult r = run_membw_bench(o);
  EXPECT_TRUE(r.all_valid);
  ASSERT_EQ(r.stream.size(), 8u);  // 4 kernels × 2 thread counts
  ASSERT_EQ(r.working_set.size(), 3u);  // 16, 32, 64 KiB
  EXPECT_EQ(last_done, last_total);
  EXPECT_EQ(last_total, 2 + 3 * (3 - 1));  // STREAM per thread count, sizes × passes
  double best_triad = 0;
  for (const StreamResult& s : r.stream) {
    EXPECT_TRUE(s.valid);
    EXPECT_GT(s.bytes_per_s, 0);
    EXPECT_EQ(s.array_bytes, 256 << 10);
    EXPECT_EQ(s.bytes_per_run, stream_bytes(s.kernel == "copy"    ? StreamKernel::copy
                                            : s.kernel == "scale" ? StreamKernel::scale
                                            : s.kernel == "add"   ? StreamKernel::add
                                                                  : StreamKernel::triad,
                                            (256 << 10) / 8));
    EXPECT_LE(s.best_seconds, s.avg_seconds);
    EXPECT_LE(s.avg_seconds, s.max_seconds);
    if (s.kernel == "triad") best_triad = std::max(best_triad, s.bytes_per_s);
  }
  EXPECT_DOUBLE_EQ(r.best_triad_bytes_per_s, best_triad);
  EXPECT_EQ(r.working_set[0].threads, 2);
  // Sizes double from 16 KiB, each rounded to whole cache lines per thread and array.
  for (size_t i = 0; i < r.working_set.size(); ++i) {
    const WorkingSetPoint& p = r.working_set[i];
    EXPECT_TRUE(p.valid);
    EXPECT_GT(p.bytes_per_s, 0);
    EXPECT_NEAR(static_cast<double>(p.bytes), (16 << 10) << i, 3 * 8 * 8 * 2);
    EXPECT_EQ(p.bytes % (3 * 8), 0);
  }

  // The profile section has the keys other code reads, in SI units.
  const nlohmann::json j = memory_profile_section(r, Provenance{});
  EXPECT_DOUBLE_EQ(j.at("measured_bytes_per_s").get<double>(), best_triad);
  EXPECT_TRUE(j.at("spec_bytes_per_s").is_null());
  EXPECT_EQ(j.at("source"), "measured");
  ASSERT_EQ(j.at("stream").size(), 8u);
  for (const char* key : {"kernel", "bytes_per_s", "array_bytes", "threads", "valid"})
    EXPECT_TRUE(j["stream"][0].contains(key)) << key;
  EXPECT_EQ(j["stream"][3]["kernel"], "triad");
  ASSERT_EQ(j.at("working_set").size(), 3u);
  for (const char* key : {"bytes", "bytes_per_s", "kernel"})
    EXPECT_TRUE(j["working_set"][0].contains(key)) << key;
  EXPECT_TRUE(j.at("caches").is_array());
  for (const auto& c : j["caches"]) {
    EXPECT_TRUE(c.contains("level"));
    EXPECT_GT(c.at("bytes").get<int64_t>(), 0);
  }

  // CSV: provenance comments, a header, one row per measurement.
  const std::string csv = membw_csv(r, Provenance{});
  EXPECT_EQ(csv.rfind("# date:", 0), 0u);
  EXPECT_NE(csv.find("\nsection,kernel,threads,"), std::string::npos);
  int rows = 0;
  for (size_t at = 0; (at = csv.find("\nstream,", at)) != std::string::npos; ++at) ++rows;
  for (size_t at = 0; (at = csv.find("\nworking_set,", at)) != std::string::npos; ++at) ++rows;
  EXPECT_EQ(rows, 8 + 3);

  const std::string tables = format_membw_tables(r);
  EXPECT_NE(tables.find("STREAM"), std::string::npos);
  EXPECT_NE(tables.find("triad"), std::string::npos);
  EXPECT_NE(tables.find("working set"), std::string::npos);
}

}  // namespace
}  // namespace foundry
