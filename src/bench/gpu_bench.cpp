#include "bench/gpu_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <vector>

#include "base/error.h"
#include "cuda/blas.h"
#include "cuda/ops.h"
#include "cuda/random_fill.h"
#include "cuda/stream_kernels.h"

namespace foundry {

namespace {

// ---- GEMM ----

// One product's operands on the GPU, filled there (random_fill.h); the check recomputes
// sampled entries from the same streams on the host.
class GpuGemmCase : public TimedGemm {
 public:
  GpuGemmCase(DType dtype, const GemmShape& shape, const gpu::GpuInfo& gpu, uint64_t seed)
      : dtype_(dtype), shape_(shape), seed_a_(2 * seed), seed_b_(2 * seed + 1) {
    const bool bf16 = dtype == DType::bf16;
    const int64_t elem = bf16 ? 2 : 4;
    a_dev_ = gpu::DeviceBuffer(shape.m * shape.k * elem);
    gpu::fill_eighths(a_dev_.data(), shape.m * shape.k, bf16, seed_a_);
    // Decode shapes read B from memory: they cycle through copies that exceed the L2 twice.
    b_bytes_ = shape.k * shape.n * elem;
    copies_ = shape.cold_b ? std::max<int64_t>(2, (2 * gpu.l2_bytes + b_bytes_ - 1) / b_bytes_) : 1;
    b_dev_ = gpu::DeviceBuffer(copies_ * b_bytes_);
    for (int64_t c = 0; c < copies_; ++c)
      gpu::fill_eighths(b_dev_.as<char>() + c * b_bytes_, shape.k * shape.n, bf16, seed_b_);
    c_dev_ = gpu::DeviceBuffer(shape.m * shape.n * 4);
    c_dev_.fill_bytes(0xFF);  // NaN: an element the product does not write fails the check
  }

  void call() {
    const char* b = b_dev_.as<char>() + next_ * b_bytes_;
    next_ = (next_ + 1) % copies_;
    gpu::gemm(a_dev_.data(), shape_.trans_a, b, shape_.trans_b, c_dev_.as<float>(), shape_.m,
              shape_.n, shape_.k, dtype_);
  }

  // Batches of calls timed by CUDA events: each batch lasts about 1 ms, so that the events'
  // resolution (about 0.5 µs) and the launch gaps do not matter.
  SamplingPlan plan_sampling(double min_seconds) override {
    call();  // creates the cuBLASLt plan
    timer_.start();
    call();
    const double once = std::max(timer_.seconds(), 1e-7);
    SamplingPlan plan;
    plan.calls_per_sample =
        std::clamp<int64_t>(static_cast<int64_t>(std::ceil(1e-3 / once)), 1, 1 << 14);
    plan.samples_per_run = std::clamp<int64_t>(
        static_cast<int64_t>(std::ceil(min_seconds / (once * plan.calls_per_sample))), 1, 1 << 12);
    return plan;
  }

  double timed_run(const SamplingPlan& plan) override {
    double best = std::numeric_limits<double>::infinity();
    for (int64_t s = 0; s < plan.samples_per_run; ++s) {
      timer_.start();
      for (int64_t i = 0; i < plan.calls_per_sample; ++i) call();
      best = std::min(best, timer_.seconds() / static_cast<double>(plan.calls_per_sample));
    }
    return best;
  }

  // Corners, the middle and scattered entries against the exact double reference.
  bool check() const override {
    const int64_t m = shape_.m, n = shape_.n, k = shape_.k;
    std::vector<float> c(static_cast<size_t>(m * n));
    c_dev_.download(c.data(), m * n * 4);
    const int64_t entries[][2] = {{0, 0}, {m - 1, n - 1}, {m / 2, n / 3}, {m / 3, n - 1},
                                  {m - 1, 0}, {(m * 7) / 11, (n * 5) / 13}};
    for (const auto& e : entries) {
      double ref = 0;
      for (int64_t q = 0; q < k; ++q) ref += static_cast<double>(a_at(e[0], q)) * b_at(q, e[1]);
      if (static_cast<double>(c[static_cast<size_t>(e[0] * n + e[1])]) != ref) return false;
    }
    return true;
  }

