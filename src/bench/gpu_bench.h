// `foundry bench gemm --device cuda` and `bench membw --device cuda`: the GPU's GEMM rates
// through cuBLASLt (gpu::gemm, the path GPU training uses) over the same sweep as the CPU's
// (gemm_bench.h), and its memory bandwidth by STREAM's conventions plus a pure read and a
// pure write, with a working-set sweep through the L2. Results come back in the CPU
// benchmarks' structs, so that the profile sections, CSV and plan read them unchanged; the
// profile's "device" section says it is a GPU.
//
// GEMM operands are random multiples of 1/8 in [-1, 1]: exact in bf16, and every partial sum
// of a product is exact in fp32, so the check against a double reference is exact (a bf16
// product that is off by one rounding fails). Timing: CUDA events around batches of calls
// of at least 1 ms, the minimum per call over every batch of every pass.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/cpu_peak.h"
#include "bench/gemm_bench.h"
#include "bench/membw_bench.h"
#include "bench/provenance.h"
#include "cuda/runtime.h"

namespace foundry {

// The sweep's defaults at a GPU's scale: squares to 8192, 16,384 tokens a step, hidden 2048
// and 4096, FFN 2048 to 8192, 16 and 64 experts, decode rows to 256.
GemmBenchOptions gpu_gemm_defaults();
// A sweep that finishes in seconds (--quick).
GemmBenchOptions gpu_gemm_quick();

GemmBenchResult run_gpu_gemm_bench(const GemmBenchOptions& options, const gpu::GpuInfo& gpu);

// The tensor-core (bf16) and CUDA-core (fp32) peaks: SMs × clock × FLOP per cycle per SM,
// for the architectures whose rates are published (sm_80, sm_90, sm_100); 0 otherwise.
CpuPeak gpu_peak(const gpu::GpuInfo& gpu);

// Arrays of 1 GiB per STREAM array (at least 8× the L2) and a working-set sweep from 1 MiB
// to 8× the L2, unless the options say otherwise. options.threads is ignored.
MembwResult run_gpu_membw_bench(const MembwOptions& options, const gpu::GpuInfo& gpu);
MembwOptions gpu_membw_quick();
// The bytes of device memory run_gpu_membw_bench holds at once.
int64_t gpu_membw_bytes(const MembwOptions& options, const gpu::GpuInfo& gpu);

// `foundry bench attention --device cuda`: Foundry's own causal attention kernels on tensor
// cores (bf16 training runs them; ops.h) forward and backward at each sequence length, B =
// tokens / seq sequences of `heads` query heads (kv_heads KV heads) of head_dim (32, 64 or
// 128), on fp32 tensors of random multiples of 1/8. Times: CUDA events around batches of calls lasting at least
// min_seconds, the fastest batch of three. The plan's efficiency.attention curve comes from
// these (cli/bench_gemm_cmd.cpp), which is why they time the kernels training runs.
struct AttentionBenchOptions {
  std::vector<int64_t> seqs = {512, 1024, 2048, 4096, 8192};
  int64_t tokens = 16384, heads = 16, kv_heads = 16, head_dim = 128;
  double min_seconds = 0.05;
  std::function<void(int64_t, int64_t, const std::string&)> on_progress;
};
struct AttentionBenchPoint {
  int64_t seq = 0, batch = 0;
  double forward_s = 0, backward_s = 0;  // one call each (the backward with its Δ pass)
};
struct AttentionBenchResult {
  AttentionBenchOptions options;
  std::vector<AttentionBenchPoint> points;
};
AttentionBenchOptions gpu_attention_quick();  // 1024 and 2048 at 16,384 tokens
// Throws (naming the flag) when the options cannot run: no sequence lengths, a length or
// count below 1, kv_heads not dividing heads, a head_dim the tensor-core kernels do not take,
// more sequences × heads than a launch's grid holds. Needs no GPU.
void validate(const AttentionBenchOptions& options);
// The device bytes the largest point holds at once.
int64_t attention_bench_bytes(const AttentionBenchOptions& options);
AttentionBenchResult run_gpu_attention_bench(const AttentionBenchOptions& options,
                                             const gpu::GpuInfo& gpu);

// The profile's "device" section for this GPU: kind "gpu", its memory, name and
// architecture, and how many GPUs this node shows (devices_per_node).
nlohmann::json gpu_device_section(const gpu::GpuInfo& gpu, int visible);
// The "memory" section with the GPU's spec bandwidth (2 · memory clock · bus width).
nlohmann::json gpu_memory_section(const MembwResult& r, const gpu::GpuInfo& gpu,
                                  const Provenance& provenance);
// One-line description: "NVIDIA H200 (sm_90, 132 SMs at 1.98 GHz, 139.8 GiB, L2 60 MiB)".
std::string describe_gpu(const gpu::GpuInfo& gpu);
// Human tables of a GPU membw run (STREAM, then the working-set curve with the L2 marked).
std::string format_gpu_membw_tables(const MembwResult& r, const gpu::GpuInfo& gpu);

}  // namespace foundry
