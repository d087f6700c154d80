#include "base/bf16.h"

#include <algorithm>

namespace foundry {

void convert_to_bf16(const float* src, bf16* dst, int64_t n) {
  constexpr int64_t kBlock = 16384;  // a multiple of the vector width
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t b = 0; b < blocks; ++b)
    to_bf16_serial(src + b * kBlock, dst + b * kBlock, std::min(kBlock, n - b * kBlock));
}

void convert_from_bf16(const bf16* src, float* dst, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

}  // namespace foundry
