#include "base/format.h"

#include <gtest/gtest.h>

#include <utility>

namespace foundry {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

TEST(Format, BytesTakeTheLargestBinaryUnitWithFixedDecimals) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1.5 * kMiB), "1.50 MiB");
  EXPECT_EQ(format_bytes(163.78 * kMiB), "163.78 MiB");
  EXPECT_EQ(format_bytes(1.46 * 1024 * kMiB), "1.46 GiB");
  EXPECT_EQ(format_bytes(3.0 * 1024 * 1024 * kMiB), "3.00 TiB");
  EXPECT_EQ(format_bytes(5000.0 * 1024 * 1024 * kMiB), "5000.00 TiB");
  EXPECT_EQ(format_bytes(1.5 * kMiB, 1), "1.5 MiB");
}

TEST(Format, BytesCanDropTrailingZeros) {
  EXPECT_EQ(format_bytes(8, 1, Zeros::trim), "8 B");
  EXPECT_EQ(format_bytes(32768, 1, Zeros::trim), "32 KiB");
  EXPECT_EQ(format_bytes(1.5 * kMiB, 1, Zeros::trim), "1.5 MiB");
  EXPECT_EQ(format_bytes(1.25 * kMiB, 2, Zeros::trim), "1.25 MiB");
  EXPECT_EQ(format_bytes(1.2 * kMiB, 2, Zeros::trim), "1.2 MiB");
  EXPECT_EQ(format_bytes(32760, 1, Zeros::trim), "32 KiB");  // 31.99 rounds to 32.0
  EXPECT_EQ(format_bytes(100 * kMiB, 1, Zeros::trim), "100 MiB");
}

TEST(Format, BytesInAFixedUnit) {
  EXPECT_EQ(format_bytes(2.5 * kMiB, ByteUnit::MiB, 1), "2.5 MiB");
  EXPECT_EQ(format_bytes(1 * kMiB, ByteUnit::MiB, 1), "1.0 MiB");
  EXPECT_EQ(format_bytes(60 * kMiB, ByteUnit::MiB, 0), "60 MiB");
  EXPECT_EQ(format_bytes(0.25 * kMiB, ByteUnit::MiB, 2), "0.25 MiB");
  EXPECT_EQ(format_bytes(3 * 1024 * kMiB, ByteUnit::GiB, 2), "3.00 GiB");
  EXPECT_EQ(format_bytes(2048, ByteUnit::KiB, 0), "2 KiB");
  EXPECT_EQ(format_bytes(7, ByteUnit::B, 0), "7 B");
}

TEST(Format, CountsHaveAMetricSuffixAndSignificantDigits) {
  const std::pair<double, const char*> cases[] = {
      {0, "0"}, {950, "950"}, {1000, "1.000 k"}, {40500, "40.50 k"}, {460802, "460.8 k"},
      {12345678, "12.35 M"}, {734.3e6, "734.3 M"}, {8303355728, "8.303 B"},
      {12e12, "12.00 T"}, {4500e12, "4500 T"}};
  for (const auto& [count, text] : cases) EXPECT_EQ(format_count(count), text) << count;
  EXPECT_EQ(format_count(1.2e6, 3), "1.20 M");
  EXPECT_EQ(format_count(40500, 3), "40.5 k");
}

TEST(Format, CountsLikeAReferenceShareItsUnitAndDecimals) {
  EXPECT_EQ(format_count_like(753608528, 8303355728), "0.754 B");
  EXPECT_EQ(format_count_like(537133056, 8303355728), "0.537 B");
  EXPECT_EQ(format_count_like(8682504, 54098952), "8.68 M");
  EXPECT_EQ(format_count_like(3145728, 54098952), "3.15 M");
  EXPECT_EQ(format_count_like(12, 900), "12");
  EXPECT_EQ(format_count_like(2e9, 5e8, 3), "2000 M");
}

TEST(Format, FlopsHaveThreeDecimalsFromMflopUp) {
  const std::pair<double, const char*> cases[] = {
      {950, "950 FLOP"}, {999999, "999999 FLOP"}, {69.234e6, "69.234 MFLOP"},
      {149.894e9, "149.894 GFLOP"}, {2e12, "2.000 TFLOP"}, {1.5e15, "1.500 PFLOP"}};
  for (const auto& [flops, text] : cases) EXPECT_EQ(format_flops(flops), text) << flops;
}

}  // namespace
}  // namespace foundry
