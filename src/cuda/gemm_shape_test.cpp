#include "cuda/gemm_shape.h"

#include <gtest/gtest.h>

#include <set>
#include <tuple>

namespace foundry::gpu {
namespace {

TEST(GemmBucket, RoundsUpToFewSizesAndKeepsSmallOnesExact) {
  for (int64_t x = 1; x <= 64; ++x) EXPECT_EQ(gemm_bucket(x), x);
  EXPECT_EQ(gemm_bucket(65), 128);
  EXPECT_EQ(gemm_bucket(129), 256);
  EXPECT_EQ(gemm_bucket(257), 512);
  EXPECT_EQ(gemm_bucket(2048), 2048);
  EXPECT_EQ(gemm_bucket(2049), 2304);
  EXPECT_EQ(gemm_bucket(8193), 9216);
  int64_t previous = 0;
  std::set<int64_t> buckets;
  for (int64_t x = 1; x <= 32768; ++x) {
    const int64_t b = gemm_bucket(x);
    EXPECT_GE(b, x);
    EXPECT_GE(b, previous) << x;          // monotonic
    EXPECT_EQ(gemm_bucket(b), b) << x;    // a bucket is its own representative
    if (x > 64) {
      EXPECT_LT(b, 2 * x) << x;  // less than double the work
    }
    EXPECT_LT(b - x, 1024) << x;
    previous = b;
    buckets.insert(b);
  }
  // An expert's row count (up to 32,768 here) asks the heuristic at most this many times.
  EXPECT_LE(buckets.size(), 64u + 2 + 31 + 24);
}

// The representative is a valid shape (every stored row fits in its stride), is its own
// representative, and keeps a dense operand dense and a padded one's stride.
TEST(GemmRepresentative, IsAValidShapeOfTheSameLayout) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t m : {1, 100, 777, 2048, 9000})
        for (int64_t k : {7, 300, 4096})
          for (int64_t pad : {0, 5, 4096}) {
            const int64_t n = 96;
            const GemmShape s{m, n, k, ta, tb, (ta ? m : k) + pad, n + pad};
            const GemmShape r = representative(s);
            SCOPED_TRACE(testing::Message() << "m " << m << " k " << k << " ta " << ta
                                            << " pad " << pad);
            EXPECT_EQ(std::tie(r.trans_a, r.trans_b), std::tie(s.trans_a, s.trans_b));
            EXPECT_EQ(r.m, gemm_bucket(m));
            EXPECT_EQ(r.k, gemm_bucket(k));
            EXPECT_GE(r.lda, ta ? r.m : r.k);
            EXPECT_GE(r.ldc, r.n);
            if (pad == 0) {
              EXPECT_EQ(r.lda, ta ? r.m : r.k);
              EXPECT_EQ(r.ldc, r.n);
            } else if (s.lda >= (ta ? r.m : r.k)) {
              EXPECT_EQ(r.lda, s.lda);
            }
            EXPECT_EQ(representative(r), r);
          }
}

TEST(GemmRepresentative, ShapesOfOneBucketShareIt) {
  const GemmShape a{1100, 4096, 2048, false, true, 2048, 4096};
  const GemmShape b{1200, 4096, 2048, false, true, 2048, 4096};
  const GemmShape c{1300, 4096, 2048, false, true, 2048, 4096};
  EXPECT_EQ(representative(a), representative(b));
  EXPECT_FALSE(representative(a) == representative(c));  // 1280 and 1536
}

}  // namespace
}  // namespace foundry::gpu
