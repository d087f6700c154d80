// The CUDA seam: which GPU a command runs on, device memory, timing. This header needs no
// CUDA headers, so every layer can name it; a build without the CUDA backend (FOUNDRY_CUDA
// off, or no toolkit at configure time) links the same functions, which fail with an Error
// that says how to get one (src/cuda/no_cuda.cpp).
//
// Errors from the CUDA runtime and cuBLASLt become foundry::Error naming the call, the code
// and the GPU (check.h); nothing here exits the process.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "base/slab_chunks.h"
#include "base/timer.h"

namespace foundry::gpu {

struct GpuInfo {
  int index = 0;
  std::string name;            // "NVIDIA H200"
  int major = 0, minor = 0;    // compute capability
  int sm_count = 0;
  double sm_clock_hz = 0;      // the SMs' maximum clock
  int64_t memory_bytes = 0;    // global memory
  int64_t l2_bytes = 0;
  double memory_clock_hz = 0;  // the memory's clock (DDR: two transfers a cycle)
  int memory_bus_bits = 0;
  int driver_version = 0, runtime_version = 0;  // 13000 = 13.0
  // The memory's theoretical bandwidth: 2 · clock · bus width / 8 (0 when unknown).
  double spec_memory_bytes_per_s() const;
  std::string arch() const;    // "sm_90"
};

// Whether this foundry was built with the CUDA backend.
bool built_with_cuda();

// GPUs the CUDA runtime sees: 0 when none is visible, the driver is missing or too old, or
// the build has no CUDA backend; then `why` (if given) says which.
int visible_gpus(std::string* why = nullptr);

// Fails like open_gpu when GPU `index` cannot be used, without creating a context on it (every
// rank of a job can ask before one of them opens the GPU).
void check_gpu_visible(int index, const std::string& what);

// Makes GPU `index` current for this thread and describes it. Throws foundry::Error when the
// build has no CUDA backend, no GPU is visible or the index is out of range; `what` names
// the option that asked for the GPU ("--device cuda").
GpuInfo open_gpu(int index, const std::string& what);

// One allocation of device memory (device_allocate: zeroed), freed with the object. Not
// copyable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(int64_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <class T>
  T* as() const { return static_cast<T*>(data_); }
  int64_t bytes() const { return bytes_; }

  // Synchronous copies between host memory and `bytes` of the buffer from `offset`.
  void upload(const void* host, int64_t bytes, int64_t offset = 0);
  void download(void* host, int64_t bytes, int64_t offset = 0) const;
  // Every byte set to `value` (tests poison outputs with 0xFF: NaN in fp32 and bf16).
  void fill_bytes(int value);

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// Device scratch that grows to the largest request and then stays: after the first steps of a
// run, asking for it allocates nothing. The pointer is valid until the next larger request.
class Workspace {
 public:
  void* get(int64_t bytes) {
    if (bytes > buffer_.bytes()) buffer_ = DeviceBuffer(bytes);
    return buffer_.data();
  }
  int64_t bytes() const { return buffer_.bytes(); }