 private:
  float a_at(int64_t i, int64_t q) const {
    return gpu::eighth_at(seed_a_, static_cast<uint64_t>(shape_.trans_a ? q * shape_.m + i
                                                                        : i * shape_.k + q));
  }
  float b_at(int64_t q, int64_t j) const {
    return gpu::eighth_at(seed_b_, static_cast<uint64_t>(shape_.trans_b ? j * shape_.k + q
                                                                        : q * shape_.n + j));
  }

  DType dtype_;
  GemmShape shape_;
  uint64_t seed_a_, seed_b_;
  gpu::DeviceBuffer a_dev_, b_dev_, c_dev_;
  int64_t b_bytes_ = 0, copies_ = 1, next_ = 0;
  gpu::GpuTimer timer_;
};

// ---- memory ----

StreamResult stream_result(const char* kernel, int sms, int64_t n, int64_t bytes_per_run,
                           const std::vector<double>& seconds, bool valid) {
  StreamResult s;
  s.kernel = kernel;
  s.threads = sms;
  s.array_bytes = n * 8;
  s.bytes_per_run = bytes_per_run;
  // The first run is not counted (STREAM's convention).
  std::vector<double> counted(seconds.begin() + (seconds.size() > 1 ? 1 : 0), seconds.end());
  s.best_seconds = *std::min_element(counted.begin(), counted.end());
  s.max_seconds = *std::max_element(counted.begin(), counted.end());
  double sum = 0;
  for (double t : counted) sum += t;
  s.avg_seconds = sum / static_cast<double>(counted.size());
  s.bytes_per_s = static_cast<double>(bytes_per_run) / s.best_seconds;
  s.valid = valid;
  return s;
}

int64_t default_array_bytes(const gpu::GpuInfo& gpu) {
  return std::max<int64_t>(int64_t{1} << 30, 8 * gpu.l2_bytes);
}

// STREAM copy, scale, add, triad `repeats` times, checked by the scalar recurrence; then the
// read and the write, each checked.
void run_gpu_stream(const MembwOptions& o, const gpu::GpuInfo& gpu, MembwResult& result) {
  const int64_t n = (o.array_bytes > 0 ? o.array_bytes : default_array_bytes(gpu)) / 8;
  gpu::DeviceBuffer a(n * 8), b(n * 8), c(n * 8), partial(gpu::stream_read_partials() * 8);
  gpu::fill_doubles(a.as<double>(), n, 1.0);
  gpu::fill_doubles(b.as<double>(), n, 2.0);
  gpu::fill_doubles(c.as<double>(), n, 0.0);
  gpu::GpuTimer timer;
  const gpu::StreamOp stream_ops[] = {gpu::StreamOp::copy, gpu::StreamOp::scale,
                                      gpu::StreamOp::add, gpu::StreamOp::triad};
  std::vector<std::vector<double>> seconds(4, std::vector<double>(o.repeats));
  for (int r = 0; r < o.repeats; ++r)
    for (int k = 0; k < 4; ++k) {
      timer.start();
      gpu::run_stream_op(stream_ops[k], a.as<double>(), b.as<double>(), c.as<double>(), n,
                         kStreamScalar, nullptr);
      seconds[k][r] = timer.seconds();
    }
  std::vector<double> ha(n), hb(n), hc(n);
  a.download(ha.data(), n * 8);
  b.download(hb.data(), n * 8);
  c.download(hc.data(), n * 8);
  const StreamCheck check = validate_stream(ha.data(), hb.data(), hc.data(), n, o.repeats);
  if (!check.valid) {
    result.all_valid = false;
    result.notes.push_back(fmt::format("STREAM failed validation: array {} is wrong at index {}",
                                       check.first_bad_array, check.first_bad));
  }
  for (int k = 0; k < 4; ++k) {
    result.stream.push_back(stream_result(gpu::stream_op_name(stream_ops[k]), gpu.sm_count, n,
                                          gpu::stream_op_bytes(stream_ops[k], n), seconds[k],
                                          check.valid));
    if (stream_ops[k] == gpu::StreamOp::triad)
      result.best_triad_bytes_per_s = result.stream.back().bytes_per_s;
  }

  // read: the sum of the final a, against the host's sum of the same values.
  std::vector<double> read_s(o.repeats), write_s(o.repeats);
  for (int r = 0; r < o.repeats; ++r) {
    timer.start();
    gpu::run_stream_op(gpu::StreamOp::read, a.as<double>(), nullptr, nullptr, n, 0,
                       partial.as<double>());
    read_s[r] = timer.seconds();
  }
  std::vector<double> partials(gpu::stream_read_partials());
  partial.download(partials.data(), static_cast<int64_t>(partials.size()) * 8);
  double device_sum = 0, host_sum = 0;
  for (double p : partials) device_sum += p;
  for (double x : ha) host_sum += x;
  const bool read_ok = std::abs(device_sum - host_sum) <= 1e-12 * std::abs(host_sum);
  result.stream.push_back(stream_result("read", gpu.sm_count, n,
                                        gpu::stream_op_bytes(gpu::StreamOp::read, n), read_s,
                                        read_ok));
  // write: every element of a becomes the scalar.
  for (int r = 0; r < o.repeats; ++r) {
    timer.start();
    gpu::run_stream_op(gpu::StreamOp::write, a.as<double>(), nullptr, nullptr, n, kStreamScalar,
                       nullptr);
    write_s[r] = timer.seconds();
  }
  a.download(ha.data(), n * 8);
  const bool write_ok = std::all_of(ha.begin(), ha.end(), [](double x) { return x == kStreamScalar; });
  result.stream.push_back(stream_result("write", gpu.sm_count, n,
                                        gpu::stream_op_bytes(gpu::StreamOp::write, n), write_s,
                                        write_ok));
  if (!read_ok || !write_ok) {
    result.all_valid = false;
    result.notes.push_back(!read_ok ? "the read kernel's sum is wrong"
                                    : "the write kernel left wrong values");
  }
}

// Triad over three arrays whose total sweeps from min_bytes to max_bytes: each point repeats
// the kernel back to back within one timed batch of about bytes_per_run bytes.
void run_gpu_working_set(const MembwOptions& o, const gpu::GpuInfo& gpu, MembwResult& result) {
  const int64_t min_bytes = o.min_bytes > 0 ? o.min_bytes : int64_t{1} << 20;
  const int64_t max_bytes = o.max_bytes > 0 ? o.max_bytes : 8 * gpu.l2_bytes;
  const int64_t per_run = o.bytes_per_run > 0 ? o.bytes_per_run : int64_t{4} << 30;
  const int64_t n_max = max_bytes / 24;
  gpu::DeviceBuffer a(n_max * 8), b(n_max * 8), c(n_max * 8);
  gpu::fill_doubles(b.as<double>(), n_max, 2.0);
  gpu::fill_doubles(c.as<double>(), n_max, 0.5);
  gpu::GpuTimer timer;
  const double step = std::pow(2.0, 1.0 / o.points_per_doubling);
  for (double bytes = static_cast<double>(min_bytes); bytes <= static_cast<double>(max_bytes) * 1.0001;
       bytes *= step) {
    const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(bytes) / 24);
    const int64_t calls = std::max<int64_t>(1, per_run / (24 * n));
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < o.repeats; ++r) {
      timer.start();
      for (int64_t i = 0; i < calls; ++i)
        gpu::run_stream_op(gpu::StreamOp::triad, a.as<double>(), b.as<double>(), c.as<double>(),
                           n, kStreamScalar, nullptr);
      const double t = timer.seconds();
      if (r > 0 || o.repeats == 1) best = std::min(best, t);
    }
    std::vector<double> ha(static_cast<size_t>(n));
    a.download(ha.data(), n * 8);
    WorkingSetPoint p;
    p.bytes = 24 * n;
    p.bytes_per_s = static_cast<double>(24 * n * calls) / best;
    p.threads = gpu.sm_count;
    p.fits_in = p.bytes <= gpu.l2_bytes ? "L2" : "HBM";
    p.valid = std::all_of(ha.begin(), ha.end(), [](double x) { return x == 2.0 + kStreamScalar * 0.5; });
    if (!p.valid) result.all_valid = false;
    result.working_set.push_back(p);
    if (o.on_progress)
      o.on_progress(static_cast<int64_t>(result.working_set.size()), 0,
                    fmt::format("{} {:.0f} GB/s", format_size(static_cast<double>(p.bytes)),
                                p.bytes_per_s / 1e9));
  }
}

}  // namespace

