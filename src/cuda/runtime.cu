// runtime.h with the CUDA runtime.
#include <cuda_runtime.h>

#include <cstring>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/check.h"
#include "cuda/no_gpu.h"
#include "cuda/runtime.h"
#include "cuda/slab.h"

namespace foundry::gpu {

bool built_with_cuda() { return true; }

int visible_gpus(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it: the next runtime call must not see it
    if (why) *why = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
    return 0;
  }
  if (count == 0 && why) *why = "the CUDA runtime reports 0 devices";
  return count;
}

void check_gpu_visible(int index, const std::string& what) {
  std::string why;
  const int count = visible_gpus(&why);
  if (count == 0) fail_no_gpu(what, why);
  if (index < 0 || index >= count) fail_gpu_index(what, index, count);
}

GpuInfo open_gpu(int index, const std::string& what) {
  check_gpu_visible(index, what);
  FOUNDRY_CUDA_CHECK(cudaSetDevice(index));
  cudaDeviceProp prop{};
  FOUNDRY_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  auto attribute = [index](cudaDeviceAttr a) {
    int v = 0;
    FOUNDRY_CUDA_CHECK(cudaDeviceGetAttribute(&v, a, index));
    return v;
  };
  GpuInfo g;
  g.index = index;
  g.name = prop.name;
  g.major = prop.major;
  g.minor = prop.minor;
  g.sm_count = attribute(cudaDevAttrMultiProcessorCount);
  g.sm_clock_hz = attribute(cudaDevAttrClockRate) * 1e3;
  g.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  g.l2_bytes = attribute(cudaDevAttrL2CacheSize);
  g.memory_clock_hz = attribute(cudaDevAttrMemoryClockRate) * 1e3;
  g.memory_bus_bits = attribute(cudaDevAttrGlobalMemoryBusWidth);
  FOUNDRY_CUDA_CHECK(cudaDriverGetVersion(&g.driver_version));
  FOUNDRY_CUDA_CHECK(cudaRuntimeGetVersion(&g.runtime_version));
  return g;
}

DeviceBuffer::DeviceBuffer(int64_t bytes) : bytes_(bytes) {
  if (bytes > 0) data_ = device_allocate(bytes);  // its error names the GPU's free memory
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, int64_t bytes, int64_t offset) {
  check_buffer_range(offset, bytes, bytes_);
  FOUNDRY_CUDA_CHECK(cudaMemcpy(static_cast<char*>(data_) + offset, host,
                                static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, int64_t bytes, int64_t offset) const {
  check_buffer_range(offset, bytes, bytes_);
  FOUNDRY_CUDA_CHECK(cudaMemcpy(host, static_cast<const char*>(data_) + offset,
                                static_cast<size_t>(bytes), cudaMemcpyDeviceToHost));
}

void DeviceBuffer::fill_bytes(int value) {
  FOUNDRY_CUDA_CHECK(cudaMemset(data_, value, static_cast<size_t>(bytes_)));
}

void* device_allocate(int64_t bytes) {
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, static_cast<size_t>(bytes));
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it: the error is reported here
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    fail_gpu_allocation(bytes, cudaGetErrorString(status), static_cast<int64_t>(free_bytes),
                        static_cast<int64_t>(total));
  }
  FOUNDRY_CUDA_CHECK(cudaMemset(p, 0, static_cast<size_t>(bytes)));
  return p;
}

void device_release(void* block) {
  if (block && !free_device_slab(block)) cudaFree(block);
}

void* host_allocate_pinned(int64_t bytes) {
  void* p = nullptr;
  const cudaError_t status =
      cudaHostAlloc(&p, static_cast<size_t>(bytes > 0 ? bytes : 1), cudaHostAllocDefault);
  if (status != cudaSuccess) {
    cudaGetLastError();
    fail_pinned_allocation(bytes, cudaGetErrorString(status));
  }
  return p;
}

