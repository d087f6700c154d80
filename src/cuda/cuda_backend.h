// The GPU's Backend (kernels/backend.h): device memory, cuBLASLt products and the kernels of
// ops.h, cca.h and zaya.h, all queued on the GPU's default stream. Operations with scratch
// take it from one workspace that grows to the largest request and then stays.
//
// What differs from the CPU's arithmetic: attention and the CCA's grouped convolution run in
// fp32 whatever the training precision (the products around them use it), and the experts'
// products run one after the other. The result is deterministic run to run on one GPU, not
// bitwise the CPU's.
#pragma once
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace foundry::gpu {

// Opens GPU `index` (open_gpu: the errors where the build has no CUDA or the GPU is not
// visible name `what`) and returns its backend.
std::unique_ptr<Backend> make_cuda_backend(int index, const std::string& what);

}  // namespace foundry::gpu
