// The CCA grouped convolution as oneDNN matmuls (kernels/cca.h).
//
// The taps are stacked into the products' K dimension: for every row (b, t) and group g the
// GEMMs' input holds the taps' rows side by side, [x(t − pad) ‖ … ‖ x(t)] (pad = t1 − 1;
// positions outside the sequence are zero), in the GEMMs' type, group by group. The forward
// and the input gradient are then one [B·T, t1·d] × [t1·d, d] product per group, every row of
// the batch in M, large enough for the library's fastest kernels, where one product per tap
// of [T, d] × [d, d] blocks was not (docs/PERFORMANCE.md); the weight gradient is one product
// batched over the groups with K = B·T.
#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "kernels/cca.h"
#include "kernels/gemm.h"
#include "kernels/kernel_support.h"

namespace foundry::ops {

namespace {

using detail::ScratchBuffer;

int64_t element_size(DType dtype) { return dtype == DType::bf16 ? 2 : 4; }

// n floats into dst in the GEMMs' type (serial; called inside parallel loops).
void store_as(DType dtype, const float* src, void* dst, int64_t n) {
  if (dtype == DType::bf16)
    to_bf16_serial(src, static_cast<bf16*>(dst), n);
  else
    std::memcpy(dst, src, n * sizeof(float));
}

// Stacked rows: x [B, T, G·d] as [G, B·T, taps·d] in the GEMMs' type, where group g, row
// (b, t) holds [x(b, t + first) ‖ x(b, t + first + 1) ‖ …] over the taps (first: −pad for
// the window before each row, 0 for the window from it on), zero outside the sequence. Kept
// in a grow-only per-thread buffer.
class StackedTaps {
 public:
  StackedTaps(ScratchBuffer<unsigned char>& buffer, const float* x, int64_t b, int64_t t,
              int64_t groups, int64_t d, int64_t taps, int64_t first, DType dtype)
      : dtype_(dtype), groups_(groups), rows_(b * t), k_(taps * d) {
    const int64_t elem = element_size(dtype), rows = b * t, channels = groups * d;
    data_ = buffer.get(groups * rows * k_ * elem);
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t s = row / t, r = row % t;
      for (int64_t i = 0; i < taps; ++i) {
        const int64_t src = r + first + i;
        for (int64_t g = 0; g < groups; ++g) {
          unsigned char* dst = data_ + ((g * rows + row) * k_ + i * d) * elem;
          if (src >= 0 && src < t)
            store_as(dtype, x + (s * t + src) * channels + g * d, dst, d);
          else
            std::memset(dst, 0, d * elem);
        }
      }
    }
  }
  // Group g's [rows, taps·d]; all groups transposed, [G, taps·d, rows]; one tap of every
  // group, [G, rows, d].
  MatView group(int64_t g) const {
    return MatView{data_ + g * rows_ * k_ * element_size(dtype_), dtype_, {rows_, k_}, {k_, 1}};
  }
  MatView groups_transposed() const {
    return MatView{data_, dtype_, {groups_, k_, rows_}, {rows_ * k_, 1, k_}};
  }
  MatView tap_view(int64_t tap, int64_t d) const {
    return MatView{data_ + tap * d * element_size(dtype_), dtype_, {groups_, rows_, d},
                   {rows_ * k_, k_, 1}};
  }

 private:
  DType dtype_;
  int64_t groups_, rows_, k_;
  unsigned char* data_ = nullptr;
};

// w1 [G·d (o), d (ci), t1] repacked as [G][t1·d][d] in the GEMMs' type: forward
// [G][(i, ci)][o]; for the input gradient [G][(j, o)][ci], tap j of the stacked dz rows being
// w1's tap t1 − 1 − j.
const void* packed_taps(const float* w1, int64_t groups, int64_t d, int64_t taps,
                        bool for_input_gradient, DType dtype) {
  thread_local ScratchBuffer<float> packed;
  thread_local ScratchBuffer<unsigned char> converted;
  const int64_t n = groups * taps * d * d;
  float* out = packed.get(n);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t o = 0; o < d; ++o)
      for (int64_t ci = 0; ci < d; ++ci)
        for (int64_t i = 0; i < taps; ++i) {
          const float w = w1[((g * d + o) * d + ci) * taps + i];
          if (for_input_gradient)  // stacked dz tap j = taps − 1 − i reads dz(t + pad − i)
            out[((g * taps + (taps - 1 - i)) * d + o) * d + ci] = w;
          else
            out[((g * taps + i) * d + ci) * d + o] = w;
        }
  unsigned char* data = converted.get(n * element_size(dtype));
  store_as(dtype, out, data, n);
  return data;
}

