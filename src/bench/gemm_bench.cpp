#include "bench/gemm_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "base/bf16.h"
#include "base/error.h"
#include "base/io.h"
#include "base/timer.h"
#include "bench/membw_bench.h"
#include "bench/profile.h"

namespace foundry {

namespace {

const char* kKinds[] = {"square", "transformer", "expert", "offsize", "decode"};

bool has_kind(const GemmBenchOptions& o, const std::string& kind) {
  return std::find(o.kinds.begin(), o.kinds.end(), kind) != o.kinds.end();
}

// The flags that produce shapes of a kind, for error messages.
const char* flags_of_kind(const std::string& kind) {
  if (kind == "square") return "--sizes";
  if (kind == "transformer") return "--tokens/--hidden/--ffn";
  if (kind == "expert") return "--tokens/--hidden/--ffn/--experts/--top-k";
  if (kind == "decode") return "--decode-rows/--hidden/--ffn";
  return "--offsize/--offsize-base";
}

// `list`: the flag takes several values (the hint's example shows two).
void check_positive(const char* flag, const std::vector<int64_t>& values, bool needed,
                    bool list = true) {
  if (needed && values.empty())
    fail(fmt::format("{} is empty", flag),
         fmt::format("give at least one value, e.g. {} 1024", flag));
  for (int64_t v : values)
    if (v < 1 || v > (int64_t{1} << 20))
      fail(fmt::format("{} {}: a dimension must be between 1 and 1048576", flag, v),
           fmt::format("e.g. {} {}", flag, list ? "512,1024" : "1024"));
}

// Test data with small exact values: every product and every partial sum is exactly
// representable in fp32 (and the inputs in bf16), so the reference check is exact up to
// summation order.
float a_value(int64_t i, int64_t p) { return static_cast<float>((i * 3 + p * 5) % 7 - 3) * 0.25f; }
float b_value(int64_t p, int64_t j) { return static_cast<float>((p * 7 + j * 3) % 9 - 4) * 0.125f; }

// Fills a logical rows × cols operand stored row-major, or transposed (stored cols × rows).
template <typename F>
void fill_operand(std::vector<float>& out, int64_t rows, int64_t cols, bool transposed, F value) {
  out.resize(static_cast<size_t>(rows * cols));
  float* data = out.data();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      data[transposed ? c * rows + r : r * cols + c] = value(r, c);
}

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

// fp32 A, B, C plus the bf16 copies of A and B (and B's cold copies).
int64_t shape_bytes(const GemmShape& s) {
  return 4 * (s.m * s.k + s.k * s.n + s.m * s.n) + 2 * (s.m * s.k + s.k * s.n) +
         (s.cold_b ? cold_weight_bytes() : 0);
}

// The largest power of two (up to 64) dividing x: how well a dimension fits vector widths
// and library blocking.
int64_t alignment_of(int64_t x) {
  int64_t a = 1;
  while (a < 64 && x % (a * 2) == 0) a *= 2;
  return a;
}

std::string layout_name(const GemmShape& s) {
  return std::string(s.trans_a ? "t" : "n") + (s.trans_b ? "t" : "n");
}

}  // namespace


void validate(const GemmBenchOptions& o) {
  if (o.dtypes.empty()) fail("--dtype is empty", "use --dtype fp32,bf16");
  if (o.kinds.empty())
    fail("--kinds is empty", "use --kinds square,transformer,expert,offsize,decode");
  for (const std::string& kind : o.kinds)
    if (std::find(std::begin(kKinds), std::end(kKinds), kind) == std::end(kKinds))
      fail(fmt::format("--kinds: unknown kind '{}'", kind),
           "choose from square, transformer, expert, offsize, decode");
  check_positive("--sizes", o.square_sizes, has_kind(o, "square"));
  check_positive("--decode-rows", o.decode_rows, has_kind(o, "decode"));
  const bool layer =
      has_kind(o, "transformer") || has_kind(o, "expert") || has_kind(o, "decode");
  check_positive("--tokens", o.tokens, layer);
  check_positive("--hidden", o.hidden, layer);
  check_positive("--ffn", o.ffn, layer);
  if (has_kind(o, "expert")) {
    check_positive("--experts", o.experts, true);
    if (o.top_k < 1) fail(fmt::format("--top-k {}: must be ≥ 1", o.top_k));
    for (int64_t e : o.experts)
      if (o.top_k > e)
        fail(fmt::format("--top-k {} exceeds --experts {}", o.top_k, e),
             "each token picks top_k of the experts, so top_k ≤ experts");
  }
  if (has_kind(o, "offsize")) {
    if (o.offsize_dim != "m" && o.offsize_dim != "n" && o.offsize_dim != "k")
      fail(fmt::format("--offsize-dim '{}': must be m, n or k", o.offsize_dim));
    if (o.offsize_from < 1 || o.offsize_to < o.offsize_from)
      fail(fmt::format("--offsize {}:{}: need 1 ≤ FROM ≤ TO", o.offsize_from, o.offsize_to),
           "e.g. --offsize 1008:1040");
    if (o.offsize_to - o.offsize_from > 512)
      fail(fmt::format("--offsize {}:{} spans {} sizes; at most 513", o.offsize_from, o.offsize_to,
                       o.offsize_to - o.offsize_from + 1),
           "the scan steps by 1; narrow the range");
    check_positive("--offsize", {o.offsize_to}, true);
    check_positive("--offsize-base", {o.offsize_base}, true, /*list=*/false);
  }
  if (o.repeats < 1 || o.repeats > 1000)
    fail(fmt::format("--repeats {}: must be between 1 and 1000", o.repeats));
  if (!(o.min_seconds >= 0) || o.min_seconds > 10)
    fail(fmt::format("minimum time per run {} s must be between 0 and 10", o.min_seconds));
  const int64_t memory = physical_memory_bytes();
  if (memory > 0) {
    for (const GemmShape& s : gemm_sweep(o))
      if (shape_bytes(s) > memory / 4 * 3)
        fail(fmt::format("the {} GEMM {} × {} × {} ({}) needs {} but the machine has {}", s.kind,
                         s.m, s.n, s.k, s.label, format_size(shape_bytes(s)),
                         format_size(memory)),
             fmt::format("lower {}", flags_of_kind(s.kind)));
  }
}

int64_t gemm_bench_bytes(const GemmBenchOptions& o) {
  int64_t most = 0;
  for (const GemmShape& s : gemm_sweep(o)) most = std::max(most, shape_bytes(s));
  return most;
}

int64_t cold_weight_bytes() {
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::max<int64_t>(int64_t{64} << 20, 2 * static_cast<int64_t>(std::max(llc, 0L)));
}

int64_t expert_tokens(int64_t tokens, int64_t top_k, int64_t experts) {
  const double rows = static_cast<double>(tokens) * static_cast<double>(top_k) /
                      static_cast<double>(experts);
  return std::max<int64_t>(1, std::llround(rows));
}

std::vector<GemmShape> gemm_sweep(const GemmBenchOptions& o) {
  std::vector<GemmShape> shapes;
  // A product that two roles share (the down projection of hidden = ffn = 1024 is also the
  // attention projection) is measured once, under both labels.
  std::map<std::tuple<std::string, int64_t, int64_t, int64_t, bool, bool>, size_t> seen;
  auto add = [&](int64_t m, int64_t n, int64_t k, const std::string& kind, std::string label,
                 bool trans_a, bool trans_b) {
    const auto [it, inserted] =
        seen.emplace(std::tuple{kind, m, n, k, trans_a, trans_b}, shapes.size());
    if (inserted) {
      shapes.push_back(
          GemmShape{m, n, k, kind, std::move(label), trans_a, trans_b, kind == "decode"});
    } else if (shapes[it->second].label.find(label) == std::string::npos) {
      shapes[it->second].label += " = " + label;
    }
  };
  if (has_kind(o, "square"))
    for (int64_t s : o.square_sizes)
      add(s, s, s, "square", fmt::format("{0} x {0} x {0}", s), false, false);
  // Layouts follow training: weights are stored [out, in] and used transposed (trans_b);
  // the weight gradient is dY^T · X (trans_a) with the token count as inner dimension.
  if (has_kind(o, "transformer"))
    for (int64_t t : o.tokens)
      for (int64_t h : o.hidden) {
        add(t, h, h, "transformer", "tokens x hidden -> hidden (attention projection fwd)", false,
            true);
        for (int64_t f : o.ffn) {
          add(t, 2 * f, h, "transformer", "tokens x hidden -> 2*ffn (gate|up fwd)", false, true);
          add(t, h, f, "transformer", "tokens x ffn -> hidden (down fwd)", false, true);
          add(t, h, 2 * f, "transformer", "tokens x 2*ffn -> hidden (gate|up input grad)", false,
              false);
          add(2 * f, h, t, "transformer", "2*ffn x tokens -> hidden (gate|up weight grad)", true,
              false);
        }
      }
  if (has_kind(o, "expert"))
    for (int64_t e : o.experts)
      for (int64_t t : o.tokens) {
        const int64_t rows = expert_tokens(t, o.top_k, e);
        const std::string who = fmt::format("{} tokens, top-{} of {} experts", t, o.top_k, e);
        for (int64_t h : o.hidden)
          for (int64_t f : o.ffn) {
            add(rows, 2 * f, h, "expert",
                fmt::format("expert rows x hidden -> 2*ffn (gate|up fwd; {})", who), false, true);
            add(rows, h, f, "expert",
                fmt::format("expert rows x ffn -> hidden (down fwd; {})", who), false, true);
            add(2 * f, h, rows, "expert",
                fmt::format("2*ffn x expert rows -> hidden (weight grad; {})", who), true, false);
          }
      }
  // Decoding's projections as the model stores them (trans_b), one GEMM per call.
  if (has_kind(o, "decode"))
    for (int64_t m : o.decode_rows)
      for (int64_t h : o.hidden) {
        add(m, h, h, "decode", "decode rows x hidden -> hidden (attention projection)", false,
            true);
        for (int64_t f : o.ffn) {
          add(m, 2 * f, h, "decode", "decode rows x hidden -> 2*ffn (gate|up)", false, true);
          add(m, h, f, "decode", "decode rows x ffn -> hidden (down)", false, true);
        }
      }
  if (has_kind(o, "offsize"))
    for (int64_t x = o.offsize_from; x <= o.offsize_to; ++x) {
      const int64_t b = o.offsize_base;
      const int64_t m = o.offsize_dim == "m" ? x : b;
      const int64_t n = o.offsize_dim == "n" ? x : b;
      const int64_t k = o.offsize_dim == "k" ? x : b;
      add(m, n, k, "offsize",
          fmt::format("{} = {} (multiple of {})", o.offsize_dim, x, alignment_of(x)), false, false);
    }
  return shapes;
}

double gemm_flops(int64_t m, int64_t n, int64_t k) {
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

double gemm_rate(int64_t m, int64_t n, int64_t k, double seconds) {
  return seconds > 0 ? gemm_flops(m, n, k) / seconds : 0.0;
}

void compute_efficiencies(GemmBenchResult& r) {
  r.best_fp32 = r.best_bf16 = 0;
  // The best rate a dtype reaches: decode products (a few rows against a whole weight) are
  // bound by memory by design and never set it.
  for (const GemmMeasurement& p : r.points) {
    if (p.shape.kind == std::string("decode")) continue;
    double& best = p.dtype == DType::bf16 ? r.best_bf16 : r.best_fp32;
    best = std::max(best, p.flops_per_s);
  }
  for (GemmMeasurement& p : r.points) {
    const double best = r.best(p.dtype);
    p.efficiency = best > 0 ? p.flops_per_s / best : 0.0;
  }
}

namespace {

// One product's operands, filled with the exact test data, ready to call.
class GemmCase : public TimedGemm {
 public:
  GemmCase(DType dtype, const GemmShape& shape) : dtype_(dtype), shape_(shape) {
    const int64_t m = shape.m, n = shape.n, k = shape.k;
    fill_operand(a_, m, k, shape.trans_a, a_value);
    fill_operand(b_, k, n, shape.trans_b, b_value);
    c_.assign(static_cast<size_t>(m * n), 0.0f);  // touched now, not inside a timed call
    if (dtype == DType::bf16) {
      a16_.resize(a_.size());
      b16_.resize(b_.size());
      convert_to_bf16(a_.data(), a16_.data(), static_cast<int64_t>(a_.size()));
      convert_to_bf16(b_.data(), b16_.data(), static_cast<int64_t>(b_.size()));
    }
    if (shape.cold_b) make_cold_copies();
  }

  void call() {
    const bool h = dtype_ == DType::bf16;
    const void* a = h ? static_cast<const void*>(a16_.data()) : a_.data();
    const void* b = h ? static_cast<const void*>(b16_.data()) : b_.data();
    if (cold_) {
      b = cold_ + next_ * b_bytes_;
      next_ = (next_ + 1) % copies_;
    }
    gemm(a, shape_.trans_a, b, shape_.trans_b, c_.data(), shape_.m, shape_.n, shape_.k, dtype_);
  }

  SamplingPlan plan_sampling(double min_seconds) override;
  double timed_run(const SamplingPlan& plan) override;

  // Corners, the middle and a few scattered entries of C against a double reference.
  bool check() const override {
    const int64_t m = shape_.m, n = shape_.n, k = shape_.k;
    const int64_t entries[][2] = {{0, 0}, {m - 1, n - 1}, {m / 2, n / 3}, {m / 3, n - 1},
                                  {m - 1, 0}, {(m * 7) / 11, (n * 5) / 13}};
    for (const auto& e : entries) {
      double ref = 0, magnitude = 0;
      for (int64_t q = 0; q < k; ++q) {
        const double term = static_cast<double>(a_value(e[0], q)) * b_value(q, e[1]);
        ref += term;
        magnitude += std::abs(term);
      }
      if (std::abs(c_[static_cast<size_t>(e[0] * n + e[1])] - ref) > 1e-5 * magnitude + 1e-6)
        return false;
    }
    return true;
  }

 private:
  // B's bytes in the GEMM dtype, repeated until they exceed the caches. The buffer is shared
  // by every cold shape of the process (grown, never freed): faulting in fresh pages for
  // each shape would cost more than the sweep.
  static std::vector<char>& cold_pool() {
    static std::vector<char> pool;
    return pool;
  }
  void make_cold_copies() {
    const bool h = dtype_ == DType::bf16;
    const char* b = h ? reinterpret_cast<const char*>(b16_.data())
                      : reinterpret_cast<const char*>(b_.data());
    b_bytes_ = static_cast<int64_t>(b_.size()) * (h ? 2 : 4);
    copies_ = std::max<int64_t>(2, (cold_weight_bytes() + b_bytes_ - 1) / b_bytes_);
    std::vector<char>& pool = cold_pool();
    if (static_cast<int64_t>(pool.size()) < copies_ * b_bytes_)
      pool.resize(static_cast<size_t>(copies_ * b_bytes_));
    for (int64_t c = 0; c < copies_; ++c) std::copy(b, b + b_bytes_, pool.data() + c * b_bytes_);
    cold_ = pool.data();
  }

  DType dtype_;
  GemmShape shape_;
  std::vector<float> a_, b_, c_;
  std::vector<bf16> a16_, b16_;
  const char* cold_ = nullptr;  // cold_b: copies_ copies of B in the GEMM dtype (the pool)
  int64_t b_bytes_ = 0, copies_ = 0, next_ = 0;
};

// On the CPU each sample times one call, or a batch of calls lasting ≥ 50 µs for tiny shapes
// so that the clock's resolution does not matter. Samples rather than whole runs are timed
// because on a busy machine a run of many calls almost always contains a preemption while
// single calls often do not: the minimum over samples is the undisturbed time per call.
//
// The warm-up's first call creates and JIT-compiles the oneDNN primitive; the plan comes from
// the best of a few calls (up to 5, or min_seconds' worth): a single call on a busy machine
// may wait a whole scheduler slice for its second thread.
SamplingPlan GemmCase::plan_sampling(double min_seconds) {
  GemmCase& g = *this;
  g.call();
  double once = std::numeric_limits<double>::infinity(), spent = 0;
  for (int i = 0; i < 5 && (i == 0 || spent < min_seconds); ++i) {
    const double start = now_seconds();
    g.call();
    const double t = now_seconds() - start;
    once = std::min(once, t);
    spent += t;
  }
  once = std::max(once, 1e-9);
  SamplingPlan plan;
  plan.calls_per_sample =
      std::clamp<int64_t>(static_cast<int64_t>(std::ceil(50e-6 / once)), 1, 1 << 20);
  plan.samples_per_run = std::clamp<int64_t>(
      static_cast<int64_t>(std::ceil(min_seconds / (once * plan.calls_per_sample))), 1, 1 << 20);
  return plan;
}

double GemmCase::timed_run(const SamplingPlan& plan) {
  GemmCase& g = *this;
  double best = std::numeric_limits<double>::infinity();
  for (int64_t s = 0; s < plan.samples_per_run; ++s) {
    const double start = now_seconds();
    for (int64_t i = 0; i < plan.calls_per_sample; ++i) g.call();
    best = std::min(best, (now_seconds() - start) / static_cast<double>(plan.calls_per_sample));
  }
  return best;
}

GemmMeasurement make_measurement(DType dtype, const GemmShape& shape, const SamplingPlan& plan) {
  GemmMeasurement p;
  p.dtype = dtype;
  p.shape = shape;
  p.calls_per_run = plan.calls_per_sample * plan.samples_per_run;
  p.seconds = std::numeric_limits<double>::infinity();
  return p;
}

}  // namespace

GemmMeasurement measure_gemm(DType dtype, const GemmShape& shape, int repeats, double min_seconds) {
  GemmCase g(dtype, shape);
  const SamplingPlan plan = g.plan_sampling(min_seconds);
  GemmMeasurement p = make_measurement(dtype, shape, plan);
  for (int r = 0; r < repeats; ++r) p.seconds = std::min(p.seconds, g.timed_run(plan));
  p.flops_per_s = gemm_rate(shape.m, shape.n, shape.k, p.seconds);
  p.valid = g.check();
  return p;
}

GemmBenchResult run_gemm_bench(const GemmBenchOptions& options) {
  return run_gemm_passes(options, [](DType dtype, const GemmShape& shape, size_t) {
    return std::make_unique<GemmCase>(dtype, shape);
  });
}

GemmBenchResult run_gemm_passes(const GemmBenchOptions& options, const MakeTimedGemm& make) {
  validate(options);
  GemmBenchResult result;
  result.repeats = options.repeats;
  if (getloadavg(result.load_average, 3) < 0) result.load_average[0] = -1;
  const std::vector<GemmShape> shapes = gemm_sweep(options);
  std::vector<std::pair<DType, GemmShape>> cases;
  for (DType dtype : options.dtypes)
    for (const GemmShape& shape : shapes) cases.emplace_back(dtype, shape);

  // The operands are rebuilt each pass (memory stays at one shape's worth).
  std::vector<SamplingPlan> plans(cases.size());
  const int64_t total = static_cast<int64_t>(cases.size()) * options.repeats;
  int64_t done = 0;
  for (int pass = 0; pass < options.repeats; ++pass) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto& [dtype, shape] = cases[i];
      const std::unique_ptr<TimedGemm> g = make(dtype, shape, i);
      if (pass == 0) {
        plans[i] = g->plan_sampling(options.min_seconds);
        result.points.push_back(make_measurement(dtype, shape, plans[i]));
      }
      GemmMeasurement& p = result.points[i];
      p.seconds = std::min(p.seconds, g->timed_run(plans[i]));
      p.flops_per_s = gemm_rate(shape.m, shape.n, shape.k, p.seconds);
      if (pass + 1 == options.repeats) {
        p.valid = g->check();
        if (!p.valid) result.all_valid = false;
      }
      ++done;
      if (options.on_progress)
        options.on_progress(done, total,
                            fmt::format("pass {}/{}: {} {}x{}x{} {:.0f} GFLOP/s", pass + 1,
                                        options.repeats, dtype_name(dtype), shape.m, shape.n,
                                        shape.k, p.flops_per_s / 1e9));
    }
  }
  compute_efficiencies(result);
  return result;
}

