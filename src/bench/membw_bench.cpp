#include "bench/membw_bench.h"

#include <dirent.h>
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/format.h"
#include "base/timer.h"

namespace foundry {

namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

// Page-aligned doubles that are NOT initialized here: the caller touches them first, in
// parallel, so each page is placed by the thread that will stream it (std::vector would
// zero them on one thread).
struct DoubleArray {
  explicit DoubleArray(int64_t n) {
    const size_t bytes = (static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(double) + 4095) &
                         ~static_cast<size_t>(4095);
    data = static_cast<double*>(std::aligned_alloc(4096, bytes));
    if (!data)
      fail(fmt::format("cannot allocate {} for the bandwidth arrays", format_size(bytes)),
           "lower --array-bytes or --max-bytes");
  }
  ~DoubleArray() { std::free(data); }
  DoubleArray(const DoubleArray&) = delete;
  DoubleArray& operator=(const DoubleArray&) = delete;
  double* data = nullptr;
};

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

void check_fits_in_memory(const char* flag, int64_t bytes) {
  const int64_t mem = physical_memory_bytes();
  if (mem > 0 && bytes > mem / 4 * 3)
    fail(fmt::format("{} needs {} of arrays but the machine has {} of memory", flag,
                     format_size(bytes), format_size(mem)),
         fmt::format("lower {}", flag));
}

double best_after_first(const std::vector<double>& seconds) {
  double best = std::numeric_limits<double>::infinity();
  for (size_t i = 1; i < seconds.size(); ++i) best = std::min(best, seconds[i]);
  return best;
}

constexpr double kStreamTolerance = 1e-13;  // relative, as STREAM's own check

// Largest relative error of x[i] against `expected` (NaN counts as infinite); when it exceeds
// kStreamTolerance, *first_bad is the first index that does.
double max_relative_error(const double* x, int64_t n, double expected, int64_t* first_bad) {
  const double scale = std::abs(expected) > 0 ? std::abs(expected) : 1.0;
  auto error = [&](int64_t i) {
    const double e = std::abs(x[i] - expected) / scale;
    return std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
  };
  double worst = 0;
#pragma omp parallel for schedule(static) reduction(max : worst)
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, error(i));
  *first_bad = -1;
  if (worst > kStreamTolerance) {
    for (int64_t i = 0; i < n; ++i)
      if (error(i) > kStreamTolerance) {
        *first_bad = i;
        break;
      }
  }
  return worst;
}

std::vector<int> default_threads() {
  const int all = std::max(1, omp_get_max_threads());
  std::vector<int> t;
  for (int p = 1; p < all; p *= 2) t.push_back(p);
  t.push_back(all);
  return t;
}

// Restores the caller's OpenMP thread count when the benchmark is done with its own.
struct ThreadCountGuard {
  int saved = omp_get_max_threads();
  ~ThreadCountGuard() { omp_set_num_threads(saved); }
};

// Runs triad `reps` times on n doubles inside one parallel region. The static schedule hands
// every thread the same slice in every repetition, and a slice depends on nothing outside
// itself, so `nowait` is safe: threads stream their own slice back to back, and small working
// sets measure the cache instead of a barrier per repetition.
double timed_triad_reps(double* a, const double* b, const double* c, int64_t n, int64_t reps,
                        int threads) {
  const double s = kStreamScalar;
  const double start = now_seconds();
#pragma omp parallel num_threads(threads)
  {
    for (int64_t r = 0; r < reps; ++r) {
#pragma omp for simd schedule(static) nowait
      for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
    }
  }
  return now_seconds() - start;
}

StreamResult make_stream_result(StreamKernel k, int threads, int64_t n,
                                const std::vector<double>& seconds, bool valid) {
  StreamResult r;
  r.kernel = kernel_name(k);
  r.threads = threads;
  r.array_bytes = n * static_cast<int64_t>(sizeof(double));
  r.bytes_per_run = stream_bytes(k, n);
  r.best_seconds = best_after_first(seconds);
  r.max_seconds = 0;
  double sum = 0;
  for (size_t i = 1; i < seconds.size(); ++i) {
    sum += seconds[i];
    r.max_seconds = std::max(r.max_seconds, seconds[i]);
  }
  r.avg_seconds = sum / static_cast<double>(seconds.size() - 1);
  r.bytes_per_s = r.bytes_per_run / r.best_seconds;
  r.valid = valid;
  return r;
}