 private:
  DeviceBuffer buffer_;
};

// cudaMalloc of `bytes`, zeroed (an Error naming the size and the free memory when it
// fails), and cudaFree.
void* device_allocate(int64_t bytes);
void device_release(void* block);
// A slab of `bytes` (Backend::allocate_slab on a GPU): zeroed, its address range reserved
// whole and backed in chunks (base/slab_chunks.h, of the GPU's allocation granularity); the
// chunks wholly inside `holes` take no memory of their own: they map one chunk of the slab's,
// of zeros (read-only where the GPU allows: `zeros`) or of scratch. device_release frees it.
void* device_allocate_slab(int64_t bytes, const ByteRanges& holes, bool zeros);
// Hands back the chunks inside the byte ranges (sorted, disjoint) of a slab, after the work
// queued so far, as device_allocate_slab's holes. Returns the bytes handed back.
int64_t device_release_slab_ranges(void* slab, const ByteRanges& byte_ranges, bool zeros);
// The device memory backing a slab now: its own chunks and its alias chunks.
int64_t device_slab_memory_bytes(const void* slab);
// Whether the slab's zeros holes are mapped read-only (false once the GPU refused that: a
// stray write into a hole then changes every hole's zeros instead of faulting).
bool device_slab_zeros_read_only(const void* slab);

// Copies on the current GPU's default stream, in queue order with its kernels: between two
// device addresses, from the device to the host (waits for the value) and from the host to the
// device; zero_bytes sets `bytes` at `dst` to zero.
void copy_on_device(void* dst, const void* src, int64_t bytes);
// `blocks` blocks of `block_bytes`, block i from src + i·src_stride to dst + i·dst_stride
// (bytes), as one strided copy on the default stream.
void copy_blocks_on_device(void* dst, int64_t dst_stride, const void* src, int64_t src_stride,
                           int64_t block_bytes, int64_t blocks);
void copy_to_host(void* host, const void* src, int64_t bytes);
void copy_to_device(void* dst, const void* host, int64_t bytes);
void zero_bytes(void* dst, int64_t bytes);

// Page-locked host memory (cudaHostAlloc): copies between it and the GPU run at the bus's
// speed and beside kernels. An Error naming the size when it fails.
void* host_allocate_pinned(int64_t bytes);
void host_release_pinned(void* block);
// From page-locked host memory to the device, queued on the default stream like a kernel:
// the host does not wait, and must leave `pinned` unchanged until the copy has run (after
// synchronize(), for one).
void copy_to_device_queued(void* dst, const void* pinned, int64_t bytes);

// Copies from the current GPU to the host on a stream of their own: each after the work
// queued on the default stream so far, beside the work queued after it.
// wait_copies_to_host() blocks until every one is done (from any thread).
void copy_to_host_async(void* host, const void* src, int64_t bytes);
void wait_copies_to_host();

// Copies from the current GPU to page-locked host memory, collected one by one as they land
// (Backend::CopyQueue): each queued behind the work queued on the default stream so far, on a
// stream of this queue's own, and followed by an event that tells when it is done.
class HostCopyQueue {
 public:
  HostCopyQueue();  // on the current GPU
  ~HostCopyQueue();
  HostCopyQueue(const HostCopyQueue&) = delete;
  HostCopyQueue& operator=(const HostCopyQueue&) = delete;
  int64_t queue(void* host, const void* src, int64_t bytes);
  bool landed(int64_t i);
  void wait(int64_t i);
  void restart();

 private:
  void* stream_ = nullptr;   // cudaStream_t
  void* ready_ = nullptr;    // cudaEvent_t: the default stream's work so far
  std::vector<void*> done_;  // cudaEvent_t per copy number, reused after restart()
  int64_t next_ = 0;
};

// Bytes of the current GPU's memory in use (total − free: this process's allocations, its
// context, and any other process's).
int64_t memory_in_use();
// Bytes of the current GPU's memory free now (what this process can still allocate there).
int64_t memory_free();

// The current GPU's UUID as two words: the same for every process that uses that GPU, and
// for no other GPU on any host.
std::array<int64_t, 2> current_gpu_uuid();

// Waits for all work queued on the current GPU.
void synchronize();

// The op timers' clock on a GPU (base/timer.h): each mark is a CUDA event recorded on the
// default stream, from a pool that grows to the most marks between two resets.
class EventClock final : public OpClock {
 public:
  EventClock() = default;
  ~EventClock() override;
  EventClock(const EventClock&) = delete;
  EventClock& operator=(const EventClock&) = delete;
  int64_t mark() override;
  double seconds(int64_t from, int64_t to) override;
  void reset() override { used_ = 0; }

 private:
  std::vector<void*> events_;
  int64_t used_ = 0;
};

// Seconds between two points of the GPU's default stream (CUDA events): start() records the
// first, seconds() the second and waits for it.
class GpuTimer {
 public:
  GpuTimer();
  ~GpuTimer();
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;
  void start();
  double seconds();

 private:
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

}  // namespace foundry::gpu
