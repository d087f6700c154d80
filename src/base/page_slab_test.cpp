#include "base/page_slab.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

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
  EXPECT_EQ(b.holes()[0].begin, kPage);
  EXPECT_TRUE(a.holes().empty() || a.size() == 0);
}

// The transparent-huge-page setting of this kernel ("always", "madvise", "never"; "" unknown).
std::string huge_page_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(f, line);
  const size_t open = line.find('['), close = line.find(']');
  return open == std::string::npos || close < open ? "" : line.substr(open + 1, close - open - 1);
}

// The "THPeligible" flag of the mapping holding `p` (/proc/self/smaps), -1 when not found.
int huge_page_eligible(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find('-'))
      inside = lo <= at && at < hi;
    else if (inside && line.rfind("THPeligible:", 0) == 0)
      return std::atoi(line.c_str() + 12);
  }
  return -1;
}

TEST(PageSlab, LargeSlabsStartOnAHugePageAndAskForHugePages) {
  PageSlab<float> big(3 * PageSlab<float>::kHugePage / sizeof(float) + 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % PageSlab<float>::kHugePage, 0u);
  EXPECT_EQ(big[big.size() - 1], 0.0f);  // the whole length is mapped
  big[big.size() - 1] = 2.0f;
  const std::string mode = huge_page_mode();
  const bool offered = mode == "always" || mode == "madvise";
  if (offered) {
    EXPECT_EQ(huge_page_eligible(big.data()), 1);
  }
  // A hole is never covered by a huge page: writing beside it backs no memory inside it.
  const size_t per_huge = PageSlab<float>::kHugePage / sizeof(float);
  big.set_holes({{static_cast<int64_t>(per_huge), static_cast<int64_t>(2 * per_huge)}});
  if (offered) {
    EXPECT_EQ(huge_page_eligible(big.data() + per_huge), 0);
  }
  big[per_huge - 1] = 1.0f;
  big[2 * per_huge] = 1.0f;
  EXPECT_EQ(big[per_huge + 7], 0.0f);
  EXPECT_EQ(big[big.size() - 1], 2.0f);
}

TEST(PageSlab, SmallSlabsTakeOnlyTheirPages) {
  PageSlab<float> small(3 * kPage);
  small[0] = 1.0f;
  EXPECT_EQ(small.resident_bytes(), static_cast<size_t>(kPage * sizeof(float)));
}

}  // namespace
}  // namespace foundry