GemmBenchOptions gpu_gemm_defaults() {
  GemmBenchOptions o;
  o.square_sizes = {256, 512, 1024, 2048, 4096, 6144, 8192};
  o.tokens = {16384};
  o.hidden = {2048, 4096};
  o.ffn = {2048, 4096, 8192};
  o.experts = {16, 64};
  o.offsize_from = 4064;
  o.offsize_to = 4160;
  o.offsize_base = 4096;
  o.decode_rows = {1, 8, 64, 256};
  o.repeats = 5;
  o.min_seconds = 0.02;
  return o;
}

GemmBenchOptions gpu_gemm_quick() {
  GemmBenchOptions o = gpu_gemm_defaults();
  o.square_sizes = {256, 1024, 4096};
  o.tokens = {4096};
  o.hidden = {1024};
  o.ffn = {2048};
  o.experts = {16};
  o.offsize_from = 1016;
  o.offsize_to = 1032;
  o.offsize_base = 1024;
  o.decode_rows = {1, 64};
  o.repeats = 2;
  o.min_seconds = 0.005;
  return o;
}

GemmBenchResult run_gpu_gemm_bench(const GemmBenchOptions& options, const gpu::GpuInfo& gpu) {
  return run_gemm_passes(options, [&gpu](DType dtype, const GemmShape& shape, size_t i) {
    return std::make_unique<GpuGemmCase>(dtype, shape, gpu, 1000 + i);
  });
}

