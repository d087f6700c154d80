// The CCA grouped convolution as oneDNN matmuls (kernels/cca.h).
//
// The taps are stacked into the products' K dimension: for every row (b, t) and group g the
// GEMMs' input holds the taps' rows side by side, [x(t − pad) ‖ … ‖ x(t)] (pad = t1 − 1;
// positions outside the sequence are zero), in the GEMMs' type, group by group. The forward
// and the input gradient are then a [B·T, t1·d] × [t1·d, d] product per group, every row of
// the batch in M, run as one product batched over the groups into a dense scratch (the
// library's tile kernels want a dense output), where one product per tap of [T, d] × [d, d]
// blocks was far slower (docs/PERFORMANCE.md); the weight gradient is one product batched
// over the groups with K = B·T. In bf16 training with t1 ≤ 2 the depthwise convolution
// writes its output straight into the stacked rows, which the backward reuses.
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
// the window before each row, 0 for the window from it on), zero outside the sequence.
class StackedTaps {
 public:
  // A view of rows stacked in `data` ([G, rows, k] elements of `dtype`).
  StackedTaps(const void* data, int64_t groups, int64_t rows, int64_t k, DType dtype)
      : dtype_(dtype), groups_(groups), rows_(rows), k_(k),
        data_(static_cast<const unsigned char*>(data)) {}
  // Stacks x into a grow-only per-thread buffer.
  StackedTaps(ScratchBuffer<unsigned char>& buffer, const float* x, int64_t b, int64_t t,
              int64_t groups, int64_t d, int64_t taps, int64_t first, DType dtype)
      : StackedTaps(buffer.get(groups * b * t * taps * d * element_size(dtype)), groups, b * t,
                    taps * d, dtype) {
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows_; ++row) stack_row(x, row, t, d, first);
  }
  // The same, adding x's column sums to sums [G·d] in the order of kSumRows-row chunks.
  StackedTaps(ScratchBuffer<unsigned char>& buffer, float* sums, const float* x, int64_t b,
              int64_t t, int64_t groups, int64_t d, int64_t taps, int64_t first, DType dtype)
      : StackedTaps(buffer.get(groups * b * t * taps * d * element_size(dtype)), groups, b * t,
                    taps * d, dtype) {
    const int64_t channels = groups * d, chunks = (rows_ + kSumRows - 1) / kSumRows;
    thread_local ScratchBuffer<float> partial_buffer;
    float* partials = partial_buffer.get(chunks * channels);
#pragma omp parallel for schedule(static)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      float* partial = partials + chunk * channels;
      std::fill(partial, partial + channels, 0.0f);
      for (int64_t row = chunk * kSumRows; row < std::min(rows_, (chunk + 1) * kSumRows); ++row) {
        stack_row(x, row, t, d, first);
        const float* in = x + row * channels;
#pragma omp simd
        for (int64_t j = 0; j < channels; ++j) partial[j] += in[j];
      }
    }
    for (int64_t chunk = 0; chunk < chunks; ++chunk)
#pragma omp simd
      for (int64_t j = 0; j < channels; ++j) sums[j] += partials[chunk * channels + j];
  }
  // All groups, [G, rows, taps·d]; all groups transposed, [G, taps·d, rows]; one tap of
  // every group, [G, rows, d].
  MatView all_groups() const {
    return MatView{data_, dtype_, {groups_, rows_, k_}, {rows_ * k_, k_, 1}};
  }
  MatView groups_transposed() const {
    return MatView{data_, dtype_, {groups_, k_, rows_}, {rows_ * k_, 1, k_}};
  }
  MatView tap_view(int64_t tap, int64_t d) const {
    return MatView{data_ + tap * d * element_size(dtype_), dtype_, {groups_, rows_, d},
                   {rows_ * k_, k_, 1}};
  }

 private:
  static constexpr int64_t kSumRows = 64;

  // Row `row` of every group, its taps from x's rows row + first + i of the same sequence
  // (of t rows).
  void stack_row(const float* x, int64_t row, int64_t t, int64_t d, int64_t first) {
    const int64_t elem = element_size(dtype_), channels = groups_ * d, taps = k_ / d;
    const int64_t s = row / t, r = row % t;
    unsigned char* data = const_cast<unsigned char*>(data_);
    for (int64_t i = 0; i < taps; ++i) {
      const int64_t src = r + first + i;
      for (int64_t g = 0; g < groups_; ++g) {
        unsigned char* dst = data + ((g * rows_ + row) * k_ + i * d) * elem;
        if (src >= 0 && src < t)
          store_as(dtype_, x + (s * t + src) * channels + g * d, dst, d);
        else
          std::memset(dst, 0, d * elem);
      }
    }
  }

  DType dtype_;
  int64_t groups_, rows_, k_;
  const unsigned char* data_;
};

