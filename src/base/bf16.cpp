#include "base/bf16.h"

#include <immintrin.h>

namespace foundry {

void convert_to_bf16(const float* src, bf16* dst, int64_t n) {
#if defined(__AVX512BF16__)
  const int64_t vec_end = n / 16 * 16;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < vec_end; i += 16) {
    __m512 v = _mm512_loadu_ps(src + i);
    __m256bh h = _mm512_cvtneps_pbh(v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<__m256i&>(h));
  }
  for (int64_t i = vec_end; i < n; ++i) dst[i] = float_to_bf16(src[i]);
#else
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
#endif
}

void convert_from_bf16(const bf16* src, float* dst, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

}  // namespace foundry
