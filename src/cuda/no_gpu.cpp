#include "cuda/no_gpu.h"

#include "base/error.h"
#include "base/format.h"

namespace foundry::gpu {

void fail_no_cuda_build(const std::string& what) {
  fail(fmt::format("{}: this foundry was built without the CUDA backend", what),
       "build it on a machine with the CUDA toolkit (cmake finds nvcc and cuBLASLt; "
       "-DFOUNDRY_CUDA=ON makes their absence a configure error), see docs/gpu.md; or run on "
       "the CPU (--device cpu)");
}

void fail_no_gpu(const std::string& what, const std::string& why) {
  fail(fmt::format("{}: no CUDA GPU is visible ({})", what, why),
       "check that nvidia-smi lists a GPU and that CUDA_VISIBLE_DEVICES does not hide it; or "
       "run on the CPU (--device cpu)");
}

void fail_gpu_index(const std::string& what, int index, int count) {
  fail(fmt::format("{}: GPU {} does not exist ({} visible: 0 to {})", what, index, count,
                   count - 1),
       "choose a GPU the CUDA runtime lists (nvidia-smi; CUDA_VISIBLE_DEVICES renumbers them)");
}

void fail_gpu_allocation(int64_t bytes, const std::string& why, int64_t free_bytes,
                         int64_t total_bytes) {
  fail(fmt::format("cannot allocate {} of GPU memory ({}; {} of {} free)",
                   format_bytes(static_cast<double>(bytes)), why,
                   format_bytes(static_cast<double>(free_bytes)),
                   format_bytes(static_cast<double>(total_bytes))),
       "use a smaller batch (train.batch_size) or sequence; `foundry model info` says what a "
       "config needs");
}

void fail_pinned_allocation(int64_t bytes, const std::string& why) {
  fail(fmt::format("cannot allocate {} of page-locked host memory for checkpoint snapshots ({})",
                   format_bytes(static_cast<double>(bytes)), why),
       "free host memory, or turn the in-memory checkpoints off "
       "(train.memory_checkpoint_every = 0), which take a snapshot buffer of their own");
}

void check_buffer_range(int64_t offset, int64_t bytes, int64_t capacity) {
  FOUNDRY_CHECK(offset >= 0 && bytes >= 0 && offset + bytes <= capacity);
}

}  // namespace foundry::gpu
