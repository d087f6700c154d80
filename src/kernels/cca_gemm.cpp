// The CCA grouped convolution as oneDNN matmuls (kernels/cca.h).
//
// The sequences are copied, in the GEMMs' input type, into a padded buffer with pad = t1 − 1
// zero rows before each one and pad more after the last: stride = pad + T rows a sequence.
// A causal tap then never reads across a sequence boundary, and every tap is ONE batched
// product over [sequences, groups] of [T, d] × [d, d], reading the padded rows at the tap's
// offset and writing (or adding into) the caller's unpadded rows directly. The weight
// gradient of a tap is one batched product over the groups with K = all padded rows.
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

// x [B, T, C] as [B, pad + T, C] plus pad trailing rows, zero outside the sequences, in the
// GEMMs' type; kept in a grow-only per-thread buffer (one per purpose).
class PaddedRows {
 public:
  PaddedRows(ScratchBuffer<unsigned char>& buffer, const float* x, int64_t b, int64_t t,
             int64_t channels, int64_t pad, DType dtype)
      : dtype_(dtype), channels_(channels), stride_(pad + t) {
    const int64_t rows = b * stride_ + pad, elem = element_size(dtype);
    data_ = buffer.get(rows * channels * elem);
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t s = row / stride_, r = row % stride_ - pad;
      unsigned char* dst = data_ + row * channels * elem;
      if (s < b && r >= 0)
        store_as(dtype, x + (s * t + r) * channels, dst, channels);
      else
        std::memset(dst, 0, channels * elem);
    }
  }
  DType dtype() const { return dtype_; }
  int64_t stride() const { return stride_; }  // rows per sequence
  // Element (padded row, column).
  const void* at(int64_t row, int64_t column) const {
    return data_ + (row * channels_ + column) * element_size(dtype_);
  }

 private:
  DType dtype_;
  int64_t channels_, stride_;
  unsigned char* data_ = nullptr;
};

// w1 [G·d (o), d (ci), t1] repacked per tap as [t1][G][o][ci] in the GEMMs' type.
class PackedTaps {
 public:
  PackedTaps(const float* w1, int64_t groups, int64_t d, int64_t taps, DType dtype)
      : dtype_(dtype), d_(d), groups_(groups) {
    thread_local ScratchBuffer<float> packed;
    thread_local ScratchBuffer<unsigned char> converted;
    const int64_t n = taps * groups * d * d;
    float* out = packed.get(n);
    for (int64_t row = 0; row < groups * d; ++row)  // row = g·d + o
      for (int64_t ci = 0; ci < d; ++ci)
        for (int64_t i = 0; i < taps; ++i)
          out[(i * groups * d + row) * d + ci] = w1[(row * d + ci) * taps + i];
    data_ = converted.get(n * element_size(dtype));
    store_as(dtype, out, data_, n);
  }
  // Tap i: [1, G, o, ci] (transposed: [1, G, ci, o]) for a product batched over
  // [sequences, groups].
  MatView tap(int64_t i, bool transposed) const {
    const int64_t dd = d_ * d_;
    const void* base = data_ + i * groups_ * dd * element_size(dtype_);
    if (transposed) return MatView{base, dtype_, {1, groups_, d_, d_}, {groups_ * dd, dd, 1, d_}};
    return MatView{base, dtype_, {1, groups_, d_, d_}, {groups_ * dd, dd, d_, 1}};
  }

 private:
  DType dtype_;
  int64_t d_, groups_;
  unsigned char* data_ = nullptr;
};

// [B, G, T, d]: T rows of each sequence from padded row `first` of it, one group per batch.
MatView sequence_groups(const PaddedRows& x, int64_t first, int64_t b, int64_t t,
                        int64_t groups, int64_t d) {
  const int64_t channels = groups * d;
  return MatView{x.at(first, 0), x.dtype(), {b, groups, t, d},
                 {x.stride() * channels, d, channels, 1}};
}

// The caller's [B, T, G·d] rows as [B, G, T, d].
OutView unpadded_groups(float* x, int64_t b, int64_t t, int64_t groups, int64_t d) {
  const int64_t channels = groups * d;
  return OutView{x, {b, groups, t, d}, {t * channels, d, channels, 1}};
}

}  // namespace

void cca_grouped_conv_forward_gemm(float* z, const float* y, const float* w1, const float* b1,
                                   int64_t b, int64_t t, int64_t groups, int64_t d,
                                   int64_t taps, DType dtype) {
  FOUNDRY_CHECK(taps >= 1 && groups > 0 && d > 0 && b > 0 && t > 0);
  const int64_t channels = groups * d, pad = taps - 1;
  thread_local ScratchBuffer<unsigned char> y_buffer;
  const PaddedRows yp(y_buffer, y, b, t, channels, pad, dtype);
  const PackedTaps w(w1, groups, d, taps, dtype);
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < b * t; ++row) std::copy_n(b1, channels, z + row * channels);
  // z[s, r] += Σ_i W_i · y[s, r − pad + i]: padded row r + i of sequence s.
  for (int64_t i = 0; i < taps; ++i)
    matmul(sequence_groups(yp, i, b, t, groups, d), w.tap(i, /*transposed=*/true),
           unpadded_groups(z, b, t, groups, d), /*accumulate=*/true);
}

void cca_grouped_conv_backward_gemm(float* dy, float* dw1, float* db1, const float* dz,
                                    const float* y, const float* w1, int64_t b, int64_t t,
                                    int64_t groups, int64_t d, int64_t taps, DType dtype) {
  FOUNDRY_CHECK(taps >= 1 && groups > 0 && d > 0 && b > 0 && t > 0);
  const int64_t channels = groups * d, pad = taps - 1;
  thread_local ScratchBuffer<unsigned char> y_buffer, dz_buffer;
  const PaddedRows yp(y_buffer, y, b, t, channels, pad, dtype);
  const PaddedRows dzp(dz_buffer, dz, b, t, channels, pad, dtype);
  const PackedTaps w(w1, groups, d, taps, dtype);
  // dy[s, r] += Σ_i dz[s, r + pad − i] · W_i: padded row 2·pad − i + r of sequence s (rows
  // past the sequence's end land in the zero rows after it).
  for (int64_t i = 0; i < taps; ++i)
    matmul(sequence_groups(dzp, 2 * pad - i, b, t, groups, d), w.tap(i, /*transposed=*/false),
           unpadded_groups(dy, b, t, groups, d), /*accumulate=*/true);
  // dW_i[g] = Σ_R dzp[R][g]ᵀ · yp[R − pad + i][g] over padded rows R ≥ pad (dz's padding rows
  // are zero): per tap one product batched over the groups, K = the padded rows.
  const int64_t k = b * yp.stride() - pad, dd = d * d;
  thread_local ScratchBuffer<float> dw_buffer;
  float* dw = dw_buffer.get(taps * groups * dd);  // [t1][G][o][ci]
  for (int64_t i = 0; i < taps; ++i)
    matmul(MatView{dzp.at(pad, 0), dtype, {groups, d, k}, {d, 1, channels}},
           MatView{yp.at(i, 0), dtype, {groups, k, d}, {d, channels, 1}},
           OutView{dw + i * groups * dd, {groups, d, d}, {dd, d, 1}});
  for (int64_t row = 0; row < groups * d; ++row)
    for (int64_t ci = 0; ci < d; ++ci)
      for (int64_t i = 0; i < taps; ++i)
        dw1[(row * d + ci) * taps + i] += dw[(i * groups * d + row) * d + ci];
  detail::add_column_sums(db1, dz, b * t, channels);
}

}  // namespace foundry::ops