CpuPeak gpu_peak(const gpu::GpuInfo& g) {
  // Dense FLOP per cycle per SM: tensor cores for bf16, CUDA cores (2 per FMA lane) for fp32.
  int bf16_per_sm = 0, fp32_per_sm = 0;
  if (g.major == 8 && g.minor == 0) bf16_per_sm = 2048, fp32_per_sm = 128;  // A100
  if (g.major == 9 && g.minor == 0) bf16_per_sm = 4096, fp32_per_sm = 256;  // H100, H200
  if (g.major == 10 && g.minor == 0) bf16_per_sm = 8192, fp32_per_sm = 256;  // B200
  CpuPeak peak;
  peak.isa = g.arch() + " tensor cores";
  peak.clock_source = "the CUDA runtime's maximum SM clock";
  auto fill = [&](DtypePeak& d, int per_sm, const char* unit) {
    d.cores = g.sm_count;
    d.clock_hz = g.sm_clock_hz;
    d.units = 1;
    d.lanes = per_sm / 2;
    d.flops_per_s = static_cast<double>(g.sm_count) * g.sm_clock_hz * per_sm;
    d.basis = per_sm > 0
                  ? fmt::format("{} SMs × {:.3f} GHz × {} FLOP/cycle/SM ({}, dense)", g.sm_count,
                                g.sm_clock_hz / 1e9, per_sm, unit)
                  : fmt::format("unknown for {} (no published per-SM rate here)", g.arch());
  };
  fill(peak.bf16, bf16_per_sm, "tensor cores");
  fill(peak.fp32, fp32_per_sm, "CUDA cores");
  return peak;
}