void host_release_pinned(void* block) {
  if (block) cudaFreeHost(block);
}

namespace {

// The stream of the copies to the host: non-blocking, so that it never waits for the legacy
// default stream's later work (nor that work for it); each copy waits for an event recorded
// on the default stream when it is queued. One per device, made on first use.
struct HostCopies {
  std::mutex mutex;
  std::map<int, std::pair<cudaStream_t, cudaEvent_t>> streams;
};

HostCopies& host_copies() {
  static HostCopies* h = new HostCopies;  // never destroyed: no teardown order against the runtime
  return *h;
}

}  // namespace

void copy_to_host_async(void* host, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  int device = 0;
  FOUNDRY_CUDA_CHECK(cudaGetDevice(&device));
  HostCopies& h = host_copies();
  std::lock_guard<std::mutex> lock(h.mutex);
  auto& [stream, ready] = h.streams[device];
  if (!stream) {
    FOUNDRY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    FOUNDRY_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  }
  FOUNDRY_CUDA_CHECK(cudaEventRecord(ready, nullptr));  // after the work queued so far
  FOUNDRY_CUDA_CHECK(cudaStreamWaitEvent(stream, ready, 0));
  FOUNDRY_CUDA_CHECK(
      cudaMemcpyAsync(host, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream));
}

void wait_copies_to_host() {
  std::vector<std::pair<int, cudaStream_t>> streams;
  {
    HostCopies& h = host_copies();
    std::lock_guard<std::mutex> lock(h.mutex);
    for (const auto& [device, s] : h.streams) streams.emplace_back(device, s.first);
  }
  // The caller may be a checkpoint writer thread, whose current device is GPU 0 whatever its
  // rank's GPU: selecting the stream's device first keeps such a thread from opening a
  // context on GPU 0 (hundreds of MB there for every rank of the host).
  for (const auto& [device, s] : streams) {
    FOUNDRY_CUDA_CHECK(cudaSetDevice(device));
    FOUNDRY_CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

HostCopyQueue::HostCopyQueue() {
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;
  FOUNDRY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  FOUNDRY_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  stream_ = stream;
  ready_ = ready;
}

HostCopyQueue::~HostCopyQueue() {
  // Nothing may still write into the caller's memory; errors are not thrown from here.
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  for (void* e : done_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  cudaEventDestroy(static_cast<cudaEvent_t>(ready_));
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

int64_t HostCopyQueue::queue(void* host, const void* src, int64_t bytes) {
  const auto stream = static_cast<cudaStream_t>(stream_);
  if (next_ == static_cast<int64_t>(done_.size())) {
    cudaEvent_t e = nullptr;
    FOUNDRY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    done_.push_back(e);
  }
  FOUNDRY_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(ready_), nullptr));
  FOUNDRY_CUDA_CHECK(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(ready_), 0));
  if (bytes > 0)
    FOUNDRY_CUDA_CHECK(
        cudaMemcpyAsync(host, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream));
  FOUNDRY_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(done_[next_]), stream));
  return next_++;
}

bool HostCopyQueue::landed(int64_t i) {
  FOUNDRY_GPU_CHECK(i >= 0 && i < next_);
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(done_[i]));
  if (status == cudaErrorNotReady) {
    // Not an error, but the runtime keeps it as the last error, which the next launch check
    // (cudaGetLastError) would then report: clear it.
    (void)cudaGetLastError();
    return false;
  }
  FOUNDRY_CUDA_CHECK(status);
  return true;
}

void HostCopyQueue::wait(int64_t i) {
  FOUNDRY_GPU_CHECK(i >= 0 && i < next_);
  FOUNDRY_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(done_[i])));
}

void HostCopyQueue::restart() {
  FOUNDRY_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  next_ = 0;
}

void copy_on_device(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0)
    FOUNDRY_CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice));
}