// Group g's [t1·d, d] block of packed_taps.
MatView weight_block(const void* w, int64_t g, int64_t k, int64_t d, DType dtype) {
  return MatView{static_cast<const unsigned char*>(w) + g * k * d * element_size(dtype), dtype,
                 {k, d}, {d, 1}};
}

}  // namespace

void cca_grouped_conv_forward_gemm(float* z, const float* y, const float* w1, const float* b1,
                                   int64_t b, int64_t t, int64_t groups, int64_t d,
                                   int64_t taps, DType dtype) {
  FOUNDRY_CHECK(taps >= 1 && groups > 0 && d > 0 && b > 0 && t > 0);
  const int64_t channels = groups * d, rows = b * t, k = taps * d, pad = taps - 1;
  thread_local ScratchBuffer<unsigned char> y_buffer;
  const StackedTaps ys(y_buffer, y, b, t, groups, d, taps, -pad, dtype);
  const void* w = packed_taps(w1, groups, d, taps, /*for_input_gradient=*/false, dtype);
  if (b1) {
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; ++row) std::copy_n(b1, channels, z + row * channels);
  }
  // z[row, g] (+)= [y(t − pad) ‖ … ‖ y(t)][g] · W[g]
  for (int64_t g = 0; g < groups; ++g)
    matmul(ys.group(g), weight_block(w, g, k, d, dtype),
           OutView{z + g * d, {rows, d}, {channels, 1}}, /*accumulate=*/b1 != nullptr);
}

void cca_grouped_conv_backward_gemm(float* dy, float* dw1, float* db1, const float* dz,
                                    const float* y, const float* w1, int64_t b, int64_t t,
                                    int64_t groups, int64_t d, int64_t taps, DType dtype) {
  FOUNDRY_CHECK(taps >= 1 && groups > 0 && d > 0 && b > 0 && t > 0);
  const int64_t channels = groups * d, rows = b * t, k = taps * d, pad = taps - 1;
  thread_local ScratchBuffer<unsigned char> y_buffer, dz_buffer;
  const StackedTaps ys(y_buffer, y, b, t, groups, d, taps, -pad, dtype);
  // dy(t) gets dz(t + pad − i)·W_i: the window after t, stacked from t onwards.
  const StackedTaps dzs(dz_buffer, dz, b, t, groups, d, taps, 0, dtype);
  const void* w = packed_taps(w1, groups, d, taps, /*for_input_gradient=*/true, dtype);
  for (int64_t g = 0; g < groups; ++g)
    matmul(dzs.group(g), weight_block(w, g, k, d, dtype),
           OutView{dy + g * d, {rows, d}, {channels, 1}});
  // dW[g][(i, ci), o] = Σ_rows [y(t − pad) ‖ … ‖ y(t)][g][(i, ci)] · dz(t)[g][o]
  thread_local ScratchBuffer<float> dw_buffer;
  float* dw = dw_buffer.get(groups * k * d);  // [G][(i, ci)][o]
  matmul(ys.groups_transposed(), dzs.tap_view(0, d), OutView{dw, {groups, k, d}, {k * d, d, 1}});
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t o = 0; o < d; ++o)
      for (int64_t ci = 0; ci < d; ++ci)
        for (int64_t i = 0; i < taps; ++i)
          dw1[((g * d + o) * d + ci) * taps + i] += dw[(g * k + i * d + ci) * d + o];
  detail::add_column_sums(db1, dz, rows, channels);
}

}  // namespace foundry::ops