MembwOptions gpu_membw_quick() {
  MembwOptions o;
  o.array_bytes = 64 << 20;
  o.repeats = 3;
  o.min_bytes = 1 << 20;
  o.max_bytes = 256 << 20;
  o.points_per_doubling = 1;
  o.bytes_per_run = 256 << 20;
  return o;
}

int64_t gpu_membw_bytes(const MembwOptions& o, const gpu::GpuInfo& gpu) {
  const int64_t stream = o.stream ? 3 * (o.array_bytes > 0 ? o.array_bytes : default_array_bytes(gpu)) : 0;
  const int64_t sweep = o.working_set ? (o.max_bytes > 0 ? o.max_bytes : 8 * gpu.l2_bytes) : 0;
  return std::max(stream, sweep);
}

MembwResult run_gpu_membw_bench(const MembwOptions& options, const gpu::GpuInfo& gpu) {
  MembwResult result;
  result.repeats = options.repeats;
  if (getloadavg(result.load_average, 3) < 0) result.load_average[0] = -1;
  CacheLevel l2;
  l2.level = 2;
  l2.type = "Unified";
  l2.bytes = gpu.l2_bytes;
  l2.shared_cpus = gpu.sm_count;
  result.caches.push_back(l2);
  if (options.stream) run_gpu_stream(options, gpu, result);
  if (options.working_set) run_gpu_working_set(options, gpu, result);
  return result;
}

nlohmann::json gpu_device_section(const gpu::GpuInfo& gpu, int visible) {
  return {{"kind", "gpu"},
          {"name", gpu.name},
          {"arch", gpu.arch()},
          {"sm_count", gpu.sm_count},
          {"memory_bytes", gpu.memory_bytes},
          {"l2_bytes", gpu.l2_bytes},
          {"devices_per_node", visible},
          {"driver_version", gpu.driver_version},
          {"runtime_version", gpu.runtime_version},
          {"source", "measured: the CUDA runtime's device properties"}};
}

nlohmann::json gpu_memory_section(const MembwResult& r, const gpu::GpuInfo& gpu,
                                  const Provenance& provenance) {
  nlohmann::json j = memory_profile_section(r, provenance);
  const double spec = gpu.spec_memory_bytes_per_s();
  j["spec_bytes_per_s"] = spec > 0 ? nlohmann::json(spec) : nlohmann::json();
  j["spec_basis"] = fmt::format("2 × {:.0f} MHz × {} bits / 8", gpu.memory_clock_hz / 1e6,
                                gpu.memory_bus_bits);
  return j;
}

std::string describe_gpu(const gpu::GpuInfo& g) {
  return fmt::format("{} ({}, {} SMs at {:.2f} GHz, {}, L2 {}; driver {}.{}, runtime {}.{})",
                     g.name, g.arch(), g.sm_count, g.sm_clock_hz / 1e9,
                     format_size(static_cast<double>(g.memory_bytes)),
                     format_size(static_cast<double>(g.l2_bytes)), g.driver_version / 1000,
                     (g.driver_version % 1000) / 10, g.runtime_version / 1000,
                     (g.runtime_version % 1000) / 10);
}

