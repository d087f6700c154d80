// The backend of a device (base/device.h): the CPU's, or a CUDA GPU's (cuda/cuda_backend.h),
// which fails with a clear Error naming `what` (the flag or key that chose the device) when the
// build has no CUDA backend or the GPU is not visible.
#pragma once
#include <memory>
#include <string>

#include "base/device.h"
#include "kernels/backend.h"

namespace foundry {

std::unique_ptr<Backend> open_backend(const DeviceSpec& device, const std::string& what);

}  // namespace foundry