std::vector<DType> parse_dtypes(const std::string& flag, const std::string& text) {
  std::vector<DType> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const std::optional<DType> dtype = parse_dtype(item);
    if (!dtype)
      fail(fmt::format("{} '{}': unsupported dtype '{}'", flag, text, item),
           "GEMMs run with fp32 or bf16 inputs (fp32 accumulation); use fp32, bf16 or fp32,bf16");
    out.push_back(*dtype);
    if (std::count(out.begin(), out.end(), out.back()) > 1) out.pop_back();
  }
  if (out.empty()) fail(fmt::format("{} is empty", flag), "use fp32, bf16 or fp32,bf16");
  return out;
}

std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  const std::string hint =
      fmt::format("give comma-separated positive integers, e.g. {} 256,512,1024", flag);
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      if (item.empty() || !(std::isdigit(static_cast<unsigned char>(item[0])) || item[0] == '-'))
        throw std::invalid_argument(item);
      v = std::stoll(item, &used);
    } catch (...) {
      fail(fmt::format("{} '{}': '{}' is not an integer", flag, text, item), hint);
    }
    if (used != item.size())
      fail(fmt::format("{} '{}': '{}' is not an integer", flag, text, item), hint);
    if (v < 1) fail(fmt::format("{} {}: values must be ≥ 1", flag, v), hint);
    out.push_back(v);
  }
  if (out.empty()) fail(fmt::format("{} is empty", flag), hint);
  return out;
}