std::string level_name(const CacheLevel& c) { return fmt::format("L{}", c.level); }

}  // namespace

// ---- caches ----

int64_t CacheLevel::bytes_for_threads(int threads) const {
  // Threads are assumed spread over the CPUs, one each, so they reach up to one instance
  // per thread.
  return bytes * std::max(1, std::min(instances, threads));
}

int64_t parse_cache_size(const std::string& text) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return -1;
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (...) {
    return -1;
  }
  std::string suffix = text.substr(used);
  for (auto& ch : suffix) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (suffix.empty() || suffix == "B") return value;
  if (suffix == "K" || suffix == "KB" || suffix == "KIB") return value << 10;
  if (suffix == "M" || suffix == "MB" || suffix == "MIB") return value << 20;
  if (suffix == "G" || suffix == "GB" || suffix == "GIB") return value << 30;
  return -1;
}

int count_cpu_list(const std::string& text) {
  int count = 0;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (part.empty()) continue;
    try {
      const auto dash = part.find('-');
      if (dash == std::string::npos) {
        (void)std::stoi(part);
        ++count;
      } else {
        const int lo = std::stoi(part.substr(0, dash)), hi = std::stoi(part.substr(dash + 1));
        if (hi < lo) return 0;
        count += hi - lo + 1;
      }
    } catch (...) {
      return 0;
    }
  }
  return count;
}

std::vector<CacheLevel> read_cache_levels(const std::string& cache_dir, int online_cpus,
                                          bool sysconf_fallback) {
  std::vector<CacheLevel> levels;
  online_cpus = std::max(1, online_cpus);
  if (DIR* dir = opendir(cache_dir.c_str())) {
    while (dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      if (name.rfind("index", 0) != 0) continue;
      const std::string base = cache_dir + "/" + name + "/";
      CacheLevel c;
      c.type = read_line(base + "type");
      if (c.type == "Instruction") continue;
      try {
        c.level = std::stoi(read_line(base + "level"));
      } catch (...) {
        continue;
      }
      c.bytes = parse_cache_size(read_line(base + "size"));
      if (c.level <= 0 || c.bytes <= 0) continue;
      const int shared = count_cpu_list(read_line(base + "shared_cpu_list"));
      c.shared_cpus = shared > 0 ? shared : 1;
      c.instances = std::max(1, (online_cpus + c.shared_cpus - 1) / c.shared_cpus);
      levels.push_back(c);
    }
    closedir(dir);
  }
  if (levels.empty() && sysconf_fallback) {
    // sysconf knows sizes but not sharing: count every level as one instance.
    const int names[] = {_SC_LEVEL1_DCACHE_SIZE, _SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE,
                         _SC_LEVEL4_CACHE_SIZE};
    for (int i = 0; i < 4; ++i) {
      const long bytes = sysconf(names[i]);
      if (bytes > 0) levels.push_back(CacheLevel{i + 1, i == 0 ? "Data" : "Unified", bytes, 1, 1});
    }
  }
  std::sort(levels.begin(), levels.end(),
            [](const CacheLevel& x, const CacheLevel& y) { return x.level < y.level; });
  return levels;
}

std::string cache_level_holding(const std::vector<CacheLevel>& caches, int64_t bytes,
                                int threads) {
  for (const CacheLevel& c : caches)
    if (bytes <= c.bytes_for_threads(threads)) return level_name(c);
  return "DRAM";
}

int64_t llc_bytes(const std::vector<CacheLevel>& caches) {
  return caches.empty() ? 0 : caches.back().total_bytes();
}

// ---- STREAM kernels ----

