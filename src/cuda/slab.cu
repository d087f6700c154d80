// Slabs of device memory with holes (runtime.h: device_allocate_slab), on CUDA's virtual
// memory management: the address range is reserved whole and backed by chunks, each a
// physical allocation of its own, except the chunks wholly inside the holes (given when the
// slab is made, or handed back later): their addresses map the slab's alias chunk instead
// (one physical chunk, mapped at every such place: zeros, or scratch), so that every address
// of the slab stays valid and whole-slab work (a copy, a collective's send buffer, the bf16
// conversion) needs no holes. Slab memory is never registered with NCCL (ncclCommRegister,
// graph registration): a ring that forwards from a receive buffer would forward whatever
// another place of a scratch alias last wrote.
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

// The driver API's calls, looked up through the runtime (cudaGetDriverEntryPoint*): linking
// libcuda would make every binary of a CUDA build need the driver to start, where the runtime
// alone finds it when a GPU is used.
struct Driver {
  decltype(&::cuGetErrorName) GetErrorName;
  decltype(&::cuGetErrorString) GetErrorString;
  decltype(&::cuMemAddressReserve) MemAddressReserve;
  decltype(&::cuMemAddressFree) MemAddressFree;
  decltype(&::cuMemCreate) MemCreate;
  decltype(&::cuMemRelease) MemRelease;
  decltype(&::cuMemMap) MemMap;
  decltype(&::cuMemUnmap) MemUnmap;
  decltype(&::cuMemSetAccess) MemSetAccess;
  decltype(&::cuMemGetAllocationGranularity) MemGetAllocationGranularity;
};

template <typename F>
void look_up(F& fn, const char* symbol) {
  void* found = nullptr;
  cudaDriverEntryPointQueryResult result{};
#if CUDART_VERSION >= 12050
  const cudaError_t status =
      cudaGetDriverEntryPointByVersion(symbol, &found, 12000, cudaEnableDefault, &result);
#else
  const cudaError_t status = cudaGetDriverEntryPoint(symbol, &found, cudaEnableDefault, &result);
#endif
  FOUNDRY_CUDA_CHECK(status);
  if (result != cudaDriverEntryPointSuccess || !found)
    fail_cuda_call(symbol, static_cast<int>(result), "cudaDriverEntryPointSymbolNotFound",
                   "the CUDA driver has no such call (update the NVIDIA driver)", __FILE__,
                   __LINE__);
  fn = reinterpret_cast<F>(found);
}

const Driver& cu() {
  static const Driver driver = [] {
    Driver d{};
    look_up(d.GetErrorName, "cuGetErrorName");
    look_up(d.GetErrorString, "cuGetErrorString");
    look_up(d.MemAddressReserve, "cuMemAddressReserve");
    look_up(d.MemAddressFree, "cuMemAddressFree");
    look_up(d.MemCreate, "cuMemCreate");
    look_up(d.MemRelease, "cuMemRelease");
    look_up(d.MemMap, "cuMemMap");
    look_up(d.MemUnmap, "cuMemUnmap");
    look_up(d.MemSetAccess, "cuMemSetAccess");
    look_up(d.MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    return d;
  }();
  return driver;
}

[[noreturn]] void fail_driver_call(const char* call, CUresult status, const char* file,
                                   int line) {
  const char* name = nullptr;
  const char* text = nullptr;
  cu().GetErrorName(status, &name);
  cu().GetErrorString(status, &text);
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
  size_t alias_bytes = 0;  // the alias chunks made
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
  return cu().MemSetAccess(at, bytes, &desc, 1);
}

// Unmaps every mapped chunk and frees the allocations and the address range; no errors (for
// destructors and for clean-up after a failure).
void free_slab(Slab& s) {
  for (size_t i = 0; i < s.chunks.size(); ++i) cu().MemUnmap(s.base + i * s.chunk, s.chunk);
  for (CUmemGenericAllocationHandle h : s.chunks)
    if (h) cu().MemRelease(h);
  if (s.zeros) cu().MemRelease(s.zeros);
  if (s.scratch) cu().MemRelease(s.scratch);
  if (s.base) cu().MemAddressFree(s.base, s.reserved);
  s = Slab{};
}

// A physical chunk for `s`, or the Error of a failed allocation with the GPU's free memory.
CUmemGenericAllocationHandle create_chunk(const Slab& s, int64_t requested) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = s.location;
  CUmemGenericAllocationHandle h = 0;
  const CUresult status = cu().MemCreate(&h, s.chunk, &prop, 0);
  if (status == CUDA_SUCCESS) return h;
  const char* text = nullptr;
  cu().GetErrorString(status, &text);
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  fail_gpu_allocation(requested, text ? text : "cuMemCreate failed",
                      static_cast<int64_t>(free_bytes), static_cast<int64_t>(total));
}