std::pair<int64_t, int64_t> parse_range(const std::string& flag, const std::string& text) {
  const auto colon = text.find(':');
  if (colon == std::string::npos)
    fail(fmt::format("{} '{}' is not a range FROM:TO", flag, text),
         fmt::format("e.g. {} 1008:1040", flag));
  const int64_t from = parse_int_list(flag, text.substr(0, colon)).at(0);
  const int64_t to = parse_int_list(flag, text.substr(colon + 1)).at(0);
  if (to < from)
    fail(fmt::format("{} {}: TO is below FROM", flag, text),
         fmt::format("e.g. {} 1008:1040", flag));
  return {from, to};
}

nlohmann::json gemm_profile_section(const GemmBenchResult& r, const Provenance& provenance) {
  using nlohmann::json;
  json j;
  j["points"] = json::array();
  for (const GemmMeasurement& p : r.points)
    j["points"].push_back({{"dtype", dtype_name(p.dtype)},
                           {"m", p.shape.m},
                           {"n", p.shape.n},
                           {"k", p.shape.k},
                           {"kind", p.shape.kind},
                           {"label", p.shape.label},
                           {"layout", layout_name(p.shape)},
                           {"seconds", p.seconds},
                           {"flops_per_s", p.flops_per_s},
                           {"efficiency", p.efficiency},
                           {"valid", p.valid}});
  j["best_flops_per_s"] = json::object();
  if (r.best_fp32 > 0) j["best_flops_per_s"]["fp32"] = r.best_fp32;
  if (r.best_bf16 > 0) j["best_flops_per_s"]["bf16"] = r.best_bf16;
  j["repeats"] = r.repeats;
  j["all_valid"] = r.all_valid;
  j["load_average_before"] = {r.load_average[0], r.load_average[1], r.load_average[2]};
  j["provenance"] = to_json(provenance);
  j["source"] = "measured";
  return j;
}

