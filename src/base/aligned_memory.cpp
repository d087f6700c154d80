#include "base/aligned_memory.h"

#include <cstdint>
#include <cstdlib>
#include <new>

#include "base/error.h"

namespace foundry {

void* allocate_aligned(size_t alignment, size_t bytes) {
  FOUNDRY_CHECK(alignment >= sizeof(void*) && (alignment & (alignment - 1)) == 0);
  if (bytes == 0) bytes = 1;
  if (bytes > SIZE_MAX - alignment - sizeof(void*)) throw std::bad_alloc();
  // Room to align, and before the block the pointer malloc gave.
  void* raw = std::malloc(bytes + alignment - 1 + sizeof(void*));
  if (!raw) throw std::bad_alloc();
  const uintptr_t first = reinterpret_cast<uintptr_t>(raw) + sizeof(void*);
  void* block = reinterpret_cast<void*>((first + alignment - 1) & ~(uintptr_t{alignment} - 1));
  static_cast<void**>(block)[-1] = raw;
  return block;
}

void free_aligned(void* block) {
  if (block) std::free(static_cast<void**>(block)[-1]);
}

}  // namespace foundry
