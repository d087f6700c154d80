// Memory checks made before train, eval and generate allocate: what the command will need,
// from the model's memory estimate (model/info.h), against what this process may use
// (base/memory_budget.h). A config that does not fit fails at once, with the figures and
// the setting to change, instead of being killed by the kernel partway through.
#pragma once
#include <array>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "base/memory_budget.h"
#include "train/run_config.h"

namespace foundry {

class Processes;

// What one rank of a training run over `ranks` ranks needs for a global batch of
// `batch_size` sequences: its share of the batch, its ZeRO-1 shard of the optimizer state,
// its expert storage under train.expert_parallel, the asynchronous checkpoint's snapshot,
// and the margin the estimate leaves out.
MemoryNeed training_memory_need(const RunConfig& rc, int64_t batch_size, int ranks);

// The bytes of one rank's checkpoint (its parameters to save and its optimizer state) in a
// run over `ranks` ranks: the snapshot's size, and one copy in the in-memory tier.
int64_t rank_checkpoint_bytes(const RunConfig& rc, int ranks);

// Training: training_memory_need times the ranks on each host against each rank's budget.
// Collective over procs.world(): every rank reaches the same verdict and fails together.
void check_training_memory(const RunConfig& rc, const Processes& procs,
                           const MemoryBudget& budget = memory_budget());

// A GPU training rank's need in its GPU's memory for a global batch of `batch_size`
// sequences over `ranks` ranks: what `model info` estimates for its share (the same layouts:
// weights and their bf16 copies, gradients, optimizer state, activations and backward
// buffers; within 2% of the measured use on an H200) and a margin for the runtime's own
// (cuBLASLt's workspace, scratch, the allocator), the CUDA context being already counted.
// `nccl_bytes`: where the ranks exchange over NCCL, its buffers (gpu::nccl_buffer_bytes),
// which come on top.
MemoryNeed gpu_training_memory_need(const RunConfig& rc, int64_t batch_size, int ranks,
                                    int64_t nccl_bytes = 0);

// What a GPU run keeps in each rank's host memory: the checkpoint snapshot and the in-memory
// tier (as on the CPU), the gradients' page-locked staging where the ranks reduce through host
// memory (`host_staged`: ranks sharing a GPU, or no NCCL) with ZeRO-1's share of the sums, the
// rows the context-parallel exchanges and (host-staged) the expert-parallel ones stage, and the
// CUDA runtime's host side;
// then the host check's margin. check_gpu_training_memory checks it on every host.
MemoryNeed gpu_host_memory_need(const RunConfig& rc, int ranks, bool host_staged);

// A rank's GPU at the check: its free memory, its name for the message, its UUID (ranks whose
// GPUs have the same one share it and what is free on it), and how many ranks train on it
// (check_gpu_training_memory counts them).
struct GpuMemory {
  int64_t free_bytes = 0;
  std::string name;
  std::array<int64_t, 2> uuid{};
  int sharing = 1;
};

// Why `need` × gpu.sharing does not fit gpu.free_bytes ("" when it fits).
std::string gpu_memory_shortfall(const MemoryNeed& need, const GpuMemory& gpu);

// A GPU run: gpu_training_memory_need × the ranks on each GPU against every rank's GPU, and
// gpu_host_memory_need × the ranks on each host against its memory (`host_budget`), before
// anything is allocated or written. Collective over procs.world(): every rank reaches the
// same verdict. FOUNDRY_MEMORY_LIMIT=off skips the judging of a rank's GPU (the rank still
// takes part in the collective), as it skips the host's check.
void check_gpu_training_memory(const RunConfig& rc, const Processes& procs, const GpuMemory& mine,
                               const char* limit_env = std::getenv("FOUNDRY_MEMORY_LIMIT"),
                               const MemoryBudget& host_budget = memory_budget());

// The sequences foundry eval forwards at once of each batch of train.batch_size:
// train.micro_batch_size (which must divide the batch), or the whole batch.
int64_t eval_micro_batch_rows(const RunConfig& rc);
// foundry eval: the weights and the forward pass of one micro-batch (eval_micro_batch_rows).
void check_eval_memory(const RunConfig& rc, const MemoryBudget& budget = memory_budget());

// generate --batch's default KV budget: 80% of what `budget` leaves beside the weights as
// loaded for inference (and the preflight's margin); 0 (no limit) when the budget is not
// limited.
int64_t default_kv_memory(const RunConfig& rc, const MemoryBudget& budget = memory_budget());
// A --kv-memory given by the user that, with the weights, exceeds the memory budget: warned
// (the process may be killed before the KV budget is reached).
void warn_kv_memory_over_budget(const RunConfig& rc, int64_t kv_bytes,
                                const MemoryBudget& budget = memory_budget());

// foundry generate: the weights and the decoding state of a sequence of `max_len` tokens.
void check_generate_memory(const RunConfig& rc, int64_t max_len,
                           const MemoryBudget& budget = memory_budget());

}  // namespace foundry
