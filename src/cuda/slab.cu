// Slabs of device memory whose parts can be handed back (runtime.h: device_allocate_slab),
// on CUDA's virtual memory management: the address range is reserved whole and backed by
// chunks, each a physical allocation of its own. A chunk handed back is unmapped and freed,
// and its addresses map the slab's alias chunk instead (one physical chunk, mapped at every
// released place: zeros, or scratch), so that every address of the slab stays valid and
// whole-slab work (a copy, a collective's send buffer, the bf16 conversion) needs no holes.
#include <cuda.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/check.h"
#include "cuda/no_gpu.h"
#include "cuda/runtime.h"
#include "cuda/slab.h"

namespace foundry::gpu {
namespace {

[[noreturn]] void fail_driver_call(const char* call, CUresult status, const char* file,
                                   int line) {
  const char* name = nullptr;
  const char* text = nullptr;
  cuGetErrorName(status, &name);
  cuGetErrorString(status, &text);
  fail_cuda_call(call, static_cast<int>(status), name ? name : "?", text ? text : "?", file,
                 line);
}

#define FOUNDRY_CU_CHECK(call)                                                   \
  do {                                                                           \
    const CUresult foundry_cu_status_ = (call);                                  \
    if (foundry_cu_status_ != CUDA_SUCCESS)                                      \
      fail_driver_call(#call, foundry_cu_status_, __FILE__, __LINE__);           \
  } while (0)

struct Slab {
  CUdeviceptr base = 0;
  size_t reserved = 0, chunk = 0;
  CUmemLocation location{};
  // A chunk's own allocation; 0 once handed back (its addresses then map an alias).
  std::vector<CUmemGenericAllocationHandle> chunks;
  size_t mapped = 0;  // chunks mapped so far (all of them once made)
  CUmemGenericAllocationHandle zeros = 0, scratch = 0;  // the aliases, made on first use
  bool zeros_read_only = true;  // until the GPU refuses a read-only mapping
};

std::mutex& slabs_mutex() {
  static std::mutex m;
  return m;
}
std::map<void*, Slab>& slabs() {
  static std::map<void*, Slab> s;
  return s;
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

CUresult set_access(const Slab& s, CUdeviceptr at, size_t bytes, CUmemAccess_flags flags) {
  CUmemAccessDesc desc{};
  desc.location = s.location;
  desc.flags = flags;
  return cuMemSetAccess(at, bytes, &desc, 1);
}

// Unmaps every mapped chunk and frees the allocations and the address range; no errors (for
// destructors and for clean-up after a failure).
void free_slab(Slab& s) {
  for (size_t i = 0; i < s.mapped; ++i) cuMemUnmap(s.base + i * s.chunk, s.chunk);
  for (CUmemGenericAllocationHandle h : s.chunks)
    if (h) cuMemRelease(h);
  if (s.zeros) cuMemRelease(s.zeros);
  if (s.scratch) cuMemRelease(s.scratch);
  if (s.base) cuMemAddressFree(s.base, s.reserved);
  s = Slab{};
}

// A physical chunk for `s`, or the Error of a failed allocation with the GPU's free memory.
CUmemGenericAllocationHandle create_chunk(const Slab& s, int64_t requested) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = s.location;
  CUmemGenericAllocationHandle h = 0;
  const CUresult status = cuMemCreate(&h, s.chunk, &prop, 0);
  if (status == CUDA_SUCCESS) return h;
  const char* text = nullptr;
  cuGetErrorString(status, &text);
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  fail_gpu_allocation(requested, text ? text : "cuMemCreate failed",
                      static_cast<int64_t>(free_bytes), static_cast<int64_t>(total));
}

// The alias the released chunks of `s` map: zeros (read-only where the GPU allows) or scratch.
CUmemGenericAllocationHandle alias_for(Slab& s, bool zeros, CUdeviceptr first_use) {
  CUmemGenericAllocationHandle& h = zeros ? s.zeros : s.scratch;
  if (h) return h;
  h = create_chunk(s, static_cast<int64_t>(s.chunk));
  if (!zeros) return h;
  // Zeroed once through its first mapping, writable for that.
  FOUNDRY_CU_CHECK(cuMemMap(first_use, s.chunk, 0, h, 0));
  FOUNDRY_CU_CHECK(set_access(s, first_use, s.chunk, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  FOUNDRY_CUDA_CHECK(cudaMemset(reinterpret_cast<void*>(first_use), 0, s.chunk));
  FOUNDRY_CUDA_CHECK(cudaDeviceSynchronize());
  FOUNDRY_CU_CHECK(cuMemUnmap(first_use, s.chunk));
  return h;
}

}  // namespace

void* device_allocate_slab(int64_t bytes) {
  FOUNDRY_GPU_CHECK(bytes > 0);
  int device = 0;
  FOUNDRY_CUDA_CHECK(cudaGetDevice(&device));
  Slab s;
  s.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  s.location.id = device;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = s.location;
  size_t granularity = 0;
  FOUNDRY_CU_CHECK(
      cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  const size_t want = static_cast<size_t>(bytes);
  s.chunk = static_cast<size_t>(slab_chunk_bytes(bytes, static_cast<int64_t>(granularity)));
  s.reserved = round_up(want, s.chunk);
  try {
    FOUNDRY_CU_CHECK(cuMemAddressReserve(&s.base, s.reserved, 0, 0, 0));
    const size_t n = s.reserved / s.chunk;
    s.chunks.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
      s.chunks[i] = create_chunk(s, bytes);
      FOUNDRY_CU_CHECK(cuMemMap(s.base + i * s.chunk, s.chunk, 0, s.chunks[i], 0));
      s.mapped = i + 1;
    }
    FOUNDRY_CU_CHECK(set_access(s, s.base, s.reserved, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    FOUNDRY_CUDA_CHECK(cudaMemset(reinterpret_cast<void*>(s.base), 0, s.reserved));
  } catch (...) {
    free_slab(s);
    throw;
  }
  void* p = reinterpret_cast<void*>(s.base);
  std::lock_guard<std::mutex> lock(slabs_mutex());
  slabs().emplace(p, std::move(s));
  return p;
}

int64_t device_release_slab_ranges(void* slab, const ByteRanges& byte_ranges, bool zeros) {
  std::lock_guard<std::mutex> lock(slabs_mutex());
  auto it = slabs().find(slab);
  FOUNDRY_GPU_CHECK(it != slabs().end());
  Slab& s = it->second;
  FOUNDRY_CUDA_CHECK(cudaDeviceSynchronize());  // no queued work may still use a chunk
  int64_t released = 0;
  for (const auto& [begin, end] : byte_ranges) {
    FOUNDRY_GPU_CHECK(begin >= 0 && begin <= end && end <= static_cast<int64_t>(s.reserved));
    const size_t first = (static_cast<size_t>(begin) + s.chunk - 1) / s.chunk;
    const size_t last = static_cast<size_t>(end) / s.chunk;  // chunks [first, last) inside
    for (size_t i = first; i < last; ++i) {
      if (!s.chunks[i]) continue;
      const CUdeviceptr at = s.base + i * s.chunk;
      FOUNDRY_CU_CHECK(cuMemUnmap(at, s.chunk));
      FOUNDRY_CU_CHECK(cuMemRelease(s.chunks[i]));
      s.chunks[i] = 0;
      FOUNDRY_CU_CHECK(cuMemMap(at, s.chunk, 0, alias_for(s, zeros, at), 0));
      bool writable = !zeros || !s.zeros_read_only;
      if (!writable && set_access(s, at, s.chunk, CU_MEM_ACCESS_FLAGS_PROT_READ) != CUDA_SUCCESS) {
        s.zeros_read_only = false;  // this GPU maps device memory read-write only
        writable = true;
      }
      if (writable)
        FOUNDRY_CU_CHECK(set_access(s, at, s.chunk, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
      released += static_cast<int64_t>(s.chunk);
    }
  }
  return released;
}

bool free_device_slab(void* block) {
  Slab s;
  {
    std::lock_guard<std::mutex> lock(slabs_mutex());
    auto it = slabs().find(block);
    if (it == slabs().end()) return false;
    s = std::move(it->second);
    slabs().erase(it);
  }
  if (cudaDeviceSynchronize() != cudaSuccess)  // no queued work may still use it
    cudaGetLastError();  // an error of earlier work, not this caller's: the next check sees it
  free_slab(s);
  return true;
}

}  // namespace foundry::gpu