nlohmann::json compute_profile_section(const GemmBenchResult& r, const CpuPeak& peak,
                                       const Provenance& provenance) {
  using nlohmann::json;
  json j;
  for (DType t : {DType::bf16, DType::f32}) {
    json d = to_json(t == DType::bf16 ? peak.bf16 : peak.fp32);
    d["measured_flops_per_s"] = r.best(t) > 0 ? json(r.best(t)) : json();
    d["source"] = "measured";
    j[dtype_name(t)] = d;
  }
  j["isa"] = peak.isa;
  j["provenance"] = to_json(provenance);
  return j;
}

std::string gemm_csv(const GemmBenchResult& r, const Provenance& provenance) {
  std::string out = format_provenance(provenance, "# ");
  out += "dtype,kind,m,n,k,layout,seconds,gflops_per_s,efficiency,valid,label\n";
  for (const GemmMeasurement& p : r.points)
    out += fmt::format("{},{},{},{},{},{},{:.9g},{:.3f},{:.4f},{},\"{}\"\n", dtype_name(p.dtype),
                       p.shape.kind, p.shape.m, p.shape.n, p.shape.k, layout_name(p.shape),
                       p.seconds, p.flops_per_s / 1e9, p.efficiency, p.valid ? "true" : "false",
                       p.shape.label);
  return out;
}