std::string format_gpu_membw_tables(const MembwResult& r, const gpu::GpuInfo& gpu) {
  std::string out;
  const double spec = gpu.spec_memory_bytes_per_s();
  if (!r.stream.empty()) {
    out += fmt::format(
        "STREAM on the GPU: arrays of {} each, best of {} runs after the first; GB/s = 1e9 "
        "bytes/s; spec {:.0f} GB/s\n",
        format_size(static_cast<double>(r.stream.front().array_bytes)), r.repeats - 1, spec / 1e9);
    out += fmt::format("{:<7} {:>11} {:>10} {:>8} {:>10} {:>10}  {}\n", "kernel", "bytes/run",
                       "best GB/s", "of spec", "min s", "avg s", "valid");
    for (const StreamResult& s : r.stream)
      out += fmt::format("{:<7} {:>11} {:>10.1f} {:>7.0f}% {:>10.6f} {:>10.6f}  {}\n", s.kernel,
                         format_size(static_cast<double>(s.bytes_per_run)), s.bytes_per_s / 1e9,
                         spec > 0 ? 100 * s.bytes_per_s / spec : 0.0, s.best_seconds,
                         s.avg_seconds, s.valid ? "yes" : "NO");
    out += "\n";
  }
  if (!r.working_set.empty()) {
    double top = 0;
    for (const WorkingSetPoint& p : r.working_set) top = std::max(top, p.bytes_per_s);
    out += fmt::format("working set: triad (3 arrays), L2 {}\n",
                       format_size(static_cast<double>(gpu.l2_bytes)));
    out += fmt::format("{:>11} {:>9}  {:<7}\n", "bytes", "GB/s", "fits in");
    for (const WorkingSetPoint& p : r.working_set) {
      const int bar = top > 0 ? static_cast<int>(std::lround(30.0 * p.bytes_per_s / top)) : 0;
      out += fmt::format("{:>11} {:>9.1f}  {:<7} {}{}\n", format_size(static_cast<double>(p.bytes)),
                         p.bytes_per_s / 1e9, p.fits_in, std::string(bar, '#'),
                         p.valid ? "" : "  INVALID");
    }
    out += "\n";
  }
  for (const std::string& note : r.notes) out += "note: " + note + "\n";
  return out;
}

// ---- attention ----

AttentionBenchOptions gpu_attention_quick() {
  AttentionBenchOptions o;
  o.seqs = {1024, 2048};
  return o;
}

namespace {

int64_t batch_at(const AttentionBenchOptions& o, int64_t seq) {
  return std::max<int64_t>(1, o.tokens / seq);
}

// The fastest of three batches of calls, each lasting at least min_seconds: seconds a call.
double time_calls(gpu::GpuTimer& timer, const std::function<void()>& call, double min_seconds) {
  call();  // warm: the first launch of a kernel loads it
  timer.start();
  call();
  const double once = std::max(timer.seconds(), 1e-7);
  const int64_t calls = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(min_seconds / once)),
                                            1, 1 << 14);
  double best = std::numeric_limits<double>::infinity();
  for (int batch = 0; batch < 3; ++batch) {
    timer.start();
    for (int64_t i = 0; i < calls; ++i) call();
    best = std::min(best, timer.seconds() / static_cast<double>(calls));
  }
  return best;
}

}  // namespace

// q, out, dout, dq [B, T, H, D]; k, v, dk, dv [B, T, KVH, D]; lse and the backward's
// scratch [B, H, T].
int64_t attention_bench_bytes(const AttentionBenchOptions& o) {
  int64_t most = 0;
  for (int64_t seq : o.seqs) {
    const int64_t rows = batch_at(o, seq) * seq;
    most = std::max(most, 4 * (4 * rows * o.heads * o.head_dim + 4 * rows * o.kv_heads * o.head_dim +
                               2 * rows * o.heads));
  }
  return most;
}

