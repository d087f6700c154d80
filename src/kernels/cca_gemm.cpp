// The CCA grouped convolution as oneDNN matmuls (kernels/cca.h).
//
// The sequences are copied into a padded buffer with t1 − 1 zero rows before each one, so a
// causal tap never reads across a sequence boundary. In padded rows, output row R reads input
// rows R − (t1 − 1) + i for taps i; every (tap, group) pair is then one plain 2-D product
// over all padded rows, [rows, d] × [d, d] with leading dimension C, and the rows of the padding
// are dropped when copying out.
#include <algorithm>
#include <vector>

#include "base/bf16.h"
#include "base/error.h"
#include "kernels/cca.h"
#include "kernels/gemm.h"

namespace foundry::ops {

namespace {

// Floats in the GEMMs' input type: kept as fp32, or converted to bf16.
class GemmOperand {
 public:
  GemmOperand(std::vector<float> values, DType dtype) : dtype_(dtype) {
    if (dtype == DType::bf16) {
      bf16_.resize(values.size());
      convert_to_bf16(values.data(), bf16_.data(), static_cast<int64_t>(values.size()));
    } else {
      f32_ = std::move(values);
    }
  }
  const void* at(int64_t offset) const {
    if (dtype_ == DType::bf16) return bf16_.data() + offset;
    return f32_.data() + offset;
  }

 private:
  DType dtype_;
  std::vector<bf16> bf16_;
  std::vector<float> f32_;
};

// [B, T, C] rows laid out as [B, pad + T, C] with `pad` zero rows before each sequence.
class PaddedRows {
 public:
  PaddedRows(const float* x, int64_t b, int64_t t, int64_t channels, int64_t pad, DType dtype)
      : channels_(channels), data_(padded(x, b, t, channels, pad), dtype) {}
  // Element (row, column) in the GEMMs' type.
  const void* at(int64_t row, int64_t column) const { return data_.at(row * channels_ + column); }

 private:
  static std::vector<float> padded(const float* x, int64_t b, int64_t t, int64_t channels,
                                   int64_t pad) {
    std::vector<float> out(b * (pad + t) * channels, 0.0f);
    for (int64_t s = 0; s < b; ++s)
      std::copy_n(x + s * t * channels, t * channels, out.data() + (s * (pad + t) + pad) * channels);
    return out;
  }
  int64_t channels_;
  GemmOperand data_;
};

// w1 [G·d (o), d (ci), t1] repacked per tap as [t1][G][o][ci].
class PackedTaps {
 public:
  PackedTaps(const float* w1, int64_t groups, int64_t d, int64_t taps, DType dtype)
      : d_(d), groups_(groups), data_(packed(w1, groups, d, taps), dtype) {}
  // Tap i, group g: the [o, ci] matrix, row-major.
  const void* at(int64_t i, int64_t g) const { return data_.at((i * groups_ + g) * d_ * d_); }

 private:
  static std::vector<float> packed(const float* w1, int64_t groups, int64_t d, int64_t taps) {
    std::vector<float> out(taps * groups * d * d);
    for (int64_t row = 0; row < groups * d; ++row)  // row = g·d + o
      for (int64_t ci = 0; ci < d; ++ci)
        for (int64_t i = 0; i < taps; ++i)
          out[(i * groups * d + row) * d + ci] = w1[(row * d + ci) * taps + i];
    return out;
  }
  int64_t d_, groups_;
  GemmOperand data_;
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