std::string format_gemm_tables(const GemmBenchResult& r, const CpuPeak& peak) {
  std::string out;
  out += "peak compute (GFLOP/s = 1e9 FLOP/s):\n";
  for (DType t : {DType::f32, DType::bf16}) {
    const DtypePeak& spec = t == DType::bf16 ? peak.bf16 : peak.fp32;
    const double best = r.best(t);
    std::string measured = best > 0 ? fmt::format("{:.1f}", best / 1e9) : std::string("-");
    std::string ratio =
        best > 0 && spec.flops_per_s > 0
            ? fmt::format(" ({:.0f}% of the estimate)", 100 * best / spec.flops_per_s)
            : std::string();
    out += fmt::format("  {}: measured best {}{}; estimate {}\n", dtype_name(t), measured, ratio,
                       spec.basis);
    if (best > spec.flops_per_s * 1.02 && spec.flops_per_s > 0)
      out += fmt::format("    note: the measured rate exceeds the estimate, so a factor of it "
                         "(clock, FMA units) is low; set --peak-clock-ghz / --peak-fma-units\n");
  }
  for (const char* kind : kKinds) {
    bool any = false;
    for (const GemmMeasurement& p : r.points) any = any || p.shape.kind == kind;
    if (!any) continue;
    out += fmt::format("\n{} GEMMs: C[M,N] = A[M,K]·B[K,N]; eff = rate / best rate of the dtype; "
                       "%peak = rate / estimated peak\n", kind);
    out += fmt::format("{:<5} {:>6} {:>6} {:>6} {:>3} {:>10} {:>9} {:>6} {:>6}  {}\n", "dtype", "M",
                       "N", "K", "lay", "ms", "GFLOP/s", "eff", "%peak", "shape");
    for (const GemmMeasurement& p : r.points) {
      if (p.shape.kind != kind) continue;
      const double spec = (p.dtype == DType::bf16 ? peak.bf16 : peak.fp32).flops_per_s;
      out += fmt::format("{:<5} {:>6} {:>6} {:>6} {:>3} {:>10.3f} {:>9.1f} {:>5.0f}% {:>5}  {}{}\n",
                         dtype_name(p.dtype), p.shape.m, p.shape.n, p.shape.k, layout_name(p.shape),
                         p.seconds * 1e3, p.flops_per_s / 1e9, 100 * p.efficiency,
                         spec > 0 ? fmt::format("{:.0f}%", 100 * p.flops_per_s / spec) : "-",
                         p.shape.label, p.valid ? "" : "  WRONG RESULT");
    }
  }
  return out;
}

