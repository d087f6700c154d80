#include "base/arena.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace foundry {
namespace {

TEST(Arena, OneBlockAlignedDisjointZeroedArrays) {
  Arena arena;
  float* a = nullptr;
  int32_t* b = nullptr;
  double* c = nullptr;
  int layouts = 0;
  arena.build([&](Arena& x) {
    ++layouts;
    a = x.take<float>(3);
    b = x.take<int32_t>(5);
    c = x.take<double>(7);
  });
  EXPECT_EQ(layouts, 2);  // measured, then assigned
  ASSERT_NE(a, nullptr);
  for (const void* p : {static_cast<const void*>(a), static_cast<const void*>(b),
                        static_cast<const void*>(c)})
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  // In order, each past the previous one's end.
  EXPECT_GE(reinterpret_cast<const char*>(b), reinterpret_cast<const char*>(a + 3));
  EXPECT_GE(reinterpret_cast<const char*>(c), reinterpret_cast<const char*>(b + 5));
  EXPECT_EQ(arena.bytes(), static_cast<size_t>(reinterpret_cast<const char*>(c + 7) -
                                               reinterpret_cast<const char*>(a)));
  for (int i = 0; i < 7; ++i) EXPECT_EQ(c[i], 0.0);
  c[6] = 1.0;  // the last element is writable
  EXPECT_EQ(c[6], 1.0);
}

TEST(Arena, RebuildReplacesTheBlock) {
  Arena arena;
  float* a = nullptr;
  arena.build([&](Arena& x) { a = x.take<float>(16); });
  a[0] = 3.0f;
  arena.build([&](Arena& x) { a = x.take<float>(32); });
  EXPECT_EQ(a[0], 0.0f);
  EXPECT_EQ(arena.bytes(), 32 * sizeof(float));
}

}  // namespace
}  // namespace foundry
