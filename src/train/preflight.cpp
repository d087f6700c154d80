#include "train/preflight.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/format.h"
#include "base/slab_chunks.h"
#include "comm/agree.h"
#include "comm/comm.h"
#include "cuda/nccl.h"
#include "model/expert_parallel.h"
#include "model/info.h"
#include "model/params.h"
#include "optim/device_optimizer.h"
#include "optim/zero1_layout.h"
#include "train/processes.h"

namespace foundry {
namespace {

// What the estimate leaves out (oneDNN's scratch and bf16 conversions, MPI's buffers and
// shared-memory segments, the gradient reducer's buckets, the allocator's overhead) as a
// fixed part and a share of what it counts. Peak RSS above the RSS at this check, against
// the estimate, in training runs of 2 steps with a final checkpoint (one process with 2
// threads, or 2 ranks with 1 thread each):
//   tiny model, 1 process, fp32                    1.9 MB estimated, 11 MB uncounted
//   58 M parameters, 1 process, bf16, 4 × 128      1877 MB, 37 MB uncounted (2.0 %)
//   the same, 16 × 256                             2995 MB, 103 MB (3.4 %)
//   the same, fp32 and Muon                        2222 MB, 420 MB over (AdamW's pages of
//                                                  the Muon tensors are never touched)
//   the same, 2 ranks, ZeRO-1, 8 × 128 (each)      1416 MB, 161 MB (11.4 %)
//   the same with expert parallel 2 (each)         1214 MB, 119 MB (9.8 %)
// 128 MiB + 10 % covers every one of them with room for more threads (oneDNN's scratch
// grows with them). eval and generate, which allocate less of the same kinds, take the same.
constexpr int64_t kRuntimeBytes = int64_t{128} << 20;
constexpr double kUncountedShare = 0.10;
// On a GPU the estimate leaves out less: an H200 held 0.46 GiB (gpu-moe-bench, 0.8 % of the
// estimate) and 0.85 GiB (gpu-zaya-bench, 1.6 %) above model info's figures at the end of 12
// steps, the CUDA context (about 0.5 GiB) included. The check runs with the context already
// out of the free memory, so what it must still cover is at most about 0.35 GiB (0.7 %):
// 256 MiB + 2 % covers both with room.
constexpr int64_t kGpuRuntimeBytes = int64_t{256} << 20;
constexpr double kGpuUncountedShare = 0.02;

void add_margin(MemoryNeed& need) {
  const double counted = static_cast<double>(need.per_process());
  need.parts.emplace_back("margin",
                          kRuntimeBytes + static_cast<int64_t>(kUncountedShare * counted));
}

// The largest v in [lo, hi] with fits(v), for fits true up to some value and false above;
// 0 when there is none.
int64_t largest_fitting(int64_t lo, int64_t hi, const std::function<bool(int64_t)>& fits) {
  if (hi < lo || !fits(lo)) return 0;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// "the largest train.batch_size that fits is N …" for the largest global batch below
// train.batch_size that `fits` (a global batch over `ranks` ranks); "" when none does.
std::string smaller_batch_hint(const RunConfig& rc, int ranks,
                               const std::function<bool(int64_t)>& fits) {
  const TrainConfig& tc = rc.train;
  const int64_t groups = std::max<int64_t>(1, ranks / tc.context_parallel);
  const int64_t per_group = largest_fitting(1, tc.batch_size / groups - 1,
                                            [&](int64_t b) { return fits(b * groups); });
  if (per_group == 0) return "";
  return fmt::format("the largest train.batch_size that fits is {} (--set train.batch_size={}), "
                     "or shorten train.seq_len",
                     per_group * groups, per_group * groups);
}

// "set train.micro_batch_size = M …" for the largest micro-batch below the one a rank runs now
// that divides its share of the batch and `fits` (the config with it); "" when none does. The
// batch, and so the run's trajectory, stays.
std::string micro_batch_hint(const RunConfig& rc, int ranks,
                             const std::function<bool(const RunConfig&)>& fits) {
  const int64_t groups = std::max<int64_t>(1, ranks / rc.train.context_parallel);
  const int64_t share = rc.train.batch_size / groups;
  RunConfig smaller = rc;
  for (int64_t m = micro_batch_rows(rc.train, share) - 1; m >= 1; --m) {
    if (share % m != 0) continue;
    smaller.train.micro_batch_size = m;
    if (fits(smaller))
      return fmt::format(
          "set train.micro_batch_size = {} (--set train.micro_batch_size={}): each "
          "rank runs its {} sequences of the batch {} at a time and accumulates "
          "their gradients, the batch unchanged",
          m, m, share, m);
  }
  return "";
}

// "even train.batch_size = G does not fit: shorten train.seq_len", G the smallest batch.
std::string no_batch_fits(const RunConfig& rc, int ranks) {
  return fmt::format("even train.batch_size = {} does not fit: shorten train.seq_len",
                     std::max<int64_t>(1, ranks / rc.train.context_parallel));
}

std::string training_hint(const RunConfig& rc, int ranks, int processes,
                          const MemoryBudget& budget) {
  const TrainConfig& tc = rc.train;
  const std::string micro = micro_batch_hint(rc, ranks, [&](const RunConfig& r) {
    MemoryNeed need = training_memory_need(r, r.train.batch_size, ranks);
    need.processes = processes;
    return fits(need, budget);
  });
  if (!micro.empty()) return micro;
  const std::string smaller = smaller_batch_hint(rc, ranks, [&](int64_t batch) {
    MemoryNeed need = training_memory_need(rc, batch, ranks);
    need.processes = processes;
    return fits(need, budget);
  });
  if (!smaller.empty()) return smaller;
  std::string hint = no_batch_fits(rc, ranks);
  if (ranks > 1 && ranks % (2 * tc.context_parallel) == 0)
    hint += fmt::format(", split each sequence over more ranks with train.context_parallel = {}",
                        2 * tc.context_parallel);
  if (ranks > 1 && !tc.zero1) hint += ", shard the optimizer state with train.zero1=true";
  if (ranks > 1 && tc.zero1 && rc.model.n_experts > 1 && tc.expert_parallel == 1)
    hint += ", shard the experts with train.expert_parallel (it must divide the ranks and "
            "model.n_experts)";
  return hint + ", spread the run over more hosts (ZeRO-1 shards the optimizer state over the "
                "ranks), or train a smaller model";
}

// Weights as loaded for inference (fp32 and, for bf16 GEMMs, their bf16 copies), then `what`.
MemoryNeed inference_need(const char* command, const RunConfig& rc, const char* what,
                          int64_t bytes) {
  const MemoryEstimate m = estimate_memory(rc.model, 1, 1, rc.train.precision);
  MemoryNeed need{command,
                  {{"weights", m.weights_fp32_bytes + m.weights_bf16_bytes}, {what, bytes}}};
  add_margin(need);
  return need;
}

MemoryNeed eval_need(const RunConfig& rc, int64_t batch) {
  const MemoryEstimate m = estimate_memory(rc.model, batch, rc.train.seq_len, rc.train.precision);
  return inference_need("eval", rc, "activations", m.activations_bytes);
}

}  // namespace

int64_t rank_checkpoint_bytes(const RunConfig& rc, int ranks) {
  const TrainConfig& tc = rc.train;
  const bool muon = tc.optimizer == OptimizerKind::muon;
  if (ranks > 1 && tc.zero1) {
    const Zero1RankMemory peak = zero1_memory(Zero1Layout(ParamTable(rc.model), ranks, muon)).peak;
    return 4 * peak.shard_elements + peak.adamw_state_bytes + peak.muon_momentum_bytes;
  }
  const MemoryEstimate m = estimate_memory(rc.model, 1, 1, tc.precision, muon);
  return m.weights_fp32_bytes + m.optimizer_bytes;
}

MemoryNeed training_memory_need(const RunConfig& rc, int64_t batch_size, int ranks) {
  const TrainConfig& tc = rc.train;
  const bool muon = tc.optimizer == OptimizerKind::muon, bf16 = tc.precision == DType::bf16;
  // Context-parallel groups share their sequences: a rank holds batch / (ranks / C) sequences'
  // worth of chunks.
  const int64_t groups = std::max<int64_t>(1, ranks / tc.context_parallel);
  // The activations are one micro-batch's (train.micro_batch_size).
  const int64_t share = std::max<int64_t>(1, batch_size / groups);
  const MemoryEstimate m = estimate_memory(rc.model, micro_batch_rows(tc, share), tc.seq_len,
                                           tc.precision, muon, tc.context_parallel);
  // Elements of the fp32 weight and gradient slabs this rank stores (the whole table unless
  // expert parallelism releases other ranks' experts), and its optimizer state and snapshot.
  int64_t weights = m.weights_fp32_bytes / 4, grads = weights;
  int64_t optimizer = m.optimizer_bytes;
  const int64_t snapshot = rank_checkpoint_bytes(rc, ranks);
  if (ranks > 1 && tc.zero1) {
    const ParamTable table(rc.model);
    const Zero1Layout layout(table, ranks, muon);
    const Zero1RankMemory peak = zero1_memory(layout).peak;
    optimizer = peak.total_bytes();
    const int ep = static_cast<int>(tc.expert_parallel);
    // A layout that does not divide fails later with its own error; until then, count it whole.
    if (ep > 1 && ranks % ep == 0 && rc.model.n_experts % ep == 0) {
      const ExpertStorageReport s =
          expert_storage(table, layout, ExpertSharding(rc.model.n_experts, ep));
      weights = s.weight_elements;
      grads = s.gradient_elements;
    }
  }
  MemoryNeed need{"training",
                  {{"weights", 4 * weights + (bf16 ? 2 * grads : 0)},
                   {"gradients", 4 * grads},
                   {"optimizer", optimizer},
                   {"activations", m.activations_bytes + m.backward_buffers_bytes}}};
  if (tc.checkpoint_async) need.parts.emplace_back("checkpoint snapshot", snapshot);
  // RAM-backed files count against the same memory: the two copies the tier keeps.
  if (tc.memory_checkpoint_every > 0)
    need.parts.emplace_back("in-memory checkpoints", 2 * snapshot);
  add_margin(need);
  return need;
}

void check_training_memory(const RunConfig& rc, const Processes& procs,
                           const MemoryBudget& budget) {
  const MemoryNeed need = training_memory_need(rc, rc.train.batch_size, procs.ranks());
  const auto hint = [&](const MemoryNeed& failing, const MemoryBudget& theirs) {
    return training_hint(rc, procs.ranks(), failing.processes, theirs);
  };
  if (procs.world())
    check_memory_on_every_host(*procs.world(), need, budget, hint);
  else if (!fits(need, budget))
    fail(memory_shortfall(need, budget), memory_hint(hint(need, budget)));
}

namespace {
// The GPU's allocation granularity on the GPUs this was written for (device slabs' chunks).
constexpr int64_t kGpuGranularity = int64_t{2} << 20;

// The device memory of a slab of `elements` × `element` bytes with element-range holes
// (device_allocate_slab): its chunks, less those wholly inside the holes, plus the one alias
// chunk that stands in for those.
int64_t gpu_slab_bytes(int64_t elements, const SlabRanges& holes, int64_t element) {
  const int64_t bytes = elements * element;
  const int64_t free = slab_bytes_in_holes(to_byte_ranges(holes, element), bytes, kGpuGranularity);
  return bytes - free + (free > 0 ? slab_chunk_bytes(bytes, kGpuGranularity) : 0);
}

// The device optimizer's state slabs over `range` of the parameter slab (optim/
// device_optimizer.cpp): AdamW's two moments, kept over the tensors AdamW updates, and Muon's
// momentum, kept over its matrices; each slab's other ranges are holes. A small tensor between
// two Muon matrices (a norm, the router) still takes a whole chunk of each AdamW slab.
int64_t gpu_state_bytes(const ParamTable& table, SlabRange range, bool muon) {
  SlabRanges adam_kept, muon_kept;
  for (const ParamInfo& p : table.params()) {
    const SlabRange in = intersect({p.offset, p.offset + p.numel}, range);
    if (in.size() == 0) continue;
    const SlabRange local{in.begin - range.begin, in.end - range.begin};
    (muon && is_muon_matrix(p) ? muon_kept : adam_kept).push_back(local);
  }
  const int64_t n = range.size();
  const int64_t adam = gpu_slab_bytes(n, complement(adam_kept, n), 4);
  return 2 * adam + (muon ? gpu_slab_bytes(n, complement(muon_kept, n), 4) : 0);
}

// ZeRO-1 on GPUs keeps state over Zero1Layout::state_range: the most any rank keeps.
int64_t largest_gpu_state_bytes(const ParamTable& table, int ranks, bool muon) {
  const Zero1Layout layout(table, ranks, muon);
  int64_t largest = 0;
  for (int r = 0; r < ranks; ++r)
    largest = std::max(largest, gpu_state_bytes(table, layout.state_range(r), muon));
  return largest;
}

int64_t largest_gpu_state_range(const ParamTable& table, int ranks, bool muon) {
  const Zero1Layout layout(table, ranks, muon);
  int64_t largest = 0;
  for (int r = 0; r < ranks; ++r) largest = std::max(largest, layout.state_range(r).size());
  return largest;
}

// The bytes of the fp32 weight and gradient slabs and of the bf16 copies that the rank
// storing the most keeps under expert parallelism on GPUs with ZeRO-1 (device_expert_holes:
// the slabs' chunks wholly inside the holes take no memory; each slab with holes has one
// alias chunk). The chunks are of the GPU's allocation granularity, 2 MiB on the GPUs this
// was written for.
struct GpuSlabBytes {
  int64_t weights = 0, gradients = 0, bf16 = 0;
};
GpuSlabBytes gpu_slabs_with_expert_storage(const ModelConfig& mc, int ranks, bool muon, int ep,
                                           bool bf16) {
  const ParamTable table(mc);
  const int64_t n = table.total_elements();
  GpuSlabBytes most;
  for (int r = 0; r < ranks; ++r) {
    const SlabHoles h = device_expert_holes(table, mc.n_experts, ep, ranks, r, muon, bf16);
    const GpuSlabBytes s{gpu_slab_bytes(n, h.params, 4), gpu_slab_bytes(n, h.gradients, 4),
                         bf16 ? gpu_slab_bytes(n, h.bf16, 2) : 0};
    if (s.weights + s.gradients + s.bf16 > most.weights + most.gradients + most.bf16) most = s;
  }
  return most;
}
}  // namespace

MemoryNeed gpu_training_memory_need(const RunConfig& rc, int64_t batch_size, int ranks,
                                    int64_t nccl_bytes) {
  const TrainConfig& tc = rc.train;
  const int64_t groups = std::max<int64_t>(1, ranks / tc.context_parallel);
  const int64_t share = std::max<int64_t>(1, batch_size / groups);
  const MemoryEstimate m =
      estimate_memory(rc.model, micro_batch_rows(tc, share), tc.seq_len, tc.precision,
                      tc.optimizer == OptimizerKind::muon, tc.context_parallel);
  // The device optimizer's state slabs, in whole chunks: over the whole parameter slab, or
  // under ZeRO-1 over its range of it only (optim/device_optimizer.h), where the rank keeping
  // the most decides.
  const bool muon = tc.optimizer == OptimizerKind::muon;
  const bool zero1 = ranks > 1 && tc.zero1;
  const ParamTable table(rc.model);
  const int64_t optimizer = zero1 ? largest_gpu_state_bytes(table, ranks, muon)
                                  : gpu_state_bytes(table, {0, table.total_elements()}, muon);
  int64_t weights = m.weights_fp32_bytes + m.weights_bf16_bytes, gradients = m.grads_bytes;
  if (zero1) {
    const int ep = static_cast<int>(tc.expert_parallel);
    // A layout that does not divide fails later with its own error; until then, count it whole.
    if (ep > 1 && ranks % ep == 0 && rc.model.n_experts % ep == 0) {
      const GpuSlabBytes s =
          gpu_slabs_with_expert_storage(rc.model, ranks, muon, ep, tc.precision == DType::bf16);
      weights = s.weights + s.bf16;
      gradients = s.gradients;
    }
  }
  MemoryNeed need{"training",
                  {{"weights", weights},
                   {"gradients", gradients},
                   {"optimizer", optimizer},
                   {"activations", m.activations_bytes + m.backward_buffers_bytes}}};
  // Each NCCL group its own buffers: the data-parallel one, and the expert- and
  // context-parallel groups' where those are on.
  const int64_t nccl_groups = 1 + (tc.expert_parallel > 1) + (tc.context_parallel > 1);
  if (nccl_bytes > 0) need.parts.emplace_back("NCCL buffers", nccl_groups * nccl_bytes);
  const double counted = static_cast<double>(need.per_process());
  need.parts.emplace_back("margin", kGpuRuntimeBytes +
                                        static_cast<int64_t>(kGpuUncountedShare * counted));
  return need;
}

// The CUDA runtime's and its libraries' host memory (the driver's allocations, cuBLASLt's
// kernels as they load): an allowance, not a measured figure.
constexpr int64_t kCudaHostBytes = int64_t{512} << 20;

MemoryNeed gpu_host_memory_need(const RunConfig& rc, int ranks, bool host_staged) {
  const TrainConfig& tc = rc.train;
  const ModelConfig& mc = rc.model;
  constexpr int64_t kF32 = sizeof(float);
  MemoryNeed need{"training (host memory beside the GPU)", {}};
  const int64_t snapshot = rank_checkpoint_bytes(rc, ranks);
  if (tc.checkpoint_async) need.parts.emplace_back("checkpoint snapshot", snapshot);
  if (tc.memory_checkpoint_every > 0)
    need.parts.emplace_back("in-memory checkpoints", 2 * snapshot);
  if (ranks > 1 && host_staged) {
    const ParamTable table(mc);
    int64_t staging = kF32 * table.total_elements();
    if (tc.zero1)
      staging += kF32 * largest_gpu_state_range(table, ranks, tc.optimizer == OptimizerKind::muon);
    need.parts.emplace_back("gradients through host memory", staging);
  }
  // A rank's rows: its sequences' share of the global batch, its chunks of each.
  const int64_t groups = std::max<int64_t>(1, ranks / tc.context_parallel);
  const int64_t sequences = std::max<int64_t>(1, tc.batch_size / groups);
  const int64_t rows = sequences * tc.seq_len / tc.context_parallel;
  if (tc.context_parallel > 1 && host_staged) {
    // Four exchanges (k and v of two slots), each staging this rank's rows of a slot and the
    // group's, over MPI.
    const int64_t C = tc.context_parallel, slot_rows = rows / 2;
    need.parts.emplace_back("context-parallel exchanges",
                            4 * kF32 * (1 + C) * slot_rows * mc.kv_dim());
  }
  if (tc.expert_parallel > 1 && host_staged)  // each routed row out and in, over MPI
    need.parts.emplace_back("expert-parallel exchanges", 4 * kF32 * rows * mc.top_k * mc.d_model);
  need.parts.emplace_back("CUDA runtime", kCudaHostBytes);
  add_margin(need);
  return need;
}

std::string gpu_memory_shortfall(const MemoryNeed& need, const GpuMemory& gpu) {
  if (need.per_process() * gpu.sharing <= gpu.free_bytes) return "";
  std::string text = fmt::format("{} needs about {} of GPU memory per rank ({})", need.what,
                                 format_bytes(double(need.per_process()), 1),
                                 format_memory_parts(need));
  if (gpu.sharing > 1) text += fmt::format(" × {} ranks on one GPU", gpu.sharing);
  return text + fmt::format(", but {} has {} free", gpu.name,
                            format_bytes(double(gpu.free_bytes), 1));
}

namespace {

// The host side of a GPU run, on every host (collective under MPI).
void check_gpu_host_memory(const RunConfig& rc, const Processes& procs, const MemoryNeed& need,
                           const MemoryBudget& budget) {
  const auto hint = [&](const MemoryNeed&, const MemoryBudget&) {
    std::string h = "give each rank a GPU of its own (NCCL: no gradient staging)";
    if (rc.train.checkpoint_async) h += ", train.checkpoint_async=false (no snapshot)";
    if (rc.train.memory_checkpoint_every > 0)
      h += ", train.memory_checkpoint_every=0 (no in-memory checkpoints)";
    return h + ", or fewer ranks on this host";
  };
  if (procs.world())
    check_memory_on_every_host(*procs.world(), need, budget, hint);
  else if (!fits(need, budget))
    fail(memory_shortfall(need, budget), memory_hint(hint(need, budget)));
}

}  // namespace

void check_gpu_training_memory(const RunConfig& rc, const Processes& procs, const GpuMemory& mine,
                               const char* limit_env, const MemoryBudget& host_budget) {
  const bool off = limit_env && std::string(limit_env) == "off";
  const int ranks = procs.ranks();
  // Every rank judges every rank's GPU from the same figures, so that all fail together or
  // none does; a rank that turned the check off is still counted where it shares a GPU.
  struct Figures {
    GpuMemory gpu;
    bool off = false;
    int64_t nccl_bytes = 0;  // what NCCL's buffers would take there (its NCCL_BUFFSIZE)
  };
  const int64_t nccl_mine = gpu::nccl_buffer_bytes(std::getenv("NCCL_BUFFSIZE"));
  std::vector<Figures> all{{mine, off, nccl_mine}};
  if (procs.world()) {
    const int64_t figures[5] = {mine.free_bytes, mine.uuid[0], mine.uuid[1], off ? 1 : 0,
                                nccl_mine};
    std::vector<int64_t> gathered(5 * static_cast<size_t>(ranks));
    procs.world()->allgather(figures, gathered.data(), 5);
    all.clear();
    for (int r = 0; r < ranks; ++r) {
      const int64_t* f = &gathered[5 * static_cast<size_t>(r)];
      all.push_back({{f[0], r == procs.rank() ? mine.name : fmt::format("rank {}'s GPU", r),
                      {f[1], f[2]}},
                     f[3] != 0,
                     f[4]});
    }
  }
  for (Figures& a : all)
    a.gpu.sharing = static_cast<int>(std::count_if(all.begin(), all.end(), [&](const Figures& b) {
      return b.gpu.uuid == a.gpu.uuid;
    }));
  // Ranks that each have a GPU of their own exchange over NCCL where the build has it
  // (optim/device_optimizer.h, gpu_gradients_path).
  const bool nccl = ranks > 1 && gpu::built_with_nccl() &&
                    std::all_of(all.begin(), all.end(),
                                [](const Figures& a) { return a.gpu.sharing == 1; });
  int64_t nccl_bytes = 0;  // the largest any rank's NCCL_BUFFSIZE makes, the same everywhere
  if (nccl)
    for (const Figures& a : all) nccl_bytes = std::max(nccl_bytes, a.nccl_bytes);
  check_gpu_host_memory(rc, procs, gpu_host_memory_need(rc, ranks, !nccl),
                        off ? MemoryBudget{BudgetSource::off, 0} : host_budget);
  const MemoryNeed need = gpu_training_memory_need(rc, rc.train.batch_size, ranks, nccl_bytes);
  for (const Figures& a : all) {
    if (a.off) continue;
    const GpuMemory& gpu = a.gpu;
    const std::string shortfall = gpu_memory_shortfall(need, gpu);
    if (shortfall.empty()) continue;
    std::string hint = micro_batch_hint(rc, ranks, [&](const RunConfig& r) {
      return gpu_memory_shortfall(
                 gpu_training_memory_need(r, r.train.batch_size, ranks, nccl_bytes), gpu)
          .empty();
    });
    if (hint.empty())
      hint = smaller_batch_hint(rc, ranks, [&](int64_t batch) {
        return gpu_memory_shortfall(gpu_training_memory_need(rc, batch, ranks, nccl_bytes), gpu)
            .empty();
      });
    if (hint.empty()) hint = no_batch_fits(rc, ranks) + ", or train a smaller model";
    if (gpu.sharing > 1) hint += "; or give each rank a GPU of its own";
    fail(shortfall, hint + "; the margin is conservative: FOUNDRY_MEMORY_LIMIT=off skips the "
                           "memory checks");
  }
}

int64_t eval_micro_batch_rows(const RunConfig& rc) {
  const int64_t B = rc.train.batch_size;
  return checked_micro_batch_rows(
      rc.train, B,
      fmt::format("the {} sequence{} of a batch eval runs (train.batch_size)", B,
                  B == 1 ? "" : "s"));
}

void check_eval_memory(const RunConfig& rc, const MemoryBudget& budget) {
  const int64_t B = rc.train.batch_size, rows = eval_micro_batch_rows(rc);
  const MemoryNeed need = eval_need(rc, rows);
  if (fits(need, budget)) return;
  // Smaller micro-batches evaluate the same batches: the largest divisor of B that fits.
  int64_t micro = 0;
  for (int64_t m = rows - 1; m >= 1 && micro == 0; --m)
    if (B % m == 0 && fits(eval_need(rc, m), budget)) micro = m;
  fail(memory_shortfall(need, budget),
       memory_hint(micro > 0 ? fmt::format("set train.micro_batch_size = {} (--set "
                                           "train.micro_batch_size={}): eval forwards that many "
                                           "sequences of each batch at a time, the same batches",
                                           micro, micro)
                             : "even one sequence does not fit: shorten train.seq_len, or "
                               "evaluate on a machine with more memory"));
}

int64_t default_kv_memory(const RunConfig& rc, const MemoryBudget& budget) {
  if (!budget.limited()) return 0;
  const int64_t weights = inference_need("generate", rc, "decoding state", 0).total();
  return std::max<int64_t>(0, static_cast<int64_t>(0.8 * static_cast<double>(budget.bytes - weights)));
}

void warn_kv_memory_over_budget(const RunConfig& rc, int64_t kv_bytes, const MemoryBudget& budget) {
  if (!budget.limited()) return;
  const int64_t weights = inference_need("generate", rc, "decoding state", 0).total();
  if (weights + kv_bytes <= budget.bytes) return;
  fmt::print(stderr,
             "warning: --kv-memory {} with the weights and the runtime's margin ({}) is more "
             "than this process may use, {} ({}): it may be killed before the KV budget is "
             "reached; without --kv-memory it gets 80% of what the weights leave\n",
             format_bytes(static_cast<double>(kv_bytes)),
             format_bytes(static_cast<double>(weights)),
             format_bytes(static_cast<double>(budget.bytes)), budget_source_name(budget.source));
}

void check_generate_memory(const RunConfig& rc, int64_t max_len, const MemoryBudget& budget) {
  const MemoryNeed need =
      inference_need("generate", rc, "decoding state", decode_state_bytes(rc.model, max_len));
  if (fits(need, budget)) return;
  const bool weights_fit = fits(inference_need("generate", rc, "decoding state", 0), budget);
  fail(memory_shortfall(need, budget),
       memory_hint(weights_fit ? "generate fewer tokens (--max-new-tokens; the decoding state "
                                 "grows with the prompt and the new tokens)"
                               : "the weights with the runtime's margin do not fit: generate "
                                 "on a machine with more memory"));
}

}  // namespace foundry