const char* kernel_name(StreamKernel k) {
  switch (k) {
    case StreamKernel::copy: return "copy";
    case StreamKernel::scale: return "scale";
    case StreamKernel::add: return "add";
    case StreamKernel::triad: return "triad";
  }
  return "?";
}

int64_t stream_bytes(StreamKernel k, int64_t n) {
  const int arrays = (k == StreamKernel::copy || k == StreamKernel::scale) ? 2 : 3;
  return arrays * static_cast<int64_t>(sizeof(double)) * n;
}

void stream_kernel(StreamKernel k, double* a, double* b, double* c, int64_t n, double scalar) {
  switch (k) {
    case StreamKernel::copy:
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) c[i] = a[i];
      break;
    case StreamKernel::scale:
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) b[i] = scalar * c[i];
      break;
    case StreamKernel::add:
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
      break;
    case StreamKernel::triad:
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) a[i] = b[i] + scalar * c[i];
      break;
  }
}

StreamCheck validate_stream(const double* a, const double* b, const double* c, int64_t n,
                            int iterations, double scalar) {
  // Every element follows the same scalar recurrence, so one scalar run gives the answer.
  double ea = 1.0, eb = 2.0, ec = 0.0;
  for (int i = 0; i < iterations; ++i) {
    ec = ea;
    eb = scalar * ec;
    ec = ea + eb;
    ea = eb + scalar * ec;
  }
  StreamCheck check;
  int64_t bad_a = -1, bad_b = -1, bad_c = -1;
  check.a_error = max_relative_error(a, n, ea, &bad_a);
  check.b_error = max_relative_error(b, n, eb, &bad_b);
  check.c_error = max_relative_error(c, n, ec, &bad_c);
  for (auto [bad, name] : {std::pair{bad_a, "a"}, std::pair{bad_b, "b"}, std::pair{bad_c, "c"}}) {
    if (bad >= 0 && (check.first_bad < 0 || bad < check.first_bad)) {
      check.first_bad = bad;
      check.first_bad_array = name;
    }
  }
  check.valid = check.first_bad < 0;
  return check;
}

// ---- the benchmark ----

void validate(const MembwOptions& o) {
  for (int t : o.threads)
    if (t < 1 || t > 4096)
      fail(fmt::format("--threads {}: a thread count must be between 1 and 4096", t),
           "give a comma-separated list, e.g. --threads 1,2");
  if (o.array_bytes != 0 && o.array_bytes < (64 << 10))
    fail(fmt::format("--array-bytes {}: arrays must be at least 64 KiB", o.array_bytes),
         "STREAM wants arrays of at least 4× the last-level cache; leave it out for that default");
  if (o.repeats < 2 || o.repeats > 100)
    fail(fmt::format("--repeats {}: must be between 2 and 100", o.repeats),
         "the first run is a warm-up and is not counted, so at least 2 are needed");
  if (o.min_bytes != 0 && o.min_bytes < 1024)
    fail(fmt::format("--min-bytes {}: the smallest working set is 1 KiB", o.min_bytes));
  if (o.max_bytes != 0 && o.max_bytes < 1024)
    fail(fmt::format("--max-bytes {}: the smallest working set is 1 KiB", o.max_bytes));
  if (o.min_bytes != 0 && o.max_bytes != 0 && o.max_bytes < o.min_bytes)
    fail(fmt::format("--max-bytes {} is below --min-bytes {}", format_size(o.max_bytes),
                     format_size(o.min_bytes)),
         "the working-set sweep runs from --min-bytes up to --max-bytes");
  if (o.points_per_doubling < 1 || o.points_per_doubling > 16)
    fail(fmt::format("--points-per-doubling {}: must be between 1 and 16", o.points_per_doubling));
  if (!o.stream && !o.working_set)
    fail("nothing to measure: both STREAM and the working-set sweep are off",
         "drop --no-stream or --no-working-set");
}

