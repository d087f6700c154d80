// Memory bandwidth by the STREAM conventions, and a working-set sweep through the caches.
//
// STREAM: copy c=a, scale b=s·c, add c=a+b, triad a=b+s·c on doubles; a kernel moves 2 or
// 3 × 8 × N bytes (write-allocate traffic is not counted); arrays are at least 4× the last-level
// cache; each kernel's rate is the best of `repeats` runs excluding the first; the arrays are
// checked against the scalar recurrence afterwards; all threads run, and the arrays are
// first touched in parallel by the same static schedule that runs the kernels, so each page
// lives near the thread that streams it.
//
// Working set: triad on three arrays whose total size sweeps from below L1 to many times the
// LLC; each timed run repeats the kernel inside one parallel region so that small sizes
// measure the cache and not the fork/join, and a size's runs are spread over repeats − 1
// passes of the whole sweep (best one reported). Each detected cache level is reported next
// to the curve.
//
// The library does not print: results come back as structs, and the formatters return text.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/provenance.h"

namespace foundry {

// ---- caches ----

struct CacheLevel {
  int level = 0;            // 1, 2, 3 ...
  std::string type;         // "Data" or "Unified" (instruction caches are skipped)
  int64_t bytes = 0;        // one instance
  int shared_cpus = 1;      // logical CPUs sharing one instance
  int instances = 1;        // instances across the online CPUs
  int64_t total_bytes() const { return bytes * instances; }
  // Capacity reachable by `threads` threads spread over the CPUs (one per CPU).
  int64_t bytes_for_threads(int threads) const;
};

// "32K" -> 32768, "1024K", "32M", "1G", or a plain byte count. Returns -1 if unparsable.
int64_t parse_cache_size(const std::string& text);
// "0-1,4,6-7" -> 5. Returns 0 if unparsable.
int count_cpu_list(const std::string& text);
// Reads <cache_dir>/index*/{level,type,size,shared_cpu_list} (sysfs, e.g.
// /sys/devices/system/cpu/cpu0/cache). Falls back to sysconf(_SC_LEVEL*_CACHE_SIZE) when the
// directory has no entries and `sysconf_fallback`. Sorted by level; empty if nothing is known.
std::vector<CacheLevel> read_cache_levels(const std::string& cache_dir, int online_cpus,
                                          bool sysconf_fallback = true);
// The smallest level holding `bytes` for `threads` threads: "L1", "L2", ..., or "DRAM".
std::string cache_level_holding(const std::vector<CacheLevel>& caches, int64_t bytes,
                                int threads);
// Last-level cache in total (all instances); 0 if unknown.
int64_t llc_bytes(const std::vector<CacheLevel>& caches);

// ---- STREAM kernels ----

enum class StreamKernel { copy, scale, add, triad };
constexpr StreamKernel kStreamKernels[] = {StreamKernel::copy, StreamKernel::scale,
                                           StreamKernel::add, StreamKernel::triad};
const char* kernel_name(StreamKernel k);
// Bytes one run of the kernel moves over arrays of n doubles: 2 or 3 × 8 × n.
int64_t stream_bytes(StreamKernel k, int64_t n);

constexpr double kStreamScalar = 3.0;

// Runs one kernel over n doubles with the current OpenMP thread count.
void stream_kernel(StreamKernel k, double* a, double* b, double* c, int64_t n, double scalar);

// The STREAM check: with a=1, b=2, c=0 at the start and `iterations` rounds of
// copy, scale, add, triad, every element of each array must equal the scalar recurrence
// (relative error ≤ 1e-13).
struct StreamCheck {
  bool valid = true;
  double a_error = 0, b_error = 0, c_error = 0;  // max relative error per array
  int64_t first_bad = -1;                         // first wrong index, -1 when valid
  std::string first_bad_array;                    // "a", "b" or "c"
};
StreamCheck validate_stream(const double* a, const double* b, const double* c, int64_t n,
                            int iterations, double scalar = kStreamScalar);

// ---- the benchmark ----

struct MembwOptions {
  std::vector<int> threads;     // STREAM thread counts; empty = powers of two up to all, and all
  int64_t array_bytes = 0;      // STREAM bytes per array; 0 = 4× LLC (at least 64 MiB)
  int repeats = 10;             // runs per kernel / per working-set point; the first is dropped
  bool stream = true;
  bool working_set = true;
  int64_t min_bytes = 0;        // working-set sweep; 0 = a quarter of one L1 instance
  int64_t max_bytes = 0;        // 0 = 8× LLC
  // Caps the LLC-derived defaults above (0 = no cap): each STREAM array and the sweep's
  // largest size stay at or below it. Short runs on a machine (or VM) reporting a huge LLC;
  // arrays below 4× the LLC are noted in the results.
  int64_t auto_bytes_cap = 0;
  int points_per_doubling = 2;  // sizes grow by 2^(1/points_per_doubling)
  // Bytes one timed working-set run moves (the kernel repeats inside it); 0 = 64 MiB per
  // thread. A byte count rather than a time, so that a calibration run disturbed by another
  // process cannot shrink every later run to a single repetition.
  int64_t bytes_per_run = 0;
  std::string cache_dir = "/sys/devices/system/cpu/cpu0/cache";
  // Called after each measurement: done, total, what was measured.
  std::function<void(int64_t, int64_t, const std::string&)> on_progress;
};

// Throws foundry::Error naming the flag (--threads, --array-bytes, --repeats, --min-bytes,
// --max-bytes, --points-per-doubling) when a value is out of range.
void validate(const MembwOptions& o);

struct StreamResult {
  std::string kernel;
  int threads = 0;
  int64_t array_bytes = 0;    // one array
  int64_t bytes_per_run = 0;  // 2 or 3 × array_bytes
  double best_seconds = 0, avg_seconds = 0, max_seconds = 0;  // over runs 2..N
  double bytes_per_s = 0;     // bytes_per_run / best_seconds
  bool valid = false;         // the final arrays passed validate_stream
};

struct WorkingSetPoint {
  int64_t bytes = 0;          // all three arrays
  double bytes_per_s = 0;
  std::string kernel = "triad";
  int threads = 0;
  std::string fits_in;        // "L1", "L2", "L3", "DRAM" for these threads
  bool valid = false;
};

struct MembwResult {
  std::vector<CacheLevel> caches;
  std::vector<StreamResult> stream;
  std::vector<WorkingSetPoint> working_set;
  double best_triad_bytes_per_s = 0;
  bool all_valid = true;
  int repeats = 0;
  double load_average[3] = {0, 0, 0};  // before the run
  std::vector<std::string> notes;      // caveats (e.g. arrays smaller than 4× LLC)
};

MembwResult run_membw_bench(const MembwOptions& options);
// The most bytes of arrays run_membw_bench(options) holds at once.
int64_t membw_bench_bytes(const MembwOptions& options);

// The profile's "memory" section (see docs/bench-gemm-membw.md).
nlohmann::json memory_profile_section(const MembwResult& r, const Provenance& provenance);
// CSV with a provenance header: one row per STREAM kernel and per working-set point.
std::string membw_csv(const MembwResult& r, const Provenance& provenance);
// Human tables: caches, STREAM, the working-set curve with each cache level marked.
std::string format_membw_tables(const MembwResult& r);

// "48K", "1.5M", "64MiB", "2G" or a plain integer -> bytes (binary multiples). Throws
// foundry::Error naming `flag` when unparsable or not positive.
int64_t parse_bytes(const std::string& flag, const std::string& text);
// Sizes as the benchmarks write them: 8 B, 32768 -> "32 KiB", 1572864 -> "1.5 MiB".
std::string format_size(double bytes);

}  // namespace foundry
