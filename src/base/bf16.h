// bfloat16 storage: the top 16 bits of an IEEE float, rounded to nearest even.
#pragma once
#include <immintrin.h>

#include <bit>
#include <cstdint>
#include <cstring>

namespace foundry {

using bf16 = uint16_t;

inline bf16 float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<bf16>(bits >> 16);
}

inline float bf16_to_float(bf16 h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Converts n floats to bf16 (round to nearest even) on the calling thread, for use inside
// parallel loops.
inline void to_bf16_serial(const float* src, bf16* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
  for (; i + 16 <= n; i += 16) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), std::bit_cast<__m256i>(h));
  }
#endif
  for (; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

// to_bf16_serial with non-temporal stores: for a copy written once and not read again soon
// (the optimizer's bf16 weight mirror), which then costs no read of its old contents. Call
// stream_fence() before another thread reads dst.
inline void to_bf16_streaming(const float* src, bf16* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
  for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 32 != 0; ++i)
    dst[i] = float_to_bf16(src[i]);
  for (; i + 16 <= n; i += 16) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), std::bit_cast<__m256i>(h));
  }
#endif
  for (; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}
inline void stream_fence() {
#if defined(__AVX512BF16__)
  _mm_sfence();
#endif
}

// Converts n floats to bf16 (OpenMP-parallel, vectorized).
void convert_to_bf16(const float* src, bf16* dst, int64_t n);
void convert_from_bf16(const bf16* src, float* dst, int64_t n);

}  // namespace foundry