namespace {

int64_t capped(int64_t bytes, int64_t cap) { return cap > 0 ? std::min(bytes, cap) : bytes; }

// STREAM's bytes per array: at least 4× the LLC, and never below 64 MiB so that an unknown
// or tiny LLC still measures memory.
int64_t stream_array_bytes(const MembwOptions& options, int64_t llc) {
  return options.array_bytes ? options.array_bytes
                             : capped(std::max<int64_t>(4 * llc, 64 << 20), options.auto_bytes_cap);
}

// The working-set sweep's largest size (all three arrays).
int64_t largest_working_set(const MembwOptions& options, int64_t llc) {
  return options.max_bytes ? options.max_bytes
                           : capped(std::max<int64_t>(8 * llc, 256 << 20), options.auto_bytes_cap);
}

}  // namespace

int64_t membw_bench_bytes(const MembwOptions& options) {
  const int online = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  const int64_t llc = llc_bytes(read_cache_levels(options.cache_dir, online));
  // STREAM's arrays and the sweep's are never allocated at the same time.
  const int64_t stream = options.stream ? 3 * stream_array_bytes(options, llc) : 0;
  return std::max(stream, options.working_set ? largest_working_set(options, llc) : 0);
}

namespace {

using ProgressFn = std::function<void(const std::string&)>;

// Working-set sizes: geometric from below L1 to many times the LLC, each array a whole number
// of cache lines per thread.
std::vector<int64_t> working_set_sizes(const MembwOptions& options,
                                       const std::vector<CacheLevel>& caches, int64_t llc,
                                       int max_threads) {
  const int64_t l1 = caches.empty() ? (32 << 10) : caches.front().bytes;
  const int64_t lo = options.min_bytes ? options.min_bytes : std::max<int64_t>(l1 / 4, 1024);
  const int64_t hi = largest_working_set(options, llc);
  if (hi < lo)
    fail(fmt::format("--max-bytes {} is below --min-bytes {}", format_size(hi), format_size(lo)),
         options.max_bytes ? "the working-set sweep runs from --min-bytes up to --max-bytes"
                           : "the default --max-bytes is 8× the last-level cache; set it");
  check_fits_in_memory("--max-bytes", hi);
  const int64_t quantum = 3 * 8 * 8 * static_cast<int64_t>(max_threads);
  std::vector<int64_t> sizes;
  for (int i = 0;; ++i) {
    const double raw = lo * std::pow(2.0, static_cast<double>(i) / options.points_per_doubling);
    if (raw > hi * (1 + 1e-9)) break;
    const int64_t bytes = std::max<int64_t>(quantum, std::llround(raw / quantum) * quantum);
    if (sizes.empty() || bytes > sizes.back()) sizes.push_back(bytes);
  }
  return sizes;
}

// STREAM's four kernels over arrays of n doubles with `t` threads, `repeats` times each.
void measure_stream(const MembwOptions& options, int t, int64_t n, MembwResult& result) {
  omp_set_num_threads(t);
  DoubleArray a(n), b(n), c(n);
  double* pa = a.data;
  double* pb = b.data;
  double* pc = c.data;
  // First touch with the kernels' own static schedule.
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    pa[i] = 1.0;
    pb[i] = 2.0;
    pc[i] = 0.0;
  }
  std::vector<std::vector<double>> seconds(4, std::vector<double>(options.repeats));
  for (int r = 0; r < options.repeats; ++r) {
    for (int k = 0; k < 4; ++k) {
      const double start = now_seconds();
      stream_kernel(kStreamKernels[k], pa, pb, pc, n, kStreamScalar);
      seconds[k][r] = now_seconds() - start;
    }
  }
  const StreamCheck check = validate_stream(pa, pb, pc, n, options.repeats);
  if (!check.valid) {
    result.all_valid = false;
    result.notes.push_back(fmt::format(
        "STREAM with {} threads failed validation: array {} is wrong at index {} "
        "(max relative errors a {:.3g}, b {:.3g}, c {:.3g})",
        t, check.first_bad_array, check.first_bad, check.a_error, check.b_error, check.c_error));
  }
  for (int k = 0; k < 4; ++k) {
    result.stream.push_back(make_stream_result(kStreamKernels[k], t, n, seconds[k], check.valid));
    if (kStreamKernels[k] == StreamKernel::triad)
      result.best_triad_bytes_per_s =
          std::max(result.best_triad_bytes_per_s, result.stream.back().bytes_per_s);
  }
}

