// The optimizers of a run whose slabs live in a device's memory (a GPU's; or a CPU backend
// posing as a device, with the CPU's kernels, for the tests on machines without a GPU).
//
// make_device_optimizer: the single-process layout of optim/optimizer.h (AdamW for every
// tensor, or Muon for the 2-D hidden matrices plus AdamW for the rest) on parameter and
// gradient slabs in the backend's memory, with its state there too. A step: the global
// gradient norm (sums of squares in double over fixed blocks, one copy to the host: the veto
// and the anomaly checks need its value), the clip factor, AdamW over all its tensors in one
// launch with the clip factor and the bf16 copy fused in, then Muon tensor by tensor
// (momentum, Newton–Schulz, the update). The elementwise arithmetic is the CPU optimizers'
// (optim/optimizer_kernels.h); the norm and Newton–Schulz sum in another order, so a GPU run
// is deterministic but not the CPU's bits. Restricted to a part of the slab, it keeps state
// for that part only and updates nothing else: ZeRO-1's local step.
//
// Checkpoints: the state runs point into host copies, filled from the device when a save asks
// for them; runs filled by a load go back to the device before the next step.
//
// Several ranks (each its device, or ranks sharing one GPU): the gradients average over NCCL
// on the device buffers where every rank has a GPU of its own and the build has NCCL, and
// through host memory over the MPI communicator otherwise (gpu_gradients_path). Replicated:
// every rank keeps the whole state and takes the whole step. ZeRO-1: the state is sharded
// along Zero1Layout::state_range (shards moved to whole Muon matrices), the gradients are
// reduce-scattered to those ranges, each rank updates its own, and the updated ranges are
// all-gathered.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "base/slab_range.h"
#include "model/model.h"
#include "optim/optimizer.h"
#include "optim/optimizer_kernels.h"

namespace foundry {

class Backend;
class Communicator;

// The part of the slab a device optimizer updates and keeps state for (unset: the whole
// slab), and how its sum of squares becomes the global one (unset: it is the global one).
// Muon matrices must lie inside the part or outside it, whole.
struct DeviceOptimizerPart {
  std::optional<SlabRange> range;
  std::function<double(double)> total_sum_of_squares;
};

std::unique_ptr<DataParallelOptimizer> make_device_optimizer(
    const ParamTable& table, const OptimizerOptions& options, Backend& backend,
    std::unique_ptr<OptimizerKernels> kernels = gpu_optimizer_kernels(),
    DeviceOptimizerPart part = {});

// How data-parallel ranks on GPUs exchange gradients and weights: through host memory
// (copied out, reduced over the MPI communicator, copied back) or with NCCL on the device
// buffers.
enum class GpuGradients { host, nccl };
// NCCL when every rank has a GPU of its own (the ranks' GPU UUIDs, current_gpu_uuid, all
// differ: NCCL refuses two ranks on one GPU) and every rank's build has NCCL; host memory
// otherwise.
GpuGradients gpu_gradients_path(const std::vector<std::array<int64_t, 2>>& rank_gpus,
                                bool nccl_everywhere);

// Data parallel over `world` for slabs in `backend`'s memory (collective; NCCL opens its group
// here), as options.zero1 says: replicated (each step averages the gradients, then every rank
// runs the single-process step) or ZeRO-1. `kernels` as for make_device_optimizer.
std::unique_ptr<DataParallelOptimizer> make_device_data_parallel_optimizer(
    const ParamTable& table, const OptimizerOptions& options, Backend& backend,
    const Communicator& world, GpuGradients how,
    const std::function<std::unique_ptr<OptimizerKernels>()>& kernels = gpu_optimizer_kernels);

// What `rank` of a device's ZeRO-1 over `world` ranks, its experts sharded over groups of `ep`
// consecutive ranks, does not store (Model::shard_expert_storage): the other ranks' experts
// outside its state range (Zero1Layout::state_range: it updates those, and its reduction
// writes their gradients there in place) in the parameters and gradients, and all of them in
// the bf16 copies (`bf16`). Empty where ep is 1 or does not divide the experts and the ranks.
SlabHoles device_expert_holes(const ParamTable& table, int64_t n_experts, int ep, int world,
                              int rank, bool muon, bool bf16);

}  // namespace foundry
