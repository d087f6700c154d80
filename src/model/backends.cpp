#include "model/backends.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/runtime.h"
#include "kernels/cpu_backend.h"

namespace foundry {
namespace {

bool device_posing() {
  const char* v = std::getenv("FOUNDRY_POSE_AS_DEVICE");
  return v && std::strcmp(v, "1") == 0;
}

}  // namespace

std::unique_ptr<Backend> open_backend(const DeviceSpec& device, const std::string& what) {
  if (!device.cuda && device_posing()) {
    static std::once_flag said;
    std::call_once(said, [] {
      std::fprintf(stderr,
                   "note: FOUNDRY_POSE_AS_DEVICE=1: the CPU backend poses as a device (a test "
                   "setting: a GPU run's paths on the CPU's kernels)\n");
    });
    return make_cpu_backend_posing_as_device();
  }
  if (!device.cuda) return make_cpu_backend();
  return gpu::make_cuda_backend(device.index, what);
}

MemoryBudget memory_budget_of(const DeviceSpec& device, const char* limit_env) {
  if (!device.cuda || limit_env) return memory_budget(limit_env);
  return {BudgetSource::gpu, gpu::memory_free()};
}

std::unique_ptr<gpu::NcclGroup> open_nccl_group(const Communicator& world) {
  return std::make_unique<gpu::NcclGroup>(world.rank(), world.size(), [&](void* bytes, size_t n) {
    std::vector<int64_t> words((n + 7) / 8, 0);  // MPI carries the id as whole words
    std::memcpy(words.data(), bytes, n);
    world.broadcast(words.data(), words.size(), 0);
    std::memcpy(bytes, words.data(), n);
    // Every rank holds the id before any blocks in NCCL's init (an MPI that progresses a
    // broadcast lazily could otherwise leave a rank without it).
    world.barrier();
  });
}

}  // namespace foundry