// The working-set sweep: repeats − 1 passes over all sizes, each size measured once per pass
// after its own warm-up run. Spreading a size's samples over the whole sweep, instead of
// taking them back to back, keeps one busy moment of a shared machine from spoiling every
// sample of the sizes measured during it; the best sample per size is reported.
void measure_working_sets(const MembwOptions& options, const std::vector<int64_t>& sizes,
                          int max_threads, MembwResult& result, const ProgressFn& progress) {
  const int64_t per_run =
      options.bytes_per_run > 0 ? options.bytes_per_run : (int64_t{64} << 20) * max_threads;
  std::vector<double> best_seconds(sizes.size(), std::numeric_limits<double>::infinity());
  std::vector<int64_t> first_bad(sizes.size(), -1);
  omp_set_num_threads(max_threads);
  for (int pass = 0; pass + 1 < options.repeats; ++pass) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t m = sizes[i] / 24;
      DoubleArray a(m), b(m), c(m);
      double* pa = a.data;
      double* pb = b.data;
      double* pc = c.data;
#pragma omp parallel for simd schedule(static)
      for (int64_t j = 0; j < m; ++j) {
        pa[j] = 0.0;
        pb[j] = 1.0;
        pc[j] = 2.0;
      }
      const int64_t reps = std::max<int64_t>(1, per_run / stream_bytes(StreamKernel::triad, m));
      timed_triad_reps(pa, pb, pc, m, reps, max_threads);  // warm-up, not counted
      best_seconds[i] =
          std::min(best_seconds[i], timed_triad_reps(pa, pb, pc, m, reps, max_threads) / reps);
      // b = 1 and c = 2 never change, so every element of a must be 1 + s·2.
      int64_t bad = -1;
      if (max_relative_error(pa, m, 1.0 + kStreamScalar * 2.0, &bad) > kStreamTolerance &&
          first_bad[i] < 0)
        first_bad[i] = bad;
      progress(fmt::format("working set {} (pass {}/{})", format_size(3 * m * 8), pass + 1,
                           options.repeats - 1));
    }
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t m = sizes[i] / 24;
    WorkingSetPoint p;
    p.bytes = 3 * m * 8;
    p.threads = max_threads;
    p.bytes_per_s = stream_bytes(StreamKernel::triad, m) / best_seconds[i];
    p.fits_in = cache_level_holding(result.caches, p.bytes, max_threads);
    p.valid = first_bad[i] < 0;
    if (!p.valid) {
      result.all_valid = false;
      result.notes.push_back(fmt::format("working-set triad at {} is wrong at index {}",
                                         format_size(p.bytes), first_bad[i]));
    }
    result.working_set.push_back(p);
  }
}

}  // namespace

MembwResult run_membw_bench(const MembwOptions& options) {
  validate(options);
  ThreadCountGuard guard;
  MembwResult result;
  result.repeats = options.repeats;
  if (getloadavg(result.load_average, 3) < 0) result.load_average[0] = -1;
  const int online = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  result.caches = read_cache_levels(options.cache_dir, online);
  const int64_t llc = llc_bytes(result.caches);
  if (llc == 0) result.notes.push_back("cache sizes unknown (no sysfs entries, no sysconf)");

  const std::vector<int> threads = options.threads.empty() ? default_threads() : options.threads;
  const int max_threads = *std::max_element(threads.begin(), threads.end());

  const int64_t array_bytes = stream_array_bytes(options, llc);
  const int64_t n = array_bytes / static_cast<int64_t>(sizeof(double));
  if (options.stream) check_fits_in_memory("--array-bytes", 3 * n * 8);
  if (options.stream && llc > 0 && array_bytes < 4 * llc)
    result.notes.push_back(fmt::format(
        "STREAM arrays of {} are below 4× the last-level cache ({}): caches inflate the rates",
        format_size(array_bytes), format_size(4 * llc)));
  const std::vector<int64_t> sizes =
      options.working_set ? working_set_sizes(options, result.caches, llc, max_threads)
                          : std::vector<int64_t>{};

  const int64_t total = (options.stream ? static_cast<int64_t>(threads.size()) : 0) +
                        static_cast<int64_t>(sizes.size()) * (options.repeats - 1);
  int64_t done = 0;
  const ProgressFn progress = [&](const std::string& what) {
    ++done;
    if (options.on_progress) options.on_progress(done, total, what);
  };
  if (options.stream)
    for (int t : threads) {
      measure_stream(options, t, n, result);
      progress(fmt::format("STREAM, {} thread{}", t, t == 1 ? "" : "s"));
    }
  measure_working_sets(options, sizes, max_threads, result, progress);
  return result;
}