void copy_blocks_on_device(void* dst, int64_t dst_stride, const void* src, int64_t src_stride,
                           int64_t block_bytes, int64_t blocks) {
  FOUNDRY_GPU_CHECK(block_bytes >= 0 && blocks >= 0 && dst_stride >= block_bytes &&
                    src_stride >= block_bytes);
  if (block_bytes == 0 || blocks == 0) return;
  // cudaMemcpy2D takes pitches up to the device's limit (2^31 − 1 bytes on current GPUs).
  constexpr int64_t kMaxPitch = (int64_t{1} << 31) - 1;
  if (dst_stride > kMaxPitch || src_stride > kMaxPitch) {
    for (int64_t i = 0; i < blocks; ++i)
      copy_on_device(static_cast<char*>(dst) + i * dst_stride,
                     static_cast<const char*>(src) + i * src_stride, block_bytes);
    return;
  }
  FOUNDRY_CUDA_CHECK(cudaMemcpy2D(dst, static_cast<size_t>(dst_stride), src,
                                  static_cast<size_t>(src_stride), static_cast<size_t>(block_bytes),
                                  static_cast<size_t>(blocks), cudaMemcpyDeviceToDevice));
}

void copy_to_host(void* host, const void* src, int64_t bytes) {
  if (bytes > 0)
    FOUNDRY_CUDA_CHECK(cudaMemcpy(host, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost));
}

void copy_to_device(void* dst, const void* host, int64_t bytes) {
  if (bytes > 0)
    FOUNDRY_CUDA_CHECK(cudaMemcpy(dst, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
}

void copy_to_device_queued(void* dst, const void* pinned, int64_t bytes) {
  if (bytes > 0)
    FOUNDRY_CUDA_CHECK(
        cudaMemcpyAsync(dst, pinned, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, 0));
}

void zero_bytes(void* dst, int64_t bytes) {
  if (bytes > 0) FOUNDRY_CUDA_CHECK(cudaMemset(dst, 0, static_cast<size_t>(bytes)));
}

EventClock::~EventClock() {
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

int64_t EventClock::mark() {
  if (used_ == static_cast<int64_t>(events_.size())) {
    cudaEvent_t e = nullptr;
    FOUNDRY_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  FOUNDRY_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events_[used_])));
  return used_++;
}

double EventClock::seconds(int64_t from, int64_t to) {
  FOUNDRY_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[to])));
  float ms = 0;
  FOUNDRY_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[from]),
                                          static_cast<cudaEvent_t>(events_[to])));
  return ms * 1e-3;
}

int64_t memory_in_use() {
  size_t free_bytes = 0, total = 0;
  FOUNDRY_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return static_cast<int64_t>(total - free_bytes);
}

int64_t memory_free() {
  size_t free_bytes = 0, total = 0;
  FOUNDRY_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return static_cast<int64_t>(free_bytes);
}

std::array<int64_t, 2> current_gpu_uuid() {
  int device = 0;
  FOUNDRY_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  FOUNDRY_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::array<int64_t, 2> uuid{};
  static_assert(sizeof(prop.uuid.bytes) == sizeof(uuid));
  std::memcpy(uuid.data(), prop.uuid.bytes, sizeof(uuid));
  return uuid;
}

void synchronize() { FOUNDRY_CUDA_CHECK(cudaDeviceSynchronize()); }

GpuTimer::GpuTimer() {
  cudaEvent_t a = nullptr, b = nullptr;
  FOUNDRY_CUDA_CHECK(cudaEventCreate(&a));
  FOUNDRY_CUDA_CHECK(cudaEventCreate(&b));
  start_ = a;
  stop_ = b;
}

GpuTimer::~GpuTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

void GpuTimer::start() { FOUNDRY_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(start_))); }

double GpuTimer::seconds() {
  FOUNDRY_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(stop_)));
  FOUNDRY_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)));
  float ms = 0;
  FOUNDRY_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_),
                                          static_cast<cudaEvent_t>(stop_)));
  return ms * 1e-3;
}

}  // namespace foundry::gpu
