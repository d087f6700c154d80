// GEMM throughput through foundry::gemm (oneDNN, the path training uses), fp32 and bf16.
//
// The sweep: square sizes; the shapes a transformer layer runs (tokens × hidden → hidden,
// tokens × hidden → 2·FFN, tokens × FFN → hidden, and the weight gradient whose inner
// dimension is the token count); the same per expert, with tokens·top_k/experts rows; and an
// off-size scan that moves one dimension in steps of 1 around an aligned size, so that the cost
// of widths that are not multiples of 16/32/64 shows; and decoding's products, a few rows
// against weights read from memory (a decode step reads every weight once, and all of them
// do not fit in the caches): those calls cycle through copies of B that together exceed the
// last-level cache twice.
//
// Each point: one warm-up call (creates and JIT-compiles the oneDNN primitive), then
// `repeats` timed runs, each of enough calls to last min_seconds, spread over as many passes
// of the whole sweep; seconds is the minimum time per call over every timed sample (one call,
// or a batch of ≥ 50 µs for tiny shapes), which is robust to preemption on a shared machine.
// GFLOP/s = 2·M·N·K / seconds / 1e9; efficiency is the rate over the best rate
// of the same dtype in this run (the "maximum achievable matmul FLOP/s"). Results are checked
// against a double-precision reference on sampled entries.
//
// The library does not print: results come back as structs, and the formatters return text.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/cpu_peak.h"
#include "bench/provenance.h"
#include "kernels/gemm.h"

namespace foundry {

// One product C[M,N] = op(A)[M,K] · op(B)[K,N].
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  std::string kind;   // "square", "transformer", "expert", "offsize", "decode"
  std::string label;  // free text, e.g. "tokens x hidden -> 2*ffn (gate|up fwd)"
  bool trans_a = false, trans_b = false;  // storage, as in foundry::gemm
  bool cold_b = false;  // B read from memory (decode), not from the caches
};

// Bytes of the copies of B a cold-weights shape cycles through: 2× the last-level cache
// (sysconf), at least 64 MiB.
int64_t cold_weight_bytes();

struct GemmBenchOptions {
  std::vector<DType> dtypes = {DType::f32, DType::bf16};
  std::vector<int64_t> square_sizes = {128, 256, 512, 1024, 1536, 2048, 3072, 4096};
  std::vector<int64_t> tokens = {2048};       // rows per step: batch × sequence
  std::vector<int64_t> hidden = {512, 1024, 2048};
  std::vector<int64_t> ffn = {1024, 4096};    // FFN (expert) width
  std::vector<int64_t> experts = {8, 32};     // expert counts for the per-expert shapes
  int64_t top_k = 2;
  // Off-size scan: `offsize_dim` ("m", "n" or "k") runs from offsize_from to offsize_to in
  // steps of 1; the other two dimensions are offsize_base.
  std::string offsize_dim = "n";
  int64_t offsize_from = 1008, offsize_to = 1040, offsize_base = 1024;
  // Decode: rows (sequences decoded together, or an expert's share of them) against the
  // hidden and FFN widths' projections, weights cold.
  std::vector<int64_t> decode_rows = {1, 4, 16, 64};
  std::vector<std::string> kinds = {"square", "transformer", "expert", "offsize", "decode"};
  int repeats = 5;
  double min_seconds = 0.01;  // per timed run; fast shapes loop inside it
  // Called after each point: done, total, what was measured.
  std::function<void(int64_t, int64_t, const std::string&)> on_progress;
};

// Throws foundry::Error naming the flag (--dtype, --sizes, --tokens, --hidden, --ffn,
// --experts, --top-k, --offsize, --offsize-dim, --offsize-base, --decode-rows, --kinds,
// --repeats) when a value is out of range.
void validate(const GemmBenchOptions& o);

// The operands of the largest GEMM of the sweep (fp32 A, B, C and the bf16 copies of A and
// B): the most the benchmark holds at once.
int64_t gemm_bench_bytes(const GemmBenchOptions& o);

// Rows each expert gets when tokens are spread evenly: round(tokens·top_k/experts), ≥ 1.
int64_t expert_tokens(int64_t tokens, int64_t top_k, int64_t experts);
// The shapes of one dtype's sweep, in order, without duplicates within a kind.
std::vector<GemmShape> gemm_sweep(const GemmBenchOptions& o);

double gemm_flops(int64_t m, int64_t n, int64_t k);                  // 2·M·N·K
double gemm_rate(int64_t m, int64_t n, int64_t k, double seconds);   // FLOP/s

struct GemmMeasurement {
  DType dtype = DType::f32;
  GemmShape shape;
  double seconds = 0;        // minimum time per call
  double flops_per_s = 0;
  double efficiency = 0;     // flops_per_s / best of the dtype
  int64_t calls_per_run = 0;  // timed calls per run
  bool valid = false;        // sampled entries match the reference
};