nlohmann::json memory_profile_section(const MembwResult& r, const Provenance& provenance) {
  using nlohmann::json;
  json j;
  j["measured_bytes_per_s"] =
      r.best_triad_bytes_per_s > 0 ? json(r.best_triad_bytes_per_s) : json();
  j["spec_bytes_per_s"] = nullptr;  // a CPU's DRAM spec depends on the DIMMs; unknown here
  j["stream"] = json::array();
  for (const StreamResult& s : r.stream)
    j["stream"].push_back({{"kernel", s.kernel},
                           {"bytes_per_s", s.bytes_per_s},
                           {"array_bytes", s.array_bytes},
                           {"bytes_per_run", s.bytes_per_run},
                           {"seconds", s.best_seconds},
                           {"threads", s.threads},
                           {"valid", s.valid}});
  j["working_set"] = json::array();
  for (const WorkingSetPoint& p : r.working_set)
    j["working_set"].push_back({{"bytes", p.bytes},
                                {"bytes_per_s", p.bytes_per_s},
                                {"kernel", p.kernel},
                                {"threads", p.threads},
                                {"fits_in", p.fits_in},
                                {"valid", p.valid}});
  j["caches"] = json::array();
  for (const CacheLevel& c : r.caches)
    j["caches"].push_back({{"level", c.level},
                           {"bytes", c.bytes},
                           {"type", c.type},
                           {"shared_cpus", c.shared_cpus},
                           {"instances", c.instances}});
  j["repeats"] = r.repeats;
  j["all_valid"] = r.all_valid;
  j["load_average_before"] = {r.load_average[0], r.load_average[1], r.load_average[2]};
  j["notes"] = r.notes;
  j["provenance"] = to_json(provenance);
  j["source"] = "measured";
  return j;
}

std::string membw_csv(const MembwResult& r, const Provenance& provenance) {
  std::string out = format_provenance(provenance, "# ");
  out += "section,kernel,threads,array_bytes,working_set_bytes,bytes_per_run,best_seconds,"
         "gb_per_s,fits_in,valid\n";
  for (const StreamResult& s : r.stream)
    out += fmt::format("stream,{},{},{},{},{},{:.9g},{:.4f},{},{}\n", s.kernel, s.threads,
                       s.array_bytes, 3 * s.array_bytes, s.bytes_per_run, s.best_seconds,
                       s.bytes_per_s / 1e9,
                       cache_level_holding(r.caches, 3 * s.array_bytes, s.threads),
                       s.valid ? "true" : "false");
  for (const WorkingSetPoint& p : r.working_set)
    out += fmt::format("working_set,{},{},{},{},{},{:.9g},{:.4f},{},{}\n", p.kernel, p.threads,
                       p.bytes / 3, p.bytes, p.bytes, p.bytes / p.bytes_per_s,
                       p.bytes_per_s / 1e9, p.fits_in, p.valid ? "true" : "false");
  return out;
}

