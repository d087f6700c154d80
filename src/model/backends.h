// The backend of a device (base/device.h): the CPU's, or a CUDA GPU's (cuda/cuda_backend.h),
// which fails with a clear Error naming `what` (the flag or key that chose the device) when the
// build has no CUDA backend or the GPU is not visible; and the NCCL group of ranks' GPUs.
#pragma once
#include <memory>
#include <string>

#include "base/device.h"
#include "base/memory_budget.h"
#include "comm/comm.h"
#include "cuda/nccl.h"
#include "kernels/backend.h"

namespace foundry {

// With FOUNDRY_POSE_AS_DEVICE=1, for tests on machines without a GPU, the CPU device opens the
// CPU backend posing as a device (make_cpu_backend_posing_as_device, said once on stderr), so
// that a run takes every path a GPU run takes (device slabs, the device optimizers, copies to
// and from host memory) on the CPU's kernels.
std::unique_ptr<Backend> open_backend(const DeviceSpec& device, const std::string& what);

// The memory a command's work on `device` is checked against: the host's budget
// (memory_budget), or the GPU's free memory now (after open_backend made it current), which
// FOUNDRY_MEMORY_LIMIT replaces as it replaces the host's ("off" skips the check).
MemoryBudget memory_budget_of(const DeviceSpec& device,
                              const char* limit_env = std::getenv("FOUNDRY_MEMORY_LIMIT"));

// The NCCL group of `world`'s ranks, each on its current GPU (collective): rank 0's id goes to
// the others over MPI.
std::unique_ptr<gpu::NcclGroup> open_nccl_group(const Communicator& world);

}  // namespace foundry
