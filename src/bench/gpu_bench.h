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