nlohmann::json read_profile_for_merge(const std::string& path) {
  nlohmann::json profile;
  if (!path_exists(path)) return profile;
  try {
    profile = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(fmt::format("--profile {}: not valid JSON ({})", path, e.what()),
         "fix or remove the file; it is rewritten with the measured sections kept");
  }
  if (!profile.is_object() || profile.value("format", "") != kHardwareProfileFormat)
    fail(fmt::format("--profile {}: not a foundry hardware profile (no \"format\": "
                     "\"foundry-hardware-profile\")", path),
         "choose another path; the file is left as it is");
  return profile;
}

nlohmann::json merged_profile_section(const std::string& key, const nlohmann::json& old,
                                      const nlohmann::json& fresh) {
  using nlohmann::json;
  if (!old.is_object() || !fresh.is_object()) return fresh;
  json merged = fresh;
  if (key == "compute") {
    for (const char* dtype : {"bf16", "fp32"})
      if (fresh.contains(dtype) && fresh[dtype].value("measured_flops_per_s", json()).is_null() &&
          old.contains(dtype) && !old[dtype].value("measured_flops_per_s", json()).is_null())
        merged[dtype] = old[dtype];
  } else if (key == "gemm" && old.contains("points") && old["points"].is_array()) {
    // The (dtype, kind) pairs this run measured replace theirs; the others' points stay.
    std::set<std::pair<std::string, std::string>> ran;
    for (const json& p : fresh.value("points", json::array()))
      ran.insert({p.value("dtype", ""), p.value("kind", "")});
    json points = fresh.value("points", json::array());
    for (const json& p : old["points"])
      if (p.is_object() && !ran.count({p.value("dtype", ""), p.value("kind", "")}))
        points.push_back(p);
    merged["points"] = points;
    json best = fresh.value("best_flops_per_s", json::object());
    if (old.contains("best_flops_per_s") && old["best_flops_per_s"].is_object())
      for (const auto& [dtype, rate] : old["best_flops_per_s"].items())
        if (!best.contains(dtype)) best[dtype] = rate;
    merged["best_flops_per_s"] = best;
  } else if (key == "memory") {
    for (const char* part : {"measured_bytes_per_s", "stream", "working_set"}) {
      const json now = fresh.value(part, json());
      if ((now.is_null() || (now.is_array() && now.empty())) && old.contains(part))
        merged[part] = old[part];
    }
  }
  return merged;
}

