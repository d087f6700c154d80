// The CCA grouped convolution as oneDNN matmuls (kernels/cca.h).
//
// The sequences are copied into a padded buffer with t1 − 1 zero rows before each one, so a
// causal tap never reads across a sequence boundary. In padded rows, output row R reads input
// rows R − (t1 − 1) + i for taps i; every (tap, group) pair is then one plain 2-D product
// over all padded rows, [rows, d] × [d, d] with leading dimension C, and the rows of the padding
// are dropped when copying out.
#include <algorithm>
#include <cstring>
#include <vector>

#include "base/bf16.h"
#include "base/error.h"
#include "kernels/cca.h"
#include "kernels/gemm.h"
#include "kernels/kernel_support.h"

namespace foundry::ops {

namespace {

// [B, T, C] rows laid out as [B, pad + T, C] with `pad` zero rows before each sequence, in
// the GEMMs' input type.
class PaddedRows {
 public:
  PaddedRows(const float* x, int64_t b, int64_t t, int64_t channels, int64_t pad, DType dtype)
      : dtype_(dtype), channels_(channels) {
    const int64_t stride = pad + t, total = b * stride * channels;
    if (dtype == DType::bf16) {
      bf16_.assign(total, bf16{});
      for (int64_t s = 0; s < b; ++s)
        convert_to_bf16(x + s * t * channels, bf16_.data() + (s * stride + pad) * channels,
                        t * channels);
    } else {
      f32_.assign(total, 0.0f);
      for (int64_t s = 0; s < b; ++s)
        std::memcpy(f32_.data() + (s * stride + pad) * channels, x + s * t * channels,
                    t * channels * sizeof(float));
    }
  }
  // Element (row, column) in the GEMMs' type.
  const void* at(int64_t row, int64_t column) const {
    const int64_t offset = row * channels_ + column;
    if (dtype_ == DType::bf16) return bf16_.data() + offset;
    return f32_.data() + offset;
  }

 private:
  DType dtype_;
  int64_t channels_;
  std::vector<bf16> bf16_;
  std::vector<float> f32_;
};

// w1 [G·d (o), d (ci), t1] repacked per tap as [t1][G][o][ci] in the GEMMs' type.
class PackedTaps {
 public:
  PackedTaps(const float* w1, int64_t groups, int64_t d, int64_t taps, DType dtype)
      : dtype_(dtype), d_(d), groups_(groups) {
    std::vector<float> packed(taps * groups * d * d);
    for (int64_t row = 0; row < groups * d; ++row)  // row = g·d + o
      for (int64_t ci = 0; ci < d; ++ci)
        for (int64_t i = 0; i < taps; ++i)
          packed[(i * groups * d + row) * d + ci] = w1[(row * d + ci) * taps + i];
    if (dtype == DType::bf16) {
      bf16_.resize(packed.size());
      convert_to_bf16(packed.data(), bf16_.data(), static_cast<int64_t>(packed.size()));
    } else {
      f32_ = std::move(packed);
    }
  }
  // Tap i, group g: the [o, ci] matrix, row-major.
  const void* at(int64_t i, int64_t g) const {
    const int64_t offset = (i * groups_ + g) * d_ * d_;
    if (dtype_ == DType::bf16) return bf16_.data() + offset;
    return f32_.data() + offset;
  }

 private:
  DType dtype_;
  int64_t d_, groups_;
  std::vector<bf16> bf16_;
  std::vector<float> f32_;
};

}  // namespace

void cca_grouped_conv_forward_gemm(float* z, const float* y, const float* w1, const float* b1,
                                   int64_t b, int64_t t, int64_t groups, int64_t d,
                                   int64_t taps, DType dtype) {
  FOUNDRY_CHECK(taps >= 1 && groups > 0 && d > 0 && b > 0 && t > 0);
  const int64_t channels = groups * d, pad = taps - 1, stride = pad + t, total = b * stride;
  const PaddedRows yp(y, b, t, channels, pad, dtype);
  const PackedTaps w(w1, groups, d, taps, dtype);
  // Output row R (R ≥ pad) of the padded layout = Σ_i W_i · yp[R − pad + i].
  std::vector<float> out((total - pad) * channels);
  for (int64_t i = 0; i < taps; ++i)
    for (int64_t g = 0; g < groups; ++g)
      matmul(MatView::rows_major(yp.at(i, g * d), dtype, total - pad, d, channels),
             MatView::transposed(w.at(i, g), dtype, d, d),
             OutView::rows_major(out.data() + g * d, total - pad, d, channels),
             /*accumulate=*/i > 0);
  for (int64_t s = 0; s < b; ++s)
    for (int64_t r = 0; r < t; ++r) {
      const float* src = out.data() + (s * stride + r) * channels;  // padded row s·stride + pad + r
      float* dst = z + (s * t + r) * channels;
      for (int64_t ch = 0; ch < channels; ++ch) dst[ch] = src[ch] + b1[ch];
    }
}

void cca_grouped_conv_backward_gemm(float* dy, float* dw1, float* db1, const float* dz,
                                    const float* y, const float* w1, int64_t b, int64_t t,
                                    int64_t groups, int64_t d, int64_t taps, DType dtype) {
  FOUNDRY_CHECK(taps >= 1 && groups > 0 && d > 0 && b > 0 && t > 0);
  const int64_t channels = groups * d, pad = taps - 1, stride = pad + t, total = b * stride;
  const PaddedRows yp(y, b, t, channels, pad, dtype), dzp(dz, b, t, channels, pad, dtype);
  const PackedTaps w(w1, groups, d, taps, dtype);
  // dy: padded row S += Σ_i dzp[S + pad − i] · W_i, for the rows S + pad − i < total.
  std::vector<float> dyp(total * channels);
  for (int64_t i = taps - 1; i >= 0; --i)  // tap t1 − 1 covers every row: it writes first
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t rows = total - (pad - i);
      matmul(MatView::rows_major(dzp.at(pad - i, g * d), dtype, rows, d, channels),
             MatView::rows_major(w.at(i, g), dtype, d, d),
             OutView::rows_major(dyp.data() + g * d, rows, d, channels),
             /*accumulate=*/i < taps - 1);
    }
  for (int64_t s = 0; s < b; ++s)
    for (int64_t r = 0; r < t; ++r) {
      const float* src = dyp.data() + (s * stride + pad + r) * channels;
      float* dst = dy + (s * t + r) * channels;
      for (int64_t ch = 0; ch < channels; ++ch) dst[ch] += src[ch];
    }
  // dW_i[g] = Σ_R dzp[R][g]ᵀ · yp[R − pad + i][g] over R ≥ pad (padding rows of dz are zero).
  std::vector<float> dw(taps * groups * d * d);  // [t1][G][o][ci]
  for (int64_t i = 0; i < taps; ++i)
    for (int64_t g = 0; g < groups; ++g)
      matmul(MatView::transposed(dzp.at(pad, g * d), dtype, d, total - pad, channels),
             MatView::rows_major(yp.at(i, g * d), dtype, total - pad, d, channels),
             OutView::rows_major(dw.data() + (i * groups + g) * d * d, d, d));
  for (int64_t row = 0; row < groups * d; ++row)
    for (int64_t ci = 0; ci < d; ++ci)
      for (int64_t i = 0; i < taps; ++i)
        dw1[(row * d + ci) * taps + i] += dw[(i * groups * d + row) * d + ci];
  for (int64_t row = 0; row < b * t; ++row)
    for (int64_t ch = 0; ch < channels; ++ch) db1[ch] += dz[row * channels + ch];
}

}  // namespace foundry::ops
