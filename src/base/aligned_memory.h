// Aligned heap blocks from plain malloc.
//
// glibc before 2.38 rarely reuses a block freed from aligned_alloc/memalign for a later aligned
// request (its bug 14581): a process that keeps allocating and freeing aligned blocks of varied
// sizes (generation's KV segments, a few each request) grows its heap by hundreds of MB while
// holding a few. These blocks are malloc's own, over-allocated and aligned inside, so they
// are reused as any other.
#pragma once
#include <cstddef>

namespace foundry {

// `bytes` (at least 1) aligned to `alignment` (a power of two); throws std::bad_alloc. Free
// with free_aligned only.
void* allocate_aligned(size_t alignment, size_t bytes);
void free_aligned(void* block);  // nullptr is fine

}  // namespace foundry
