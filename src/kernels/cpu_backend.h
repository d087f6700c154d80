// The CPU's Backend (kernels/backend.h): host memory, oneDNN products and the OpenMP kernels.
// Stateless: one instance serves every model in the process.
#pragma once
#include "kernels/backend.h"

namespace foundry {

Backend& cpu_backend();

}  // namespace foundry
