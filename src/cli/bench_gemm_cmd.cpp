// foundry bench gemm: oneDNN GEMM throughput over square, transformer, per-expert and off-size
// shapes, fp32 and bf16, against the best measured rate and an estimated peak.
// foundry bench membw: STREAM copy/scale/add/triad and a working-set sweep through the caches.
// foundry bench attention --device cuda: the GPU's attention kernels against its GEMM rates.
// With --device cuda, the same on a GPU (cuBLASLt; STREAM plus read and write through its L2).
//
// Both print a provenance header and tables on stdout (progress on stderr) and can write
// JSON, CSV, and their sections of a hardware profile.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

#include "base/device.h"
#include "base/error.h"
#include "base/io.h"
#include "base/memory_budget.h"
#include "base/progress.h"
#include "bench/cpu_peak.h"
#include "bench/gemm_bench.h"
#include "bench/gpu_bench.h"
#include "bench/membw_bench.h"
#include "bench/profile.h"
#include "bench/provenance.h"
#include "cli/commands.h"
#include "cuda/runtime.h"
#include "plan/perf_model.h"

namespace foundry::cli {

namespace {

// Flags common to both commands.
struct OutputFlags {
  std::string json_path, csv_path, profile_path;
  std::string device = "cpu";
  bool quick = false, quiet = false;
};

void add_output_flags(CLI::App* cmd, OutputFlags& o) {
  cmd->add_option("--json", o.json_path, "Write the results as JSON to FILE")->type_name("FILE");
  cmd->add_option("--csv", o.csv_path, "Write one row per measurement as CSV to FILE")
      ->type_name("FILE");
  cmd->add_option("--profile", o.profile_path,
                  "Merge the results into the hardware profile FILE (other sections are kept; "
                  "created if absent)")
      ->type_name("FILE");
  cmd->add_flag("--quick", o.quick, "A tiny sweep that finishes in seconds (for smoke tests)");
  cmd->add_flag("--quiet,-q", o.quiet, "No progress on stderr");
  cmd->add_option("--device", o.device, "Measure the CPU, or a GPU: cuda (GPU 0) or cuda:N")
      ->capture_default_str();
}

// The GPU a --device cuda run measures, described in the output's header.
gpu::GpuInfo open_bench_gpu(const DeviceSpec& device) {
  const gpu::GpuInfo g = gpu::open_gpu(device.index, "--device " + device.name());
  std::printf("# gpu: %s\n", describe_gpu(g).c_str());
  return g;
}

// A Progress bar created on the first report, when the total is known.
std::function<void(int64_t, int64_t, const std::string&)> progress_callback(
    std::shared_ptr<std::unique_ptr<Progress>> holder, const std::string& label, bool quiet) {
  if (quiet) return {};
  return [holder, label](int64_t done, int64_t total, const std::string& what) {
    if (!*holder) *holder = std::make_unique<Progress>(label, total, "points");
    if (done >= total) (*holder)->finish(what);
    else (*holder)->update(done, what);
  };
}

std::string load_line(const double load[3]) {
  if (load[0] < 0) return "# load average before: unknown\n";
  return fmt::format("# load average before: {:.2f} {:.2f} {:.2f} ({} CPUs online)\n", load[0],
                     load[1], load[2], std::thread::hardware_concurrency());
}

// Before any measurement: the files the run will write. --json and --csv replace only an
// earlier bench output (never the --profile it merges into, or each other); --profile must be
// a hardware profile (or absent).
// `device`: what the run measures, when known before it runs (a CPU run's), for a --profile of
// another device to be refused at once rather than after the sweep.
void check_outputs(const OutputFlags& o, const nlohmann::json& device = {}) {
  check_bench_outputs(o.json_path, o.csv_path, o.profile_path);
  if (o.profile_path.empty()) return;
  const nlohmann::json profile = read_profile_for_merge(o.profile_path);
  if (!device.is_null()) check_profile_device(profile, device, "--profile " + o.profile_path);
}

// What a run on this process's cores measured, as merge_profile_sections names it.
nlohmann::json cpu_device(const Provenance& provenance) {
  return {{"kind", "cpu"}, {"name", provenance.cpu}};
}
nlohmann::json gpu_device(const gpu::GpuInfo& g) { return {{"kind", "gpu"}, {"name", g.name}}; }

// --json and --csv get every result; --profile only results that all checked out (`valid`):
// a wrong product's rate is no figure to plan with.
void write_outputs(const OutputFlags& o, const nlohmann::json& sections, const std::string& csv,
                   const Provenance& provenance, const nlohmann::json& device, bool valid) {
  if (!o.json_path.empty()) {
    nlohmann::json out = sections;
    out["provenance"] = to_json(provenance);
    write_file_atomic(o.json_path, out.dump(2) + "\n");
    std::printf("wrote %s\n", o.json_path.c_str());
  }
  if (!o.csv_path.empty()) {
    write_file_atomic(o.csv_path, csv);
    std::printf("wrote %s\n", o.csv_path.c_str());
  }
  if (!o.profile_path.empty() && !valid)
    std::fprintf(stderr, "not merged into %s: some results are wrong\n", o.profile_path.c_str());
  if (!o.profile_path.empty() && valid) {
    merge_profile_sections(o.profile_path, sections, provenance, device);
    std::string keys;
    for (const auto& [k, v] : sections.items()) keys += (keys.empty() ? "" : ", ") + k;
    std::printf("merged %s into %s\n", keys.c_str(), o.profile_path.c_str());
  }
}

// ---- bench gemm ----

struct GemmFlags {
  OutputFlags out;
  std::string dtype = "fp32,bf16", sizes, tokens, hidden, ffn, experts, offsize, kinds,
      decode_rows;
  std::string offsize_dim = "n";
  int64_t top_k = 2, offsize_base = 0;
  int repeats = 0;
  double peak_clock_ghz = 0;
  int peak_fma_units = 0;
};

// The sweep the flags ask for, from `o`'s defaults.
// A shape flag whose sweeps --kinds leaves out would change nothing: refused, naming them.
void check_flags_have_a_sweep(const CLI::App& cmd, const std::vector<std::string>& kinds) {
  static const std::vector<std::pair<const char*, std::vector<std::string>>> kUses = {
      {"--sizes", {"square"}},
      {"--tokens", {"transformer", "expert"}},
      {"--hidden", {"transformer", "expert", "decode"}},
      {"--ffn", {"transformer", "expert", "decode"}},
      {"--experts", {"expert"}},
      {"--top-k", {"expert"}},
      {"--offsize", {"offsize"}},
      {"--offsize-dim", {"offsize"}},
      {"--offsize-base", {"offsize"}},
      {"--decode-rows", {"decode"}}};
  for (const auto& [flag, uses] : kUses) {
    if (cmd.count(flag) == 0) continue;
    const bool used = std::any_of(uses.begin(), uses.end(), [&](const std::string& k) {
      return std::find(kinds.begin(), kinds.end(), k) != kinds.end();
    });
    if (!used)
      fail(fmt::format("{} shapes the {} sweep{}, and --kinds {} runs {}", flag,
                       fmt::join(uses, "/"), uses.size() == 1 ? "" : "s", fmt::join(kinds, ","),
                       uses.size() == 1 ? "not that one" : "none of them"),
           fmt::format("add {} to --kinds, or drop {}", uses.front(), flag));
  }
}

void apply_gemm_flags(const GemmFlags& f, const CLI::App& cmd, GemmBenchOptions& o) {
  auto given = [&](const char* flag) { return cmd.count(flag) > 0; };
  o.dtypes = parse_dtypes("--dtype", f.dtype);
  if (given("--sizes")) o.square_sizes = parse_int_list("--sizes", f.sizes);
  if (given("--tokens")) o.tokens = parse_int_list("--tokens", f.tokens);
  if (given("--hidden")) o.hidden = parse_int_list("--hidden", f.hidden);
  if (given("--ffn")) o.ffn = parse_int_list("--ffn", f.ffn);
  if (given("--experts")) o.experts = parse_int_list("--experts", f.experts);
  if (given("--top-k")) o.top_k = f.top_k;
  if (given("--offsize"))
    std::tie(o.offsize_from, o.offsize_to) = parse_range("--offsize", f.offsize);
  if (given("--offsize-dim")) o.offsize_dim = f.offsize_dim;
  if (given("--offsize-base")) o.offsize_base = f.offsize_base;
  if (given("--decode-rows")) o.decode_rows = parse_int_list("--decode-rows", f.decode_rows);
  if (given("--repeats")) o.repeats = f.repeats;
  if (given("--kinds")) {
    o.kinds.clear();
    std::stringstream in(f.kinds);
    std::string kind;
    while (std::getline(in, kind, ',')) o.kinds.push_back(kind);
  }
}

void run_bench_gemm_gpu(const GemmFlags& f, const CLI::App& cmd, const DeviceSpec& device) {
  for (const char* flag : {"--peak-clock-ghz", "--peak-fma-units"})
    if (cmd.count(flag) > 0)
      fail(fmt::format("{} is for the CPU's peak estimate, not --device {}", flag, device.name()),
           "drop it: a GPU's peak comes from its SM count and clock");
  GemmBenchOptions o = f.out.quick ? gpu_gemm_quick() : gpu_gemm_defaults();
  apply_gemm_flags(f, cmd, o);
  validate(o);
  check_flags_have_a_sweep(cmd, o.kinds);
  check_outputs(f.out);  // the GPU named once it is open: checked at the merge
  const Provenance provenance = collect_provenance();
  std::printf("%s", format_provenance(provenance, "# ").c_str());
  const gpu::GpuInfo g = open_bench_gpu(device);
  if (gemm_bench_bytes(o) > g.memory_bytes)
    fail(fmt::format("bench gemm: the largest GEMM's operands need {} and {} has {}",
                     format_size(static_cast<double>(gemm_bench_bytes(o))), g.name,
                     format_size(static_cast<double>(g.memory_bytes))),
         "choose smaller shapes (--sizes, --tokens, --hidden, --ffn)");
  const CpuPeak peak = gpu_peak(g);

  auto holder = std::make_shared<std::unique_ptr<Progress>>();
  o.on_progress = progress_callback(holder, "bench gemm (GPU)", f.out.quiet);
  const GemmBenchResult r = run_gpu_gemm_bench(o, g);

  std::printf("%s\n%s", load_line(r.load_average).c_str(), format_gemm_tables(r, peak).c_str());
  const nlohmann::json sections = {{"device", gpu_device_section(g, gpu::visible_gpus())},
                                   {"compute", compute_profile_section(r, peak, provenance)},
                                   {"gemm", gemm_profile_section(r, provenance)}};
  write_outputs(f.out, sections, gemm_csv(r, provenance), provenance, gpu_device(g), r.all_valid);
  if (!r.all_valid)
    fail("some GEMM results are wrong (rows marked WRONG RESULT)",
         "the product disagrees with an exact double-precision reference: a bug in gpu::gemm "
         "or cuBLASLt");
}

void run_bench_gemm(const GemmFlags& f, const CLI::App& cmd) {
  auto given = [&](const char* flag) { return cmd.count(flag) > 0; };
  const DeviceSpec device = parse_device("--device", f.out.device);
  if (device.cuda) return run_bench_gemm_gpu(f, cmd, device);
  GemmBenchOptions o;
  if (f.out.quick) {
    o.square_sizes = {64, 128, 256};
    o.tokens = {256};
    o.hidden = {128};
    o.ffn = {256};
    o.experts = {4};
    o.offsize_from = 120;
    o.offsize_to = 136;
    o.offsize_base = 128;
    o.decode_rows = {1, 16};
    o.repeats = 2;
    o.min_seconds = 0.002;
  }
  apply_gemm_flags(f, cmd, o);
  if (given("--peak-clock-ghz") && !(f.peak_clock_ghz > 0 && f.peak_clock_ghz < 20))
    fail(fmt::format("--peak-clock-ghz {}: must be above 0 and below 20", f.peak_clock_ghz),
         "the cores' sustained clock in GHz under all-core load, e.g. 2.4");
  if (given("--peak-fma-units") && (f.peak_fma_units < 1 || f.peak_fma_units > 8))
    fail(fmt::format("--peak-fma-units {}: must be between 1 and 8", f.peak_fma_units),
         "FMA units per core: 2 on most AVX-512 server cores, 1 on some");
  validate(o);  // before the header, so bad input fails at once
  check_flags_have_a_sweep(cmd, o.kinds);
  check_memory({"bench gemm", {{"operands of the largest GEMM", gemm_bench_bytes(o)}}},
               memory_budget(), "choose smaller shapes (--sizes, --tokens, --hidden, --ffn)");
  check_outputs(f.out, cpu_device(collect_provenance()));
  check_cpus_for_threads("bench gemm", omp_get_max_threads());

  const Provenance provenance = collect_provenance();
  CpuInfo cpu = read_cpu_info();
  if (cpu.max_freq_hz == 0 && !given("--peak-clock-ghz"))
    cpu.measured_clock_hz = measure_clock_hz();
  const int cores = std::min(omp_get_max_threads(), std::max(1, cpu.physical_cores));
  const CpuPeak peak = cpu_peak(cpu, cores, {f.peak_clock_ghz * 1e9, f.peak_fma_units});

  auto holder = std::make_shared<std::unique_ptr<Progress>>();
  o.on_progress = progress_callback(holder, "bench gemm", f.out.quiet);
  const GemmBenchResult r = run_gemm_bench(o);

  std::printf("%s%s\n%s", format_provenance(provenance, "# ").c_str(),
              load_line(r.load_average).c_str(), format_gemm_tables(r, peak).c_str());
  const nlohmann::json sections = {{"compute", compute_profile_section(r, peak, provenance)},
                                   {"gemm", gemm_profile_section(r, provenance)}};
  write_outputs(f.out, sections, gemm_csv(r, provenance), provenance, cpu_device(provenance),
                r.all_valid);
  if (!r.all_valid)
    fail("some GEMM results are wrong (rows marked WRONG RESULT)",
         "the product disagrees with a double-precision reference: a bug in foundry::gemm or "
         "oneDNN; try ONEDNN_MAX_CPU_ISA=AVX2 to narrow it down");
}

// ---- bench membw ----

struct MembwFlags {
  OutputFlags out;
  std::string threads, array_bytes, min_bytes, max_bytes;
  int repeats = 10, points_per_doubling = 2;
  bool no_stream = false, no_working_set = false;
};

// --array-bytes, --min-bytes, --max-bytes, --repeats, --points-per-doubling and the two
// --no-* flags into `o`.
void apply_membw_flags(const MembwFlags& f, const CLI::App& cmd, MembwOptions& o) {
  auto given = [&](const char* flag) { return cmd.count(flag) > 0; };
  if (given("--array-bytes")) o.array_bytes = parse_bytes("--array-bytes", f.array_bytes);
  if (given("--min-bytes")) o.min_bytes = parse_bytes("--min-bytes", f.min_bytes);
  if (given("--max-bytes")) o.max_bytes = parse_bytes("--max-bytes", f.max_bytes);
  if (given("--repeats")) o.repeats = f.repeats;
  if (given("--points-per-doubling")) o.points_per_doubling = f.points_per_doubling;
  o.stream = !f.no_stream;
  o.working_set = !f.no_working_set;
  // A flag of a sweep that is skipped would change nothing.
  for (const char* flag : {"--min-bytes", "--max-bytes", "--points-per-doubling"})
    if (f.no_working_set && given(flag))
      fail(fmt::format("{} shapes the working-set sweep, which --no-working-set skips", flag),
           fmt::format("drop {} or --no-working-set", flag));
  if (f.no_stream && given("--array-bytes"))
    fail("--array-bytes sizes STREAM's arrays, and --no-stream skips STREAM",
         "drop --array-bytes or --no-stream");
}

void run_bench_membw_gpu(const MembwFlags& f, const CLI::App& cmd, const DeviceSpec& device) {
  if (cmd.count("--threads") > 0)
    fail(fmt::format("--threads is for the CPU, not --device {}", device.name()),
         "drop it: the GPU kernels fill every SM");
  MembwOptions o = f.out.quick ? gpu_membw_quick() : MembwOptions{};
  apply_membw_flags(f, cmd, o);
  validate(o);
  check_outputs(f.out);  // the GPU named once it is open: checked at the merge
  const Provenance provenance = collect_provenance();
  std::printf("%s", format_provenance(provenance, "# ").c_str());
  const gpu::GpuInfo g = open_bench_gpu(device);
  if (gpu_membw_bytes(o, g) > g.memory_bytes)
    fail(fmt::format("bench membw: the arrays need {} and {} has {}",
                     format_size(static_cast<double>(gpu_membw_bytes(o, g))), g.name,
                     format_size(static_cast<double>(g.memory_bytes))),
         "lower --array-bytes and --max-bytes");
  if (!f.out.quiet)
    o.on_progress = [](int64_t done, int64_t, const std::string& what) {
      std::fprintf(stderr, "\rbench membw (GPU): point %lld: %s   ", static_cast<long long>(done),
                   what.c_str());
    };
  const MembwResult r = run_gpu_membw_bench(o, g);
  if (!f.out.quiet) std::fprintf(stderr, "\n");

  std::printf("%s\n%s", load_line(r.load_average).c_str(), format_gpu_membw_tables(r, g).c_str());
  const nlohmann::json sections = {{"device", gpu_device_section(g, gpu::visible_gpus())},
                                   {"memory", gpu_memory_section(r, g, provenance)}};
  write_outputs(f.out, sections, membw_csv(r, provenance), provenance, gpu_device(g), r.all_valid);
  if (!r.all_valid)
    fail("GPU memory bandwidth results failed validation (see the notes above)",
         "a kernel wrote wrong values: a bug in src/cuda/stream_kernels.cu, or failing memory");
}

void run_bench_membw(const MembwFlags& f, const CLI::App& cmd) {
  auto given = [&](const char* flag) { return cmd.count(flag) > 0; };
  const DeviceSpec device = parse_device("--device", f.out.device);
  if (device.cuda) return run_bench_membw_gpu(f, cmd, device);
  MembwOptions o;
  if (f.out.quick) {
    o.threads = {std::max(1, omp_get_max_threads())};
    o.array_bytes = 8 << 20;
    o.repeats = 3;
    o.min_bytes = 16 << 10;
    o.max_bytes = 4 << 20;
    o.points_per_doubling = 1;
    o.bytes_per_run = 8 << 20;
  }
  if (given("--threads")) o.threads.clear();  // the given counts, not --quick's as well
  if (given("--threads"))
    for (int64_t t : parse_int_list("--threads", f.threads)) {
      if (t > 4096) fail(fmt::format("--threads {}: at most 4096", t));
      o.threads.push_back(static_cast<int>(t));
    }
  apply_membw_flags(f, cmd, o);
  validate(o);
  check_memory({"bench membw", {{"arrays", membw_bench_bytes(o)}}}, memory_budget(),
               "lower --array-bytes and --max-bytes");
  check_outputs(f.out, cpu_device(collect_provenance()));
  if (o.threads.empty())  // the default: powers of two up to OMP_NUM_THREADS, and it
    check_cpus_for_threads("bench membw", omp_get_max_threads());
  for (int t : o.threads)
    check_cpus_for_threads(fmt::format("bench membw --threads {}", t), t,
                           "give --threads counts up to the CPUs this process may use");

  const Provenance provenance = collect_provenance();
  auto holder = std::make_shared<std::unique_ptr<Progress>>();
  o.on_progress = progress_callback(holder, "bench membw", f.out.quiet);
  const MembwResult r = run_membw_bench(o);

  std::printf("%s%s\n%s", format_provenance(provenance, "# ").c_str(),
              load_line(r.load_average).c_str(), format_membw_tables(r).c_str());
  const nlohmann::json sections = {{"memory", memory_profile_section(r, provenance)}};
  write_outputs(f.out, sections, membw_csv(r, provenance), provenance, cpu_device(provenance),
                r.all_valid);
  if (!r.all_valid)
    fail("memory bandwidth results failed validation (see the notes above)",
         "a kernel wrote wrong values: suspect the build flags or failing memory");
}

// ---- bench attention ----

struct AttentionFlags {
  OutputFlags out;
  std::string seqs;
  int64_t tokens = 16384, heads = 16, kv_heads = 16, head_dim = 128;
};

// One point's efficiencies: the plan's time for the attention products at the profile's GEMM
// rates over the measured time, at most 1 (a kernel faster than the GEMM curve says is capped).
struct AttentionEfficiency {
  AttentionCoreSeconds ideal;
  double forward = 0, backward = 0;
  bool capped = false;  // faster than the GEMM rates say: plan will predict it slower
};

AttentionEfficiency attention_efficiency(const AttentionBenchOptions& o,
                                         const AttentionBenchPoint& p,
                                         const HardwareProfile& profile) {
  AttentionEfficiency e;
  e.ideal = attention_core_seconds(profile, p.batch, p.seq, o.heads, o.kv_heads, o.head_dim,
                                   DType::bf16);
  e.capped = e.ideal.forward > p.forward_s || e.ideal.backward > p.backward_s;
  e.forward = std::clamp(e.ideal.forward / p.forward_s, 1e-3, 1.0);
  e.backward = std::clamp(e.ideal.backward / p.backward_s, 1e-3, 1.0);
  return e;
}

// The sweep the flags ask for, checked before any GPU is opened.
AttentionBenchOptions attention_options(const AttentionFlags& f, const CLI::App& cmd) {
  auto given = [&](const char* flag) { return cmd.count(flag) > 0; };
  AttentionBenchOptions o = f.out.quick ? gpu_attention_quick() : AttentionBenchOptions{};
  if (given("--seq")) o.seqs = parse_int_list("--seq", f.seqs);
  if (given("--tokens")) o.tokens = f.tokens;
  if (given("--heads")) o.heads = f.heads;
  if (given("--kv-heads")) o.kv_heads = f.kv_heads;
  if (given("--head-dim")) o.head_dim = f.head_dim;
  validate(o);
  return o;
}

// The GPU profile at `path` as read (its other sections are merged back) and parsed, refused
// unless it holds a GPU's GEMM rates to measure the kernels against.
std::pair<nlohmann::json, HardwareProfile> gpu_profile_with_gemm_rates(const std::string& path) {
  nlohmann::json doc = read_profile_for_merge(path);
  if (doc.is_null() || !doc.contains("gemm") || !doc.contains("compute"))
    fail(fmt::format("{}: no GEMM rates (its gemm and compute sections) to measure the "
                     "attention kernels against",
                     path),
         "run bench gemm --device cuda --profile " + path + " first");
  if (doc.contains("efficiency") && !doc["efficiency"].is_object())
    fail(fmt::format("{}: its efficiency section is not an object", path),
         "fix or remove it (profiles/README.md, note 5)");
  HardwareProfile profile = parse_profile(doc, path);
  if (profile.kind != "gpu")
    fail(fmt::format("{} is a CPU's profile (device.kind '{}')", path, profile.kind),
         "give the profile bench gemm --device cuda wrote");
  return {std::move(doc), std::move(profile)};
}

// The table on stdout, and the curve, points and CSV rows of a run.
struct AttentionReport {
  nlohmann::json curve = nlohmann::json::array(), points = nlohmann::json::array();
  std::string csv;
};

AttentionReport report_attention(const AttentionBenchResult& r, const HardwareProfile& profile) {
  const AttentionBenchOptions& o = r.options;
  std::printf(
      "# causal attention on tensor cores (bf16 products, fp32 softmax), %lld tokens a "
      "point, %lld heads (%lld KV) of %lld, forward and backward (with its delta pass)\n",
      static_cast<long long>(o.tokens), static_cast<long long>(o.heads),
      static_cast<long long>(o.kv_heads), static_cast<long long>(o.head_dim));
  std::printf("%7s %6s %11s %11s %11s %11s %8s %8s\n", "seq", "batch", "forward ms", "backward ms",
              "fwd TFLOP/s", "bwd TFLOP/s", "fwd eff", "bwd eff");
  AttentionReport out;
  for (const AttentionBenchPoint& p : r.points) {
    const AttentionEfficiency e = attention_efficiency(o, p, profile);
    std::printf("%7lld %6lld %11.3f %11.3f %11.1f %11.1f %7.1f%% %7.1f%%\n",
                static_cast<long long>(p.seq), static_cast<long long>(p.batch), p.forward_s * 1e3,
                p.backward_s * 1e3, e.ideal.forward_flops / p.forward_s / 1e12,
                e.ideal.backward_flops / p.backward_s / 1e12, 100 * e.forward, 100 * e.backward);
    if (e.capped)
      std::printf(
          "note: at seq %lld the kernel ran faster than the profile's GEMM rates for "
          "its products; its efficiency is capped at 100%%, so plan will predict it "
          "slower than measured\n",
          static_cast<long long>(p.seq));
    out.curve.push_back({{"seq", p.seq}, {"forward", e.forward}, {"backward", e.backward}});
    out.points.push_back({{"seq", p.seq},
                          {"batch", p.batch},
                          {"forward_s", p.forward_s},
                          {"backward_s", p.backward_s},
                          {"forward_flops", e.ideal.forward_flops},
                          {"backward_flops", e.ideal.backward_flops},
                          {"forward_efficiency", e.forward},
                          {"backward_efficiency", e.backward}});
    out.csv += fmt::format("{},{},{},{},{},bf16,{:.9g},{:.9g},{:.9g},{:.9g},{:.6f},{:.6f}\n", p.seq,
                           p.batch, o.heads, o.kv_heads, o.head_dim, p.forward_s, p.backward_s,
                           e.ideal.forward_flops, e.ideal.backward_flops, e.forward, e.backward);
  }
  return out;
}

void run_bench_attention(const AttentionFlags& f, const CLI::App& cmd) {
  check_bench_outputs(f.out.json_path, f.out.csv_path, f.out.profile_path);
  const DeviceSpec device = parse_device("--device", f.out.device);
  if (!device.cuda)
    fail("bench attention measures a GPU's attention kernels: give --device cuda",
         "on a CPU, plan prices attention as oneDNN products at bench gemm's rates");
  if (f.out.profile_path.empty())
    fail(
        "bench attention needs --profile: the GPU's profile, whose GEMM rates (bench gemm "
        "--device cuda) turn the kernels' times into its efficiency.attention curve",
        "run bench gemm --device cuda --profile P first, then bench attention --device cuda "
        "--profile P");
  AttentionBenchOptions o = attention_options(f, cmd);
  const auto [doc, profile] = gpu_profile_with_gemm_rates(f.out.profile_path);

  const Provenance provenance = collect_provenance();
  std::printf("%s", format_provenance(provenance, "# ").c_str());
  const gpu::GpuInfo g = open_bench_gpu(device);
  auto holder = std::make_shared<std::unique_ptr<Progress>>();
  o.on_progress = progress_callback(holder, "bench attention (GPU)", f.out.quiet);
  const AttentionReport report = report_attention(run_gpu_attention_bench(o, g), profile);

  // The profile's efficiency section keeps what else it holds (kernel_overhead_s, named
  // kernels' curves); the attention curve is this run's.
  nlohmann::json efficiency = doc.value("efficiency", nlohmann::json::object());
  efficiency["attention"] = report.curve;
  efficiency["attention_source"] = fmt::format(
      "measured: bench attention --device cuda on {} (Foundry's tensor-core kernels, {} tokens a "
      "point, {} heads ({} KV) of {}), {}; efficiency = the products' time at this profile's "
      "GEMM rates / the measured time, at most 1",
      g.name, o.tokens, o.heads, o.kv_heads, o.head_dim, provenance.date);
  const std::string csv = format_provenance(provenance, "# ") +
                          "seq,batch,heads,kv_heads,head_dim,dtype,forward_s,backward_s,"
                          "forward_flops,backward_flops,forward_efficiency,backward_efficiency\n" +
                          report.csv;
  write_outputs(f.out,
                {{"efficiency", efficiency}, {"attention_bench", {{"points", report.points}}}}, csv,
                provenance, gpu_device(g), true);
}

void add_gemm_command(CLI::App& bench) {
  CLI::App* gemm = bench.add_subcommand(
      "gemm", "GEMM GFLOP/s (oneDNN, fp32 and bf16): square, transformer, per-expert and "
              "off-size shapes");
  auto g = std::make_shared<GemmFlags>();
  add_output_flags(gemm, g->out);
  gemm->add_option("--dtype", g->dtype, "Input dtypes: fp32, bf16 or fp32,bf16")
      ->capture_default_str();
  gemm->add_option("--sizes", g->sizes, "Square sizes (default 128,...,4096)")
      ->type_name("N,N,...");
  gemm->add_option("--tokens", g->tokens,
                   "Tokens per step, M of the transformer GEMMs (default 2048)")
      ->type_name("N,...");
  gemm->add_option("--hidden", g->hidden, "Hidden sizes (default 512,1024,2048)")
      ->type_name("N,...");
  gemm->add_option("--ffn", g->ffn, "FFN / expert widths (default 1024,4096)")->type_name("N,...");
  gemm->add_option("--experts", g->experts,
                   "Expert counts: each expert runs tokens·top_k/experts rows (default 8,32)")
      ->type_name("N,...");
  gemm->add_option("--top-k", g->top_k, "Experts per token")->capture_default_str();
  gemm->add_option("--offsize", g->offsize,
                   "Off-size scan range, in steps of 1 (default 1008:1040)")
      ->type_name("FROM:TO");
  gemm->add_option("--offsize-dim", g->offsize_dim, "Dimension the scan moves: m, n or k")
      ->capture_default_str();
  gemm->add_option("--offsize-base", g->offsize_base,
                   "The other two dimensions of the scan (default 1024)");
  gemm->add_option("--decode-rows", g->decode_rows,
                   "Rows of the decode sweep, against weights read from memory (default "
                   "1,4,16,64)")
      ->type_name("N,...");
  gemm->add_option("--kinds", g->kinds,
                   "Which sweeps: square,transformer,expert,offsize,decode (default all)")
      ->type_name("LIST");
  gemm->add_option("--repeats", g->repeats, "Timed runs per shape after the warm-up (default 5)");
  gemm->add_option("--peak-clock-ghz", g->peak_clock_ghz,
                   "Clock for the peak estimate (default: cpufreq max, else measured)");
  gemm->add_option("--peak-fma-units", g->peak_fma_units,
                   "FMA units per core for the peak estimate (default: by CPU family)");
  gemm->callback([g, gemm] { run_bench_gemm(*g, *gemm); });
}

void add_membw_command(CLI::App& bench) {
  CLI::App* membw = bench.add_subcommand(
      "membw", "Memory bandwidth: STREAM copy/scale/add/triad and a working-set sweep through "
               "the caches");
  auto m = std::make_shared<MembwFlags>();
  add_output_flags(membw, m->out);
  membw->add_option("--threads", m->threads,
                    "STREAM thread counts (default: powers of two up to all, and all); the "
                    "working-set sweep uses the largest")
      ->type_name("N,...");
  membw->add_option("--array-bytes", m->array_bytes,
                    "Bytes per STREAM array (default 4× the last-level cache, ≥ 64M)")
      ->type_name("SIZE");
  membw->add_option("--repeats", m->repeats,
                    "Runs per STREAM kernel, the first not counted; the working-set sweep makes "
                    "repeats - 1 passes")
      ->capture_default_str();
  membw->add_option("--min-bytes", m->min_bytes,
                    "Smallest working set (default a quarter of L1)")->type_name("SIZE");
  membw->add_option("--max-bytes", m->max_bytes,
                    "Largest working set (default 8× the last-level cache)")->type_name("SIZE");
  membw->add_option("--points-per-doubling", m->points_per_doubling,
                    "Working-set sizes per factor of 2")->capture_default_str();
  membw->add_flag("--no-stream", m->no_stream, "Skip STREAM");
  membw->add_flag("--no-working-set", m->no_working_set, "Skip the working-set sweep");
  membw->callback([m, membw] { run_bench_membw(*m, *membw); });
}

void add_attention_command(CLI::App& bench) {
  CLI::App* attention = bench.add_subcommand(
      "attention", "A GPU's causal attention kernels, forward and backward, over sequence "
                   "lengths: the profile's efficiency.attention curve that plan reads");
  auto a = std::make_shared<AttentionFlags>();
  add_output_flags(attention, a->out);
  attention->add_option("--seq", a->seqs, "Sequence lengths (default 512,...,8192)")
      ->type_name("N,...");
  attention->add_option("--tokens", a->tokens, "Tokens a point: batch = tokens / seq")
      ->capture_default_str();
  attention->add_option("--heads", a->heads, "Query heads")->capture_default_str();
  attention->add_option("--kv-heads", a->kv_heads, "KV heads")->capture_default_str();
  attention->add_option("--head-dim", a->head_dim, "Head dimension")->capture_default_str();
  attention->callback([a, attention] { run_bench_attention(*a, *attention); });
}

}  // namespace

void register_bench_gemm_commands(CLI::App& bench) {
  add_gemm_command(bench);
  add_membw_command(bench);
  add_attention_command(bench);
}

}  // namespace foundry::cli