// The depthwise convolution's output y, row by row as cca_depthwise_conv_forward computes it,
// written only as the grouped convolution's stacked bf16 rows (first = −(t1−1)) into `data`:
// y itself never reaches memory in fp32.
StackedTaps depthwise_into_stacked_bf16(void* data, const float* c, const float* w0,
                                        const float* b0, int64_t b, int64_t t, int64_t groups,
                                        int64_t d, int64_t t0, int64_t t1) {
  const int64_t channels = groups * d, rows = b * t, k = t1 * d, pad = t1 - 1;
  thread_local ScratchBuffer<float> weight_buffer;
  float* wt = weight_buffer.get(t0 * channels);
  detail::cca_depthwise_taps_major(wt, w0, channels, t0);
  bf16* out = static_cast<bf16*>(data);
#pragma omp parallel
  {
    thread_local ScratchBuffer<float> row_buffer;
    float* y = row_buffer.get(channels);
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t r = row % t;
      detail::cca_depthwise_row(y, c + (row - r) * channels, wt, b0, r, channels, t0);
      // y(r) is tap i of row r + pad − i; the taps before a sequence's start are zero.
      for (int64_t i = 0; i < t1; ++i) {
        const int64_t to = r + pad - i;
        if (to < t)
          for (int64_t g = 0; g < groups; ++g)
            to_bf16_serial(y + g * d, out + (g * rows + row - r + to) * k + i * d, d);
        if (r < pad - i)
          for (int64_t g = 0; g < groups; ++g)
            std::fill_n(out + (g * rows + row) * k + i * d, d, bf16{});
      }
    }
  }
  return StackedTaps(data, groups, rows, k, DType::bf16);
}

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

// out [rows, G·d] (+ bias [G·d] when set) = each group's [rows, k] stacked rows × its
// [k, d] weight block, as one product batched over the groups into a dense [G, rows, d]
// scratch, then spread over the groups' columns. A product written straight into the
// columns, d of every G·d, runs on the library's slower path (its kernels for tiles want a
// dense output): about 2× the time on AMX.
// The product alone: dense [G, rows, d] (valid until the next call on this thread).
const float* grouped_products_dense(const StackedTaps& stacked, const void* w, int64_t groups,
                                    int64_t rows, int64_t k, int64_t d, DType dtype) {
  thread_local ScratchBuffer<float> dense_buffer;
  float* dense = dense_buffer.get(groups * rows * d);
  matmul(stacked.all_groups(), MatView{w, dtype, {groups, k, d}, {k * d, d, 1}},
         OutView{dense, {groups, rows, d}, {rows * d, d, 1}});
  return dense;
}

// out [rows, G·d] (+ bias [G·d] when set) from the products' dense output [G, rows, d].
void spread_groups(float* out, const float* bias, const float* dense, int64_t groups,
                   int64_t rows, int64_t d) {
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row)
    detail::cca_group_row(out + row * groups * d, dense, bias, row, groups, rows, d);
}

void grouped_products(float* out, const float* bias, const StackedTaps& stacked,
                      const void* w, int64_t groups, int64_t rows, int64_t k, int64_t d,
                      DType dtype) {
  spread_groups(out, bias, grouped_products_dense(stacked, w, groups, rows, k, d, dtype), groups,
                rows, d);
}

}  // namespace

void cca_grouped_conv_forward_gemm(float* z, const float* y, const float* w1, const float* b1,
                                   int64_t b, int64_t t, int64_t groups, int64_t d,
                                   int64_t taps, DType dtype) {
  FOUNDRY_CHECK(taps >= 1 && groups > 0 && d > 0 && b > 0 && t > 0);
  const int64_t rows = b * t, k = taps * d, pad = taps - 1;
  thread_local ScratchBuffer<unsigned char> y_buffer;
  const StackedTaps ys(y_buffer, y, b, t, groups, d, taps, -pad, dtype);
  const void* w = packed_taps(w1, groups, d, taps, /*for_input_gradient=*/false, dtype);
  // z[row, g] = (b1[g] +) [y(t − pad) ‖ … ‖ y(t)][g] · W[g]
  grouped_products(z, b1, ys, w, groups, rows, k, d, dtype);
}

namespace {

// The grouped convolution's backward from the stacked y rows `ys` (see below), with dy left
// group-major in the products' dense output [G, B·T, d] (returned; valid until the next call
// on this thread).
const float* grouped_conv_backward_dense(float* dw1, float* db1, const float* dz,
                                         const StackedTaps& ys, const float* w1, int64_t b,
                                         int64_t t, int64_t groups, int64_t d, int64_t taps,
                                         DType dtype) {
  const int64_t rows = b * t, k = taps * d;
  thread_local ScratchBuffer<unsigned char> dz_buffer;
  // dy(t) gets dz(t + pad − i)·W_i: the window after t, stacked from t onwards; db1 from the
  // same pass over dz.
  const StackedTaps dzs(dz_buffer, db1, dz, b, t, groups, d, taps, 0, dtype);
  const void* w = packed_taps(w1, groups, d, taps, /*for_input_gradient=*/true, dtype);
  const float* dy = grouped_products_dense(dzs, w, groups, rows, k, d, dtype);
  // dW[g][(i, ci), o] = Σ_rows [y(t − pad) ‖ … ‖ y(t)][g][(i, ci)] · dz(t)[g][o]
  thread_local ScratchBuffer<float> dw_buffer;
  float* dw = dw_buffer.get(groups * k * d);  // [G][(i, ci)][o]
  matmul(ys.groups_transposed(), dzs.tap_view(0, d), OutView{dw, {groups, k, d}, {k * d, d, 1}});
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t o = 0; o < d; ++o)
      for (int64_t ci = 0; ci < d; ++ci)
        for (int64_t i = 0; i < taps; ++i)
          dw1[((g * d + o) * d + ci) * taps + i] += dw[(g * k + i * d + ci) * d + o];
  return dy;
}

