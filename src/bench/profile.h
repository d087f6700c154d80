// A hardware profile: what one device of a machine can do, measured by `foundry bench` or
// taken from published figures (profiles/*.json). `foundry plan` reads it to predict step
// times. The JSON schema is in docs/formats.md ("Hardware profile"); every number carries
// its provenance (a measurement's command line and machine, or a cited source).
//
// The performance questions the planner asks of a profile:
//   gemm_rate(dtype, m, n, k)  FLOP/s of C[m,n] = A[m,k]·B[k,n]
//   memory_bandwidth()         bytes/s of a streaming kernel over all cores of one device
//   collective_time(op, ranks, bytes)  seconds of one collective (t = α + S/β)
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/config_reader.h"
#include "kernels/gemm.h"

namespace foundry {

struct GemmPoint {
  DType dtype = DType::bf16;
  int64_t m = 0, n = 0, k = 0;
  double flops_per_s = 0;
  std::string kind;  // "square" | "transformer" | "expert" | "offsize"
};

// How a GEMM's rate falls when its inner dimensions are not multiples of `multiple`:
// factor 1 for the largest multiple, less for smaller ones (see gemm_rate).
struct AlignmentFactor {
  int64_t multiple = 1;
  double factor = 1.0;
};

struct CollectiveFit {
  std::string op;         // all_reduce | reduce_scatter | all_gather | broadcast | all_to_all
  int64_t ranks = 0;
  std::string algorithm;  // "default" or a named algorithm
  std::string scope;      // "", "intra-node" or "inter-node" (reference profiles)
  double alpha_s = 0;            // latency
  double beta_bytes_per_s = 0;   // algorithm bandwidth, S as in nccl-tests' algbw
  double max_bytes = 0;          // the largest message measured (0 = unknown)
};

struct PeakCompute {
  double spec_flops_per_s = 0;      // theoretical (0 = unknown)
  double measured_flops_per_s = 0;  // best GEMM rate
};

struct HardwareProfile {
  std::string path;         // where it was read from
  std::string name;
  std::string kind = "cpu";  // "cpu" | "gpu"
  int64_t memory_bytes = 0;  // per device (0 = unknown)
  int64_t devices_per_node = 1;
  PeakCompute bf16, fp32;
  double memory_spec_bytes_per_s = 0;
  double memory_measured_bytes_per_s = 0;
  std::vector<GemmPoint> gemm_points;             // measured GEMMs (kind != "offsize")
  std::vector<AlignmentFactor> alignment;         // largest multiple first
  double gemm_half_efficiency_flops = 0;          // saturation model (0 = use points)
  // Experts' GEMMs run as one grouped GEMM (GPU MoE kernels); false: one GEMM per expert,
  // as Foundry's CPU path does.
  bool grouped_expert_gemms = false;
  std::vector<CollectiveFit> collectives;
  double storage_iops_budget = 0;                 // 0 = unknown
  int64_t storage_page_bytes = 4096;
  json raw;  // the whole document, for sections only the report reads

  const PeakCompute& peak(DType dtype) const { return dtype == DType::bf16 ? bf16 : fp32; }
  // The best achievable GEMM rate: measured if known, else the spec peak.
  double max_gemm_rate(DType dtype) const;
  // Predicted FLOP/s of a GEMM. With measured points: the efficiency of the nearest measured
  // shapes (inverse-distance weighting in log m, log n, log k over the 4 nearest points of
  // the dtype), times the best rate; with the saturation model: best · W/(W + W½) for
  // W = 2mnk. Either way times the alignment factor of min(align(n), align(k)), where
  // align(x) is the largest listed multiple that divides x. Capped by the roofline: the
  // FLOPs over the operands' bytes (A, B in the input type, C in fp32) times the memory
  // bandwidth.
  // `roofline` false: for fused kernels whose output never reaches memory (flash attention).
  // Decode points (kind "decode", weights read from memory) are left out: they answer
  // decode_gemm_rate.
  double gemm_rate(DType dtype, int64_t m, int64_t n, int64_t k, bool roofline = true) const;
  // FLOP/s of a decode GEMM (few rows, weights read from memory) by the same weighting over
  // the profile's decode points of the dtype; 0 when it has none.
  double decode_gemm_rate(DType dtype, int64_t m, int64_t n, int64_t k) const;
  double alignment_factor(int64_t n, int64_t k) const;
  double memory_bandwidth() const;  // measured if known, else spec
  // Fails, naming the profile and `use`, when it has no memory bandwidth: the planner prices
  // the optimizer, elementwise kernels and small products by it.
  void require_memory_bandwidth(const std::string& use) const;
  // The fit for `op` at the largest profiled rank count <= ranks (or the smallest above it
  // when none is below). Fails, naming the profile, when the op has no entry.
  const CollectiveFit& collective(const std::string& op, int64_t ranks) const;
  // Seconds for a collective over `bytes` (S in the nccl-tests convention) among `ranks`.
  // 0 for a single rank. The fit's β at its own rank count is rescaled to `ranks` by the
  // busbw factor (bus bandwidth is what stays constant across rank counts).
  double collective_time(const std::string& op, int64_t ranks, double bytes) const;
  // The fits collective_time() was asked about for messages more than twice the largest they
  // measured (fit.max_bytes), each with the largest such message: predictions that stretch a
  // fit, said by notes_on_extrapolation() ("" when none; in a search, over every shape tried).
  // Recorded as the planner asks, hence mutable. (Multi-node groups price their fits
  // elsewhere: plan's group_collective_s.)
  std::string notes_on_extrapolation() const;
  // (op, the fit's ranks) → (the largest message asked about, the largest measured)
  mutable std::map<std::pair<std::string, int64_t>, std::pair<double, double>> beyond_measured;
};

// nccl-tests bus-bandwidth factor: busbw = algbw · factor.
double busbw_factor(const std::string& op, int64_t ranks);

// Reads and validates a profile. `spec` is a path, or a bare name ("mi300x") looked up as
// profiles/<name>.json next to the working directory or the foundry binary's source tree.
// Errors name the file and the key, and list the profiles available.
HardwareProfile load_profile(const std::string& spec);
HardwareProfile parse_profile(const json& doc, const std::string& where);

inline constexpr char kHardwareProfileFormat[] = "foundry-hardware-profile";  // its "format"

// What every `foundry bench` output starts with: a JSON object with "provenance" (other than a
// hardware profile, which merges many runs and is never replaced whole), or text whose first
// line is the provenance header's "# date: ". What --json, --csv and --out may replace.
bool is_bench_output(const std::string& contents);

// The directories searched for named profiles, in order.
std::vector<std::string> profile_search_dirs();

}  // namespace foundry
