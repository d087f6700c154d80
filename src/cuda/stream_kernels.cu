// stream_kernels.h: grid-stride loops over doubles, enough blocks to fill every SM.
#include <cuda_runtime.h>

#include "cuda/check.h"
#include "cuda/stream_kernels.h"

namespace foundry::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kReadBlocks = 4096;  // fixed, so that the partial sums have a fixed layout

int blocks_for(int64_t n) {
  static int sms = [] {
    int device = 0, count = 0;
    FOUNDRY_CUDA_CHECK(cudaGetDevice(&device));
    FOUNDRY_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }();
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<int>(wanted < int64_t{sms} * 8 ? (wanted > 0 ? wanted : 1) : int64_t{sms} * 8);
}

__global__ void copy_kernel(const double* __restrict__ a, double* __restrict__ c, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    c[i] = a[i];
}

__global__ void scale_kernel(const double* __restrict__ c, double* __restrict__ b, int64_t n,
                             double s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    b[i] = s * c[i];
}

__global__ void add_kernel(const double* __restrict__ a, const double* __restrict__ b,
                           double* __restrict__ c, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    c[i] = a[i] + b[i];
}

__global__ void triad_kernel(double* __restrict__ a, const double* __restrict__ b,
                             const double* __restrict__ c, int64_t n, double s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    a[i] = b[i] + s * c[i];
}

__global__ void write_kernel(double* __restrict__ a, int64_t n, double s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    a[i] = s;
}

// Each block sums its strided share in a fixed order, then the block's threads are summed by
// a fixed tree: the same bits every run.
__global__ void read_kernel(const double* __restrict__ a, int64_t n, double* __restrict__ partial) {
  __shared__ double sums[kThreads];
  double sum = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    sum += a[i];
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) sums[threadIdx.x] += sums[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sums[0];
}

}  // namespace

void run_stream_op(StreamOp op, double* a, double* b, double* c, int64_t n, double scalar,
                   double* partial) {
  const int blocks = blocks_for(n);
  switch (op) {
    case StreamOp::copy: copy_kernel<<<blocks, kThreads>>>(a, c, n); break;
    case StreamOp::scale: scale_kernel<<<blocks, kThreads>>>(c, b, n, scalar); break;
    case StreamOp::add: add_kernel<<<blocks, kThreads>>>(a, b, c, n); break;
    case StreamOp::triad: triad_kernel<<<blocks, kThreads>>>(a, b, c, n, scalar); break;
    case StreamOp::read: read_kernel<<<kReadBlocks, kThreads>>>(a, n, partial); break;
    case StreamOp::write: write_kernel<<<blocks, kThreads>>>(a, n, scalar); break;
  }
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

int64_t stream_read_partials() { return kReadBlocks; }

void fill_doubles(double* x, int64_t n, double value) {
  write_kernel<<<blocks_for(n), kThreads>>>(x, n, value);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace foundry::gpu
