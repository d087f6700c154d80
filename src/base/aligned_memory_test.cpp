#include "base/aligned_memory.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

namespace foundry {
namespace {

TEST(AlignedMemory, BlocksAreAlignedAndWholeAtEverySize) {
  for (size_t alignment : {size_t{8}, size_t{64}, size_t{256}, size_t{4096}})
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{100}, size_t{4097}}) {
      void* p = allocate_aligned(alignment, bytes);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % alignment, 0u) << alignment << " " << bytes;
      std::memset(p, 0xab, bytes);  // the whole block is ours (ASan checks the bounds)
      free_aligned(p);
    }
  free_aligned(nullptr);
}

// Blocks allocated and freed a few at a time, every other one of the same size, while small
// allocations accumulate between them (generation: KV segments come and go, results stay):
// the heap holds about what is live. glibc 2.36's aligned_alloc grew its heap by 46 MB here,
// over three times the bound.
TEST(AlignedMemory, FreedBlocksAreReused) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the sanitizer's allocator is not glibc's: mallinfo2 does not see it";
#endif
  const auto heap = [] { return static_cast<int64_t>(mallinfo2().arena); };
  const int64_t before = heap();
  std::deque<void*> window;
  std::vector<std::unique_ptr<char[]>> kept;
  int64_t kept_bytes = 0, largest = 0;
  for (int i = 0; i < 20000; ++i) {
    const size_t bytes = i % 2 ? 28 * 1024 : 4096 + static_cast<size_t>(i % 61) * 1024;
    largest = std::max<int64_t>(largest, static_cast<int64_t>(bytes));
    window.push_back(allocate_aligned(256, bytes));
    if (window.size() > 32) free_aligned(window.front()), window.pop_front();
    kept.emplace_back(new char[200]);
    kept_bytes += 200;
  }
  const int64_t grown = heap() - before;
  for (void* p : window) free_aligned(p);
  // Live at the end: 32 blocks and the kept ones (with malloc's few bytes each); twice that
  // leaves room for ordinary fragmentation.
  EXPECT_LT(grown, 2 * (32 * (largest + 512) + kept_bytes * 5 / 4)) << "the heap grew by " << grown;
}

}  // namespace
}  // namespace foundry
