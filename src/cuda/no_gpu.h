// The errors of runtime.h when there is no GPU to run on (both builds use them).
#pragma once
#include <cstdint>
#include <string>

namespace foundry::gpu {

[[noreturn]] void fail_no_cuda_build(const std::string& what);
[[noreturn]] void fail_no_gpu(const std::string& what, const std::string& why);
[[noreturn]] void fail_gpu_index(const std::string& what, int index, int count);
// A failed cudaMalloc of `bytes`: the runtime's reason and the GPU's free and total memory.
[[noreturn]] void fail_gpu_allocation(int64_t bytes, const std::string& why, int64_t free_bytes,
                                      int64_t total_bytes);
// A failed cudaHostAlloc of `bytes` (page-locked host memory for checkpoint snapshots).
[[noreturn]] void fail_pinned_allocation(int64_t bytes, const std::string& why);
// Fails when `bytes` from `offset` do not fit a buffer of `capacity` bytes (an internal bug).
void check_buffer_range(int64_t offset, int64_t bytes, int64_t capacity);

}  // namespace foundry::gpu