struct GemmBenchResult {
  std::vector<GemmMeasurement> points;
  double best_fp32 = 0, best_bf16 = 0;  // FLOP/s; 0 when the dtype was not run
  bool all_valid = true;
  int repeats = 0;
  double load_average[3] = {0, 0, 0};   // before the run
  double best(DType t) const { return t == DType::bf16 ? best_bf16 : best_fp32; }
};

// Fills best_* and every point's efficiency from the points' rates.
void compute_efficiencies(GemmBenchResult& r);

GemmBenchResult run_gemm_bench(const GemmBenchOptions& options);

// How one timed run of a shape is cut into samples: each sample times calls_per_sample calls
// back to back; a run is samples_per_run samples, and its time is the best sample's per call.
struct SamplingPlan {
  int64_t calls_per_sample = 1;
  int64_t samples_per_run = 1;
};

// One product of a sweep on some device, with its operands (made fresh for each pass).
class TimedGemm {
 public:
  virtual ~TimedGemm() = default;
  // Warms up (the first call creates the primitive or plan) and sizes the samples.
  virtual SamplingPlan plan_sampling(double min_seconds) = 0;
  // One timed run: the best seconds per call over its samples.
  virtual double timed_run(const SamplingPlan& plan) = 0;
  // The result against a double-precision reference on sampled entries.
  virtual bool check() const = 0;
};
using MakeTimedGemm =
    std::function<std::unique_ptr<TimedGemm>(DType, const GemmShape&, size_t case_index)>;

// The sweep of `options` (every dtype × shape) as repeated passes over the whole list, so that
// a shape's runs are spread over the run's duration and one busy moment does not spoil all of
// them: the sampling plan is made in the first pass and kept; each point keeps its fastest
// run; the last pass checks the results. run_gemm_bench is this with the CPU's products.
GemmBenchResult run_gemm_passes(const GemmBenchOptions& options, const MakeTimedGemm& make);

// Times one product (warm-up, calibration, `repeats` runs back to back) and checks it. For
// tests and for callers that want a single shape.
GemmMeasurement measure_gemm(DType dtype, const GemmShape& shape, int repeats, double min_seconds);

// "fp32,bf16" -> {f32, bf16}; throws naming `flag` for anything else (fp16, ...).
std::vector<DType> parse_dtypes(const std::string& flag, const std::string& text);
// "128,256,1024" -> {128, 256, 1024}; throws naming `flag` for non-integers or values < 1.
std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text);
// "1000:1040" -> {1000, 1040}; throws naming `flag`.
std::pair<int64_t, int64_t> parse_range(const std::string& flag, const std::string& text);

// The profile's "gemm" section and "compute" section (spec peak and measured best per dtype).
nlohmann::json gemm_profile_section(const GemmBenchResult& r, const Provenance& provenance);
nlohmann::json compute_profile_section(const GemmBenchResult& r, const CpuPeak& peak,
                                       const Provenance& provenance);
// CSV with a provenance header, one row per point.
std::string gemm_csv(const GemmBenchResult& r, const Provenance& provenance);
// Human tables: peak estimate and measured best per dtype, then one table per kind.
std::string format_gemm_tables(const GemmBenchResult& r, const CpuPeak& peak);

// Merges `sections` (e.g. {"compute": ..., "gemm": ...}) into the hardware profile at `path`,
// keeping every other section; creates the file with the format header when absent. Written
// with write_file_atomic. Throws if the file exists but is not a hardware profile, or if it
// describes another device than `device` ({"kind": "cpu"|"gpu", "name": ...}, what was
// measured): one profile's figures are one device's. What this run did not measure stays:
// compute's dtypes without a measured rate, gemm points of the (dtype, kind) pairs not run, a
// memory section's bandwidth when this run measured none (working-set sweep only).
void merge_profile_sections(const std::string& path, const nlohmann::json& sections,
                            const Provenance& provenance, const nlohmann::json& device);
// Fails unless the hardware profile `profile` (read from `path`) describes the device that
// is measured, {"kind": "cpu"|"gpu", "name": ...} (without a name: the kind alone is checked);
// a profile without a device section takes any.
void check_profile_device(const nlohmann::json& profile, const nlohmann::json& device,
                          const std::string& path);
// The profile section `key` after a run that measured `fresh`, from the profile's `old` one
// (merge_profile_sections' rules).
nlohmann::json merged_profile_section(const std::string& key, const nlohmann::json& old,
                                      const nlohmann::json& fresh);
// The profile at `path` (null when absent), or the error merge_profile_sections would give:
// call it before a long run so that a wrong --profile fails at once.
nlohmann::json read_profile_for_merge(const std::string& path);

}  // namespace foundry
