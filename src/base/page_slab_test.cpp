#include "base/page_slab.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <stdexcept>

namespace foundry {
namespace {

const int64_t kPage = sysconf(_SC_PAGESIZE) / static_cast<int64_t>(sizeof(float));

TEST(PageSlab, StartsZeroAndUnbacked) {
  PageSlab<float> s(8 * kPage);
  EXPECT_EQ(s.resident_bytes(), 0u);
  EXPECT_EQ(s[5 * kPage + 3], 0.0f);
}

TEST(PageSlab, StoredPartsSkipTheHoles) {
  PageSlab<float> s(10 * kPage);
  s.set_holes({{2 * kPage, 4 * kPage}, {6 * kPage, 7 * kPage + 5}});
  std::vector<std::pair<int64_t, int64_t>> parts;
  s.for_each_stored([&](int64_t b, int64_t e) { parts.push_back({b, e}); });
  const std::vector<std::pair<int64_t, int64_t>> want = {
      {0, 2 * kPage}, {4 * kPage, 6 * kPage}, {7 * kPage + 5, 10 * kPage}};
  EXPECT_EQ(parts, want);
  EXPECT_FALSE(s.stores_any(2 * kPage + 1, 3 * kPage));
  EXPECT_TRUE(s.stores_any(3 * kPage, 5 * kPage));  // straddles a hole's end
}

TEST(PageSlab, HoleEndingAtTheSlabEndLeavesNoTrailingPart) {
  PageSlab<float> s(4 * kPage);
  s.set_holes({{0, kPage}, {3 * kPage, 4 * kPage}});
  std::vector<std::pair<int64_t, int64_t>> parts;
  s.for_each_stored([&](int64_t b, int64_t e) { parts.push_back({b, e}); });
  const std::vector<std::pair<int64_t, int64_t>> want = {{kPage, 3 * kPage}};
  EXPECT_EQ(parts, want);
}

TEST(PageSlab, WriteAllGivesTheHolesBack) {
  PageSlab<float> s(8 * kPage);
  s.set_holes({{2 * kPage, 6 * kPage}});
  const float sum = s.write_all([&](float* p) {
    for (int64_t i = 0; i < 8 * kPage; ++i) p[i] = 1.0f;
    return p[3 * kPage] + p[7 * kPage];
  });
  EXPECT_EQ(sum, 2.0f);  // the writer saw its own writes
  // Before any read (reading a released page maps the shared zero page, which counts).
  EXPECT_EQ(s.resident_bytes(), static_cast<size_t>(4 * kPage * sizeof(float)));
  EXPECT_EQ(s[3 * kPage], 0.0f);  // the hole reads zero again
  EXPECT_EQ(s[7 * kPage], 1.0f);  // stored elements keep what was written
}

TEST(PageSlab, WriteAllGivesTheHolesBackWhenTheWriterThrows) {
  PageSlab<float> s(4 * kPage);
  s.set_holes({{kPage, 3 * kPage}});
  EXPECT_THROW(s.write_all([&](float* p) {
    p[2 * kPage] = 5.0f;
    throw std::runtime_error("disk full");
  }),
               std::runtime_error);
  EXPECT_EQ(s[2 * kPage], 0.0f);
}

TEST(PageSlab, MoveKeepsTheHoles) {
  PageSlab<float> a(4 * kPage);
  a.set_holes({{kPage, 2 * kPage}});
  PageSlab<float> b = std::move(a);
  ASSERT_EQ(b.holes().size(), 1u);
  EXPECT_EQ(b.holes()[0].first, kPage);
  EXPECT_TRUE(a.holes().empty() || a.size() == 0);
}

}  // namespace
}  // namespace foundry