std::string format_membw_tables(const MembwResult& r) {
  std::string out;
  if (!r.caches.empty()) {
    out += "caches:";
    for (const CacheLevel& c : r.caches)
      out += fmt::format("  L{} {} {} × {} (shared by {} CPU{})", c.level, c.type,
                         format_size(c.bytes), c.instances, c.shared_cpus,
                         c.shared_cpus == 1 ? "" : "s");
    out += "\n\n";
  }
  if (!r.stream.empty()) {
    const StreamResult& first = r.stream.front();
    out += fmt::format(
        "STREAM: arrays of {} doubles ({} each), best of {} runs after the first; "
        "GB/s = 1e9 bytes/s\n",
        first.array_bytes / 8, format_size(first.array_bytes), r.repeats - 1);
    out += fmt::format("{:<7} {:>7} {:>11} {:>10} {:>10} {:>10} {:>10}  {}\n", "kernel",
                       "threads", "bytes/run", "best GB/s", "avg s", "min s", "max s", "valid");
    for (const StreamResult& s : r.stream)
      out += fmt::format("{:<7} {:>7} {:>11} {:>10.1f} {:>10.6f} {:>10.6f} {:>10.6f}  {}\n",
                         s.kernel, s.threads, format_size(s.bytes_per_run), s.bytes_per_s / 1e9,
                         s.avg_seconds, s.best_seconds, s.max_seconds, s.valid ? "yes" : "NO");
    out += "\n";
  }
  if (!r.working_set.empty()) {
    const int threads = r.working_set.front().threads;
    double top = 0;
    for (const WorkingSetPoint& p : r.working_set) top = std::max(top, p.bytes_per_s);
    out += fmt::format(
        "working set: triad (3 arrays), {} thread{}, best of {} passes (each after a warm-up "
        "run); 'fits in' assumes threads spread one per CPU\n",
        threads, threads == 1 ? "" : "s", r.repeats - 1);
    out += fmt::format("{:>11} {:>9}  {:<7} {}\n", "bytes", "GB/s", "fits in", "");
    std::string previous;
    for (const WorkingSetPoint& p : r.working_set) {
      if (p.fits_in != previous && !previous.empty()) {
        // Mark the boundary the curve just crossed, with the capacity behind it.
        for (const CacheLevel& c : r.caches) {
          if (fmt::format("L{}", c.level) != previous) continue;
          const int64_t cap = c.bytes_for_threads(threads);
          out += fmt::format("{:-^40}\n",
                             fmt::format(" L{} = {} ({} × {}) ", c.level, format_size(cap),
                                         cap / c.bytes, format_size(c.bytes)));
        }
      }
      previous = p.fits_in;
      const int bar = top > 0 ? static_cast<int>(std::lround(30.0 * p.bytes_per_s / top)) : 0;
      out += fmt::format("{:>11} {:>9.1f}  {:<7} {}{}\n", format_size(p.bytes),
                         p.bytes_per_s / 1e9, p.fits_in, std::string(bar, '#'),
                         p.valid ? "" : "  INVALID");
    }
    out += "\n";
  }
  for (const std::string& note : r.notes) out += "note: " + note + "\n";
  return out;
}

int64_t parse_bytes(const std::string& flag, const std::string& text) {
  const std::string hint = fmt::format(
      "give a size in bytes with an optional K, M or G suffix (binary), e.g. {} 64M", flag);
  size_t used = 0;
  double value = 0;
  try {
    if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.'))
      throw std::invalid_argument("not a number");
    value = std::stod(text, &used);
  } catch (...) {
    fail(fmt::format("{} '{}' is not a size", flag, text), hint);
  }
  std::string suffix = text.substr(used);
  for (auto& ch : suffix) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double scale = 0;
  if (suffix.empty() || suffix == "B") scale = 1;
  else if (suffix == "K" || suffix == "KB" || suffix == "KIB") scale = 1024.0;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB") scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB") scale = 1024.0 * 1024 * 1024;
  else fail(fmt::format("{} '{}' has an unknown unit '{}'", flag, text, text.substr(used)), hint);
  const double bytes = value * scale;
  if (!(bytes >= 1) || bytes > 9e18)
    fail(fmt::format("{} '{}' must be a positive size", flag, text), hint);
  return static_cast<int64_t>(std::llround(bytes));
}

std::string format_size(double bytes) {
  return format_bytes(bytes, 1, Zeros::trim);
}

}  // namespace foundry
