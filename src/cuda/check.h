// Turning CUDA and cuBLASLt status codes into foundry::Error. Usable from .cu files: it
// declares only plain functions (the Error is built in check.cpp, away from nvcc).
#pragma once

namespace foundry::gpu {

// Throws foundry::Error: "<call> failed: <name> (<code>): <text> at <file>:<line>" and a hint.
[[noreturn]] void fail_cuda_call(const char* call, int code, const char* name, const char* text,
                                 const char* file, int line);

// Throws the internal-check Error of FOUNDRY_CHECK (base/error.h) from code nvcc compiles.
[[noreturn]] void fail_internal_check(const char* condition, const char* file, int line);

// "CUBLAS_STATUS_NOT_SUPPORTED" for 15, ... (cuBLASLt alone has no such function).
const char* cublas_status_name(int status);

}  // namespace foundry::gpu

// CUDA_CHECK(cudaMalloc(...)): throws on anything but cudaSuccess.
#define FOUNDRY_CUDA_CHECK(call)                                                          \
  do {                                                                                    \
    const cudaError_t foundry_status_ = (call);                                           \
    if (foundry_status_ != cudaSuccess)                                                   \
      ::foundry::gpu::fail_cuda_call(#call, static_cast<int>(foundry_status_),            \
                                     cudaGetErrorName(foundry_status_),                   \
                                     cudaGetErrorString(foundry_status_), __FILE__, __LINE__); \
  } while (0)

// FOUNDRY_CHECK for .cu files: a failure is a bug in Foundry (a caller broke a contract).
#define FOUNDRY_GPU_CHECK(cond) \
  do {                          \
    if (!(cond)) ::foundry::gpu::fail_internal_check(#cond, __FILE__, __LINE__); \
  } while (0)

// CUBLAS_CHECK(cublasLtMatmul(...)): throws on anything but CUBLAS_STATUS_SUCCESS.
#define FOUNDRY_CUBLAS_CHECK(call)                                                        \
  do {                                                                                    \
    const cublasStatus_t foundry_status_ = (call);                                        \
    if (foundry_status_ != CUBLAS_STATUS_SUCCESS)                                         \
      ::foundry::gpu::fail_cuda_call(#call, static_cast<int>(foundry_status_),            \
                                     ::foundry::gpu::cublas_status_name(                  \
                                         static_cast<int>(foundry_status_)),              \
                                     "cuBLASLt refused the call", __FILE__, __LINE__);    \
  } while (0)