// The same with dy [B·T, G·d] written.
void grouped_conv_backward(float* dy, float* dw1, float* db1, const float* dz,
                           const StackedTaps& ys, const float* w1, int64_t b, int64_t t,
                           int64_t groups, int64_t d, int64_t taps, DType dtype) {
  spread_groups(dy, nullptr,
                grouped_conv_backward_dense(dw1, db1, dz, ys, w1, b, t, groups, d, taps, dtype),
                groups, b * t, d);
}

}  // namespace

void cca_grouped_conv_backward_gemm(float* dy, float* dw1, float* db1, const float* dz,
                                    const float* y, const float* w1, int64_t b, int64_t t,
                                    int64_t groups, int64_t d, int64_t taps, DType dtype) {
  FOUNDRY_CHECK(taps >= 1 && groups > 0 && d > 0 && b > 0 && t > 0);
  thread_local ScratchBuffer<unsigned char> y_buffer;
  const StackedTaps ys(y_buffer, y, b, t, groups, d, taps, -(taps - 1), dtype);
  grouped_conv_backward(dy, dw1, db1, dz, ys, w1, b, t, groups, d, taps, dtype);
}

bool cca_convs_fused(int64_t t1, DType dtype) { return dtype == DType::bf16 && t1 <= 2; }

void cca_convs_forward_gemm(float* qk, float* kept, const float* c, const float* w0,
                            const float* b0, const float* w1, int64_t b, int64_t t,
                            int64_t groups, int64_t d, int64_t t0, int64_t t1) {
  FOUNDRY_CHECK(cca_convs_fused(t1, DType::bf16) && t1 >= 1 && t0 >= 1 && groups > 0 && d > 0 &&
                b > 0 && t > 0);
  const StackedTaps ys = depthwise_into_stacked_bf16(kept, c, w0, b0, b, t, groups, d, t0, t1);
  const void* w = packed_taps(w1, groups, d, t1, /*for_input_gradient=*/false, DType::bf16);
  grouped_products(qk, nullptr, ys, w, groups, b * t, t1 * d, d, DType::bf16);
}

void cca_convs_qk_norm_forward_gemm(float* q, float* k, float* rnorm, float* qk, float* kept,
                                    const float* c, const float* w0, const float* b0,
                                    const float* w1, const float* b1, const float* temp,
                                    int64_t b, int64_t t, int64_t hq, int64_t hk, int64_t d,
                                    int64_t t0, int64_t t1, float eps) {
  const int64_t groups = hq + hk;
  FOUNDRY_CHECK(cca_convs_fused(t1, DType::bf16) && t1 >= 1 && t0 >= 1 && hq > 0 && hk > 0 &&
                d > 0 && b > 0 && t > 0);
  const StackedTaps ys = depthwise_into_stacked_bf16(kept, c, w0, b0, b, t, groups, d, t0, t1);
  const void* w = packed_taps(w1, groups, d, t1, /*for_input_gradient=*/false, DType::bf16);
  const float* qk_groups = grouped_products_dense(ys, w, groups, b * t, t1 * d, d, DType::bf16);
  cca_means_qk_norm_forward_grouped(q, k, rnorm, qk, qk_groups, c, b1, temp, b * t, hq, hk, d,
                                    eps);
}

void cca_convs_backward_gemm(float* dc, float* dw0, float* db0, float* dw1, float* db1,
                             float* dy, const float* dqk, const float* kept, const float* c,
                             const float* w0, const float* w1, int64_t b, int64_t t,
                             int64_t groups, int64_t d, int64_t t0, int64_t t1) {
  FOUNDRY_CHECK(cca_convs_fused(t1, DType::bf16) && t1 >= 1 && t0 >= 1 && groups > 0 && d > 0 &&
                b > 0 && t > 0);
  const StackedTaps ys(kept, groups, b * t, t1 * d, DType::bf16);
  // dy stays in the products' group-major output, which the depthwise backward reads.
  const float* dy_groups =
      grouped_conv_backward_dense(dw1, db1, dqk, ys, w1, b, t, groups, d, t1, DType::bf16);
  cca_depthwise_conv_backward_grouped(dc, dw0, db0, dy_groups, c, w0, b, t, groups, d, t0);
}

}  // namespace foundry::ops
