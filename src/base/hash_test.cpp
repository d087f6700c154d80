#include "base/hash.h"

#include <gtest/gtest.h>

#include <numeric>
#include <utility>
#include <vector>

namespace foundry {
namespace {

TEST(Hash, StreamingInPiecesEqualsTheWholeHash) {
  std::vector<uint8_t> bytes(100000);
  std::iota(bytes.begin(), bytes.end(), uint8_t{7});
  StreamingHash64 stream;
  EXPECT_EQ(stream.digest(), hash64(nullptr, 0));
  size_t done = 0;
  for (size_t piece : {size_t{1}, size_t{4095}, size_t{50000}, size_t{0}, size_t{45904}}) {
    stream.update(bytes.data() + done, piece);
    done += piece;
    EXPECT_EQ(stream.digest(), hash64(bytes.data(), done)) << done;
  }
  StreamingHash64 moved = std::move(stream);
  EXPECT_EQ(moved.digest(), hash64(bytes.data(), bytes.size()));
}

TEST(Hash, HexHasSixteenDigits) {
  EXPECT_EQ(hash64_hex(0xabc), "0000000000000abc");
  EXPECT_EQ(hash64_hex(hash64("foundry", 7)).size(), 16u);
}

}  // namespace
}  // namespace foundry