// The alias the released chunks of `s` map: zeros (read-only where the GPU allows) or scratch.
// Either starts zeroed, as the CPU's holes do (a scratch hole's first reader sees zeros, not
// what the memory's last owner left). `first_use`: an address of `s` that nothing maps now,
// where a new alias is zeroed.
CUmemGenericAllocationHandle alias_for(Slab& s, bool zeros, CUdeviceptr first_use) {
  CUmemGenericAllocationHandle& h = zeros ? s.zeros : s.scratch;
  if (h) return h;
  CUmemGenericAllocationHandle made = create_chunk(s, static_cast<int64_t>(s.chunk));
  try {  // zeroed once, through a mapping of its own
    FOUNDRY_CU_CHECK(cu().MemMap(first_use, s.chunk, 0, made, 0));
    const CUresult access = set_access(s, first_use, s.chunk, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    const cudaError_t set = access == CUDA_SUCCESS
                                ? cudaMemset(reinterpret_cast<void*>(first_use), 0, s.chunk)
                                : cudaErrorUnknown;
    const cudaError_t synced = set == cudaSuccess ? cudaDeviceSynchronize() : set;
    cu().MemUnmap(first_use, s.chunk);
    FOUNDRY_CU_CHECK(access);
    FOUNDRY_CUDA_CHECK(synced);
  } catch (...) {
    cu().MemRelease(made);
    throw;
  }
  h = made;
  s.alias_bytes += s.chunk;
  return h;
}

// Maps the alias at chunk `i` (whose address nothing maps now) with its access.
void map_alias(Slab& s, size_t i, bool zeros) {
  const CUdeviceptr at = s.base + i * s.chunk;
  FOUNDRY_CU_CHECK(cu().MemMap(at, s.chunk, 0, alias_for(s, zeros, at), 0));
  bool writable = !zeros || !s.zeros_read_only;
  if (!writable && set_access(s, at, s.chunk, CU_MEM_ACCESS_FLAGS_PROT_READ) != CUDA_SUCCESS) {
    s.zeros_read_only = false;  // this GPU maps device memory read-write only
    writable = true;
  }
  if (!writable) return;
  const CUresult status = set_access(s, at, s.chunk, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  if (status != CUDA_SUCCESS) {
    cu().MemUnmap(at, s.chunk);  // nothing mapped there again, for the caller to restore
    fail_driver_call("cu().MemSetAccess(alias, read-write)", status, __FILE__, __LINE__);
  }
}

// Whether chunk i lies wholly inside one of `holes`.
std::vector<bool> chunks_in_holes(const Slab& s, const ByteRanges& holes) {
  std::vector<bool> in(s.chunks.size(), false);
  for (const auto& [begin, end] : holes) {
    FOUNDRY_GPU_CHECK(begin >= 0 && begin <= end && end <= static_cast<int64_t>(s.reserved));
    const auto [first, last] = chunks_inside(begin, end, static_cast<int64_t>(s.chunk));
    for (int64_t i = first; i < last; ++i) in[static_cast<size_t>(i)] = true;
  }
  return in;
}

}  // namespace

void* device_allocate_slab(int64_t bytes, const ByteRanges& holes, bool zeros) {
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
      cu().MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  s.chunk = static_cast<size_t>(slab_chunk_bytes(bytes, static_cast<int64_t>(granularity)));
  s.reserved = round_up(static_cast<size_t>(bytes), s.chunk);
  try {
    // Aligned to the granularity (a power of two): every chunk's address, base + i·chunk, is
    // then a multiple of it, as cuMemMap needs.
    FOUNDRY_CU_CHECK(cu().MemAddressReserve(&s.base, s.reserved, granularity, 0, 0));
    s.chunks.assign(s.reserved / s.chunk, 0);
    const std::vector<bool> in_hole = chunks_in_holes(s, holes);
    // Zeroed first, while every chunk is its own and writable: the holes' after.
    for (size_t i = 0; i < s.chunks.size(); ++i) {
      if (in_hole[i]) continue;
      s.chunks[i] = create_chunk(s, bytes);
      FOUNDRY_CU_CHECK(cu().MemMap(s.base + i * s.chunk, s.chunk, 0, s.chunks[i], 0));
      FOUNDRY_CU_CHECK(
          set_access(s, s.base + i * s.chunk, s.chunk, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
      FOUNDRY_CUDA_CHECK(cudaMemset(reinterpret_cast<void*>(s.base + i * s.chunk), 0, s.chunk));
    }
    for (size_t i = 0; i < s.chunks.size(); ++i)
      if (in_hole[i]) map_alias(s, i, zeros);
    FOUNDRY_CUDA_CHECK(cudaDeviceSynchronize());
  } catch (...) {
    // The memsets queued so far must land before their chunks go (an error is earlier work's).
    if (cudaDeviceSynchronize() != cudaSuccess) cudaGetLastError();
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
  const std::vector<bool> in_range = chunks_in_holes(s, byte_ranges);
  int64_t released = 0;
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    if (!in_range[i] || !s.chunks[i]) continue;
    const CUdeviceptr at = s.base + i * s.chunk;
    FOUNDRY_CU_CHECK(cu().MemUnmap(at, s.chunk));
    try {
      map_alias(s, i, zeros);
    } catch (...) {  // the chunk's own memory back where it was: every address stays valid
      FOUNDRY_CU_CHECK(cu().MemMap(at, s.chunk, 0, s.chunks[i], 0));
      FOUNDRY_CU_CHECK(set_access(s, at, s.chunk, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
      throw;
    }
    const CUmemGenericAllocationHandle own = std::exchange(s.chunks[i], 0);
    released += static_cast<int64_t>(s.chunk);
    FOUNDRY_CU_CHECK(cu().MemRelease(own));
  }
  return released;
}

int64_t device_slab_memory_bytes(const void* slab) {
  std::lock_guard<std::mutex> lock(slabs_mutex());
  auto it = slabs().find(const_cast<void*>(slab));
  FOUNDRY_GPU_CHECK(it != slabs().end());
  const Slab& s = it->second;
  int64_t own = 0;
  for (CUmemGenericAllocationHandle h : s.chunks) own += h ? static_cast<int64_t>(s.chunk) : 0;
  return own + static_cast<int64_t>(s.alias_bytes);
}

bool device_slab_zeros_read_only(const void* slab) {
  std::lock_guard<std::mutex> lock(slabs_mutex());
  auto it = slabs().find(const_cast<void*>(slab));
  FOUNDRY_GPU_CHECK(it != slabs().end());
  return it->second.zeros_read_only;
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
  // No queued work may still use it. An error here is earlier work's (a sticky one stays for
  // the next check to see); it is not this free's to report.
  if (cudaDeviceSynchronize() != cudaSuccess) cudaGetLastError();
  free_slab(s);
  return true;
}

}  // namespace foundry::gpu
