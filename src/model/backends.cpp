#include "model/backends.h"

#include "cuda/cuda_backend.h"
#include "cuda/runtime.h"
#include "kernels/cpu_backend.h"

namespace foundry {

std::unique_ptr<Backend> open_backend(const DeviceSpec& device, const std::string& what) {
  if (!device.cuda) return make_cpu_backend();
  return gpu::make_cuda_backend(device.index, what);
}

MemoryBudget memory_budget_of(const DeviceSpec& device, const char* limit_env) {
  if (!device.cuda || limit_env) return memory_budget(limit_env);
  return {BudgetSource::gpu, gpu::memory_free()};
}

}  // namespace foundry
