#include "cuda/check.h"

#include "base/error.h"

namespace foundry::gpu {

void fail_cuda_call(const char* call, int code, const char* name, const char* text,
                    const char* file, int line) {
  fail(fmt::format("{} failed: {} ({}): {} ({}:{})", call, name, code, text, file, line),
       "out of memory: choose a smaller batch or model; a launch or driver error: check "
       "nvidia-smi, and run with CUDA_LAUNCH_BLOCKING=1 to find the kernel");
}

void fail_internal_check(const char* condition, const char* file, int line) {
  fail(fmt::format("internal check failed: {} ({}:{})", condition, file, line),
       "this is a bug in foundry; please report it");
}

const char* cublas_status_name(int status) {
  switch (status) {  // cublasStatus_t's values (cublas_api.h)
    case 0: return "CUBLAS_STATUS_SUCCESS";
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_(unknown)";
  }
}

}  // namespace foundry::gpu
