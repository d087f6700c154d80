#include "model/backends.h"

#include "cuda/cuda_backend.h"
#include "kernels/cpu_backend.h"

namespace foundry {

std::unique_ptr<Backend> open_backend(const DeviceSpec& device, const std::string& what) {
  if (!device.cuda) return make_cpu_backend();
  return gpu::make_cuda_backend(device.index, what);
}

}  // namespace foundry