void check_profile_device(const nlohmann::json& profile, const nlohmann::json& device,
                          const std::string& path) {
  const nlohmann::json held =
      profile.is_object() ? profile.value("device", nlohmann::json()) : nlohmann::json();
  if (!held.is_object() || !held.contains("kind") || !device.contains("kind")) return;
  const std::string kind = held.value("kind", ""), name = held.value("name", "");
  const bool named = device.contains("name");
  // (A profile whose device has no name is held to its kind alone.)
  if (kind != device.value("kind", "") ||
      (named && !name.empty() && name != device.value("name", "")))
    fail(fmt::format(
             "{} describes the {} '{}', and this run measures {}: one profile holds one "
             "device's figures",
             path, kind, name,
             named ? fmt::format("the {} '{}'", device.value("kind", ""), device.value("name", ""))
                   : "a " + device.value("kind", std::string())),
         "write this machine's figures to a profile of its own (another path); the file is "
         "left as it is");
}

void merge_profile_sections(const std::string& path, const nlohmann::json& sections,
                            const Provenance& provenance, const nlohmann::json& device) {
  nlohmann::json profile = read_profile_for_merge(path);
  if (profile.is_null())
    profile = {{"format", kHardwareProfileFormat},
               {"version", 1},
               {"name", provenance.host},
               {"provenance", to_json(provenance)}};
  check_profile_device(profile, device, "--profile " + path);
  for (const auto& [key, value] : sections.items())
    profile[key] = merged_profile_section(key, profile.value(key, nlohmann::json()), value);
  write_file_atomic(path, profile.dump(2) + "\n");
}

}  // namespace foundry