void validate(const AttentionBenchOptions& o) {
  if (o.seqs.empty()) fail("bench attention: no sequence lengths", "give --seq, e.g. 1024,2048");
  for (int64_t seq : o.seqs)
    if (seq < 1) fail(fmt::format("bench attention: --seq {} is below 1", seq));
  if (o.tokens < 1 || o.heads < 1 || o.kv_heads < 1)
    fail(fmt::format("bench attention: --tokens {}, --heads {} and --kv-heads {} must each be at "
                     "least 1",
                     o.tokens, o.heads, o.kv_heads));
  if (o.heads % o.kv_heads != 0)
    fail(fmt::format("bench attention: --kv-heads {} does not divide --heads {}", o.kv_heads,
                     o.heads),
         "grouped-query attention shares each KV head among heads / kv_heads query heads");
  if (o.head_dim != 32 && o.head_dim != 64 && o.head_dim != 128)
    fail(fmt::format("bench attention: --head-dim {}: the tensor-core kernels take 32, 64 or 128",
                     o.head_dim),
         "other head sizes run the fp32 kernels in training, which the curve does not describe");
  for (int64_t seq : o.seqs)
    if (batch_at(o, seq) * o.heads > 65535)
      fail(fmt::format("bench attention: --seq {} makes {} sequences of {} heads, more than a "
                       "launch's 65,535 rows of blocks",
                       seq, batch_at(o, seq), o.heads),
           "raise the shortest --seq or lower --tokens");
}

AttentionBenchResult run_gpu_attention_bench(const AttentionBenchOptions& o,
                                             const gpu::GpuInfo& gpu) {
  validate(o);
  if (attention_bench_bytes(o) > gpu.memory_bytes)
    fail(fmt::format("bench attention: the largest point needs {} and {} has {}",
                     format_size(static_cast<double>(attention_bench_bytes(o))), gpu.name,
                     format_size(static_cast<double>(gpu.memory_bytes))),
         "lower --tokens or the longest --seq");
  AttentionBenchResult r;
  r.options = o;
  gpu::GpuTimer timer;
  for (size_t i = 0; i < o.seqs.size(); ++i) {
    const int64_t seq = o.seqs[i], batch = batch_at(o, seq);
    if (o.on_progress)
      o.on_progress(static_cast<int64_t>(i), static_cast<int64_t>(o.seqs.size()),
                    fmt::format("seq {}", seq));
    const gpu::ops::AttentionDims dims{batch, seq, o.heads, o.kv_heads, o.head_dim};
    const int64_t qn = batch * seq * o.heads * o.head_dim, kn = batch * seq * o.kv_heads * o.head_dim;
    gpu::DeviceBuffer q(qn * 4), k(kn * 4), v(kn * 4), dout(qn * 4), out(qn * 4), dq(qn * 4),
        dk(kn * 4), dv(kn * 4), lse(batch * o.heads * seq * 4),
        scratch(gpu::ops::attention_backward_scratch(dims) * 4);
    gpu::fill_eighths(q.data(), qn, false, 11 + 4 * i);
    gpu::fill_eighths(k.data(), kn, false, 12 + 4 * i);
    gpu::fill_eighths(v.data(), kn, false, 13 + 4 * i);
    gpu::fill_eighths(dout.data(), qn, false, 14 + 4 * i);
    const auto forward = [&] {
      gpu::ops::attention_forward_bf16(out.as<float>(), lse.as<float>(), q.as<float>(),
                                       k.as<float>(), v.as<float>(), dims);
    };
    const auto backward = [&] {
      gpu::ops::attention_backward_bf16(dq.as<float>(), dk.as<float>(), dv.as<float>(),
                                        dout.as<float>(), out.as<float>(), lse.as<float>(),
                                        q.as<float>(), k.as<float>(), v.as<float>(), dims,
                                        scratch.as<float>());
    };
    AttentionBenchPoint p;
    p.seq = seq;
    p.batch = batch;
    p.forward_s = time_calls(timer, forward, o.min_seconds);
    p.backward_s = time_calls(timer, backward, o.min_seconds);
    r.points.push_back(p);
  }
  if (o.on_progress)
    o.on_progress(static_cast<int64_t>(o.seqs.size()), static_cast<int64_t>(o.seqs.size()), "");
  return r;
}

}  // namespace foundry
