// The CCA grouped convolution as oneDNN matmuls (kernels/cca.h).
//
// The taps are stacked into the products' K dimension: for every row (b, t) and group g the
// GEMMs' input holds the taps' rows side by side, [x(t − pad) ‖ … ‖ x(t)] (pad = t1 − 1;
// positions before the sequence hold `before`, b0 for the CCA, and positions after it zero),
// in the GEMMs' type, group by group. The forward
// and the input gradient are then a [rows, t1·d] × [t1·d, d] product per group, run as one
// product batched over the groups into a dense scratch (the library's tile kernels want dense
// batches and a dense output), where one product per tap of [T, d] × [d, d] blocks was far
// slower (docs/PERFORMANCE.md); the weight gradient is one product batched over the groups
// with K = B·T. The _gemm forms put every row of the batch in M. A bf16 training step (t1 ≤ 2)
// runs its forward and input gradient per block of 128 positions of a sequence instead, each
// block's stacked rows, products and norms in cache, with the depthwise convolution written
// straight into the stacked rows, which the backward reuses.
#include <algorithm>
#include <cstring>
#include <vector>

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

// Column sums over rows (the grouped convolution's bias gradient) in a fixed order: chunks of
// kBiasSumRows positions of each sequence, in (sequence, position) order, each summed row by row
// from zero, then the chunks' sums added in that order.
constexpr int64_t kBiasSumRows = 64;

int64_t bias_sum_chunks(int64_t b, int64_t t) {
  return b * ((t + kBiasSumRows - 1) / kBiasSumRows);
}

// partial [cols] (written) = the sums of rows [rows, cols] row by row.
void column_sums(float* partial, const float* x, int64_t rows, int64_t cols) {
  std::fill(partial, partial + cols, 0.0f);
  for (int64_t row = 0; row < rows; ++row)
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) partial[j] += x[row * cols + j];
}

void add_chunk_sums(float* sums, const float* partials, int64_t chunks, int64_t cols) {
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) sums[j] += partials[chunk * cols + j];
}

// Stacked rows: x [B, T, G·d] as [G, B·T, taps·d] in the GEMMs' type, where group g, row
// (b, t) holds [x(b, t + first) ‖ x(b, t + first + 1) ‖ …] over the taps (first: −pad for
// the window before each row, 0 for the window from it on), `before` [G·d] before the
// sequence (zero where it is null) and zero after it.
class StackedTaps {
 public:
  // A view of rows stacked in `data` ([G, rows, k] elements of `dtype`).
  StackedTaps(const void* data, int64_t groups, int64_t rows, int64_t k, DType dtype)
      : dtype_(dtype), groups_(groups), rows_(rows), k_(k),
        data_(static_cast<const unsigned char*>(data)) {}
  // Stacks x into a grow-only per-thread buffer.
  StackedTaps(ScratchBuffer<unsigned char>& buffer, const float* x, const float* before, int64_t b,
              int64_t t, int64_t groups, int64_t d, int64_t taps, int64_t first, DType dtype)
      : StackedTaps(buffer.get(groups * b * t * taps * d * element_size(dtype)), groups, b * t,
                    taps * d, dtype) {
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows_; ++row) stack_row(x, before, row, t, d, first);
  }
  // The same, adding x's column sums to sums [G·d] in the order of bias_sum_chunks.
  StackedTaps(ScratchBuffer<unsigned char>& buffer, float* sums, const float* x, int64_t b,
              int64_t t, int64_t groups, int64_t d, int64_t taps, int64_t first, DType dtype)
      : StackedTaps(buffer.get(groups * b * t * taps * d * element_size(dtype)), groups, b * t,
                    taps * d, dtype) {
    const int64_t channels = groups * d, per_sequence = bias_sum_chunks(1, t);
    const int64_t chunks = bias_sum_chunks(b, t);
    thread_local ScratchBuffer<float> partial_buffer;
    float* partials = partial_buffer.get(chunks * channels);
#pragma omp parallel for schedule(static)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t first_row = chunk / per_sequence * t + chunk % per_sequence * kBiasSumRows;
      const int64_t end = std::min(first_row + kBiasSumRows, (chunk / per_sequence + 1) * t);
      for (int64_t row = first_row; row < end; ++row) stack_row(x, nullptr, row, t, d, first);
      column_sums(partials + chunk * channels, x + first_row * channels, end - first_row, channels);
    }
    add_chunk_sums(sums, partials, chunks, channels);
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
  // Row `row` of every group, its taps from x's rows row + first + i of the same sequence
  // (of t rows).
  void stack_row(const float* x, const float* before, int64_t row, int64_t t, int64_t d,
                 int64_t first) {
    const int64_t elem = element_size(dtype_), channels = groups_ * d, taps = k_ / d;
    const int64_t s = row / t, r = row % t;
    unsigned char* data = const_cast<unsigned char*>(data_);
    for (int64_t i = 0; i < taps; ++i) {
      const int64_t src = r + first + i;
      for (int64_t g = 0; g < groups_; ++g) {
        unsigned char* dst = data + ((g * rows_ + row) * k_ + i * d) * elem;
        if (src >= 0 && src < t)
          store_as(dtype_, x + (s * t + src) * channels + g * d, dst, d);
        else if (src < 0 && before)
          store_as(dtype_, before + g * d, dst, d);
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
      // y(r) is tap i of row r + pad − i; the taps before a sequence's start are b0.
      for (int64_t i = 0; i < t1; ++i) {
        const int64_t to = r + pad - i;
        if (to < t)
          for (int64_t g = 0; g < groups; ++g)
            to_bf16_serial(y + g * d, out + (g * rows + row - r + to) * k + i * d, d);
        if (r < pad - i)
          for (int64_t g = 0; g < groups; ++g)
            to_bf16_serial(b0 + g * d, out + (g * rows + row) * k + i * d, d);
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
                                   const float* before, int64_t b, int64_t t, int64_t groups,
                                   int64_t d, int64_t taps, DType dtype) {
  FOUNDRY_CHECK(taps >= 1 && groups > 0 && d > 0 && b > 0 && t > 0);
  const int64_t rows = b * t, k = taps * d, pad = taps - 1;
  thread_local ScratchBuffer<unsigned char> y_buffer;
  const StackedTaps ys(y_buffer, y, before, b, t, groups, d, taps, -pad, dtype);
  const void* w = packed_taps(w1, groups, d, taps, /*for_input_gradient=*/false, dtype);
  // z[row, g] = (b1[g] +) [y(t − pad) ‖ … ‖ y(t)][g] · W[g]
  grouped_products(z, b1, ys, w, groups, rows, k, d, dtype);
}

namespace {

// dw1 [G·d (o), d (ci), t1] += dw [G][(i, ci)][o], the weight gradient's product.
void add_weight_gradient(float* dw1, const float* dw, int64_t groups, int64_t d, int64_t taps) {
  const int64_t k = taps * d;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t o = 0; o < d; ++o)
      for (int64_t ci = 0; ci < d; ++ci)
        for (int64_t i = 0; i < taps; ++i)
          dw1[((g * d + o) * d + ci) * taps + i] += dw[(g * k + i * d + ci) * d + o];
}

// The grouped convolution's backward from the stacked y rows `ys` (see below), with dy left
// group-major in the products' dense output [G, B·T, d] (returned; valid until the next call
// on this thread); dbefore (unless null) += the gradient of the rows before each sequence.
const float* grouped_conv_backward_dense(float* dw1, float* db1, float* dbefore, const float* dz,
                                         const StackedTaps& ys, const float* w1, int64_t b,
                                         int64_t t, int64_t groups, int64_t d, int64_t taps,
                                         DType dtype) {
  const int64_t rows = b * t, k = taps * d;
  thread_local ScratchBuffer<unsigned char> dz_buffer;
  // dy(t) gets dz(t + pad − i)·W_i: the window after t, stacked from t onwards; db1 from the
  // same pass over dz.
  const StackedTaps dzs(dz_buffer, db1, dz, b, t, groups, d, taps, 0, dtype);
  if (dbefore) cca_grouped_conv_before_backward(dbefore, dz, t, w1, b, t, groups, d, taps);
  const void* w = packed_taps(w1, groups, d, taps, /*for_input_gradient=*/true, dtype);
  const float* dy = grouped_products_dense(dzs, w, groups, rows, k, d, dtype);
  // dW[g][(i, ci), o] = Σ_rows [y(t − pad) ‖ … ‖ y(t)][g][(i, ci)] · dz(t)[g][o]
  thread_local ScratchBuffer<float> dw_buffer;
  float* dw = dw_buffer.get(groups * k * d);  // [G][(i, ci)][o]
  matmul(ys.groups_transposed(), dzs.tap_view(0, d), OutView{dw, {groups, k, d}, {k * d, d, 1}});
  add_weight_gradient(dw1, dw, groups, d, taps);
  return dy;
}

}  // namespace

void cca_grouped_conv_backward_gemm(float* dy, float* dw1, float* db1, float* dbefore,
                                    const float* dz, const float* y, const float* w1,
                                    const float* before, int64_t b, int64_t t, int64_t groups,
                                    int64_t d, int64_t taps, DType dtype) {
  FOUNDRY_CHECK(taps >= 1 && groups > 0 && d > 0 && b > 0 && t > 0);
  thread_local ScratchBuffer<unsigned char> y_buffer;
  const StackedTaps ys(y_buffer, y, before, b, t, groups, d, taps, -(taps - 1), dtype);
  spread_groups(
      dy, nullptr,
      grouped_conv_backward_dense(dw1, db1, dbefore, dz, ys, w1, b, t, groups, d, taps, dtype),
      groups, b * t, d);
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

namespace {

// A training step's CCA runs its rows in blocks: each sequence's positions in runs of at most
// kBlockRows, one task per block, so that a block's stacked rows, its products and the norms
// read from them stay in the core's cache (at zaya-bench's shape: 320 KB each) instead of
// going to memory as whole-batch arrays between passes (docs/PERFORMANCE.md).
constexpr int64_t kBlockRows = detail::kCcaRowsPerBlock;
static_assert(kBlockRows % kBiasSumRows == 0, "a block's bias-sum chunks are whole");

struct RowBlock {
  int64_t row;  // its first row, b·T + position
  int64_t pos;  // that row's position in its sequence
  int64_t rows;
};

std::vector<RowBlock> row_blocks(int64_t b, int64_t t) {
  std::vector<RowBlock> blocks;
  for (int64_t s = 0; s < b; ++s)
    for (int64_t pos = 0; pos < t; pos += kBlockRows)
      blocks.push_back({s * t + pos, pos, std::min(kBlockRows, t - pos)});
  return blocks;
}

// The grouped convolution's stacked bf16 rows of one block, out [G, rows, t1·d], from the
// depthwise output y of its rows and the t1 − 1 before them, each y row computed as
// cca_depthwise_conv_forward does (into `y`, [C] floats of scratch); the taps before the
// sequence's start are b0. wt: the depthwise weights tap-major.
void depthwise_block_into_stacked_bf16(bf16* out, float* y, const RowBlock& blk, const float* c,
                                       const float* wt, const float* b0, int64_t groups, int64_t d,
                                       int64_t t0, int64_t t1) {
  const int64_t channels = groups * d, k = t1 * d, pad = t1 - 1, n = blk.rows;
  const float* c_seq = c + (blk.row - blk.pos) * channels;
  for (int64_t r = std::max<int64_t>(0, blk.pos - pad); r < blk.pos + n; ++r) {
    detail::cca_depthwise_row(y, c_seq, wt, b0, r, channels, t0);
    for (int64_t i = 0; i < t1; ++i) {  // y(r) is tap i of row r + pad − i
      const int64_t to = r + pad - i - blk.pos;
      if (to >= 0 && to < n)
        for (int64_t g = 0; g < groups; ++g)
          to_bf16_serial(y + g * d, out + (g * n + to) * k + i * d, d);
    }
  }
  for (int64_t to = 0; to < std::min(n, pad - blk.pos); ++to)
    for (int64_t i = 0; blk.pos + to - pad + i < 0; ++i)
      for (int64_t g = 0; g < groups; ++g)
        to_bf16_serial(b0 + g * d, out + (g * n + to) * k + i * d, d);
}

}  // namespace

void cca_convs_qk_norm_forward_gemm(float* q, float* k, float* rnorm, float* qk, float* kept,
                                    const float* c, const float* w0, const float* b0,
                                    const float* w1, const float* b1, const float* temp, int64_t b,
                                    int64_t t, int64_t hq, int64_t hk, int64_t d, int64_t t0,
                                    int64_t t1, float eps) {
  const int64_t groups = hq + hk, channels = groups * d, rows = b * t, width = t1 * d;
  FOUNDRY_CHECK(cca_convs_fused(t1, DType::bf16) && t1 >= 1 && t0 >= 1 && hq > 0 && hk > 0 &&
                d > 0 && b > 0 && t > 0);
  thread_local ScratchBuffer<float> weight_buffer;
  float* wt = weight_buffer.get(t0 * channels);
  detail::cca_depthwise_taps_major(wt, w0, channels, t0);
  const void* w = packed_taps(w1, groups, d, t1, /*for_input_gradient=*/false, DType::bf16);
  bf16* stacked_all = reinterpret_cast<bf16*>(kept);  // [G, B·T, t1·d] for the backward
  const std::vector<RowBlock> blocks = row_blocks(b, t);
  // The block's stacked rows go to a dense scratch first: a product reading them in place in
  // `kept` would have strided batches, which oneDNN 2.6 runs on its GEMM driver, not AMX.
  run_side_by_side(static_cast<int64_t>(blocks.size()), [&](int64_t i) {
    const RowBlock& blk = blocks[i];
    const int64_t n = blk.rows;
    thread_local ScratchBuffer<bf16> stacked_buffer;
    thread_local ScratchBuffer<float> dense_buffer, y_buffer;
    bf16* stacked = stacked_buffer.get(groups * kBlockRows * width);
    float* dense = dense_buffer.get(groups * kBlockRows * d);
    depthwise_block_into_stacked_bf16(stacked, y_buffer.get(channels), blk, c, wt, b0, groups, d,
                                      t0, t1);
    for (int64_t g = 0; g < groups; ++g)
      std::memcpy(stacked_all + (g * rows + blk.row) * width, stacked + g * n * width,
                  n * width * sizeof(bf16));
    matmul(MatView{stacked, DType::bf16, {groups, n, width}, {n * width, width, 1}},
           MatView{w, DType::bf16, {groups, width, d}, {width * d, d, 1}},
           OutView{dense, {groups, n, d}, {n * d, d, 1}});
    detail::cca_means_qk_norm_grouped_rows(q, k, rnorm, qk, dense, n, c, b1, temp, blk.row,
                                           blk.row + n, hq, hk, d, eps);
  });
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
      grouped_conv_backward_dense(dw1, db1, db0, dqk, ys, w1, b, t, groups, d, t1, DType::bf16);
  cca_depthwise_conv_backward_grouped(dc, dw0, db0, dy_groups, c, w0, b, t, groups, d, t0);
}

namespace {

// cca_qk_norm_convs_backward_gemm: one task per block of rows, then the sums and the weight
// gradient's product over every row.
class BlockedBackward {
 public:
  struct Inputs {
    const float *dq, *dk, *qk, *rnorm, *temp, *kept, *c, *w0, *w1;
  };
  struct Outputs {
    float *dc, *dtemp, *dw0, *db0, *dw1, *db1;
  };

  BlockedBackward(const Inputs& in, const Outputs& out, float* scratch, int64_t b, int64_t t,
                  int64_t hq, int64_t hk, int64_t d, int64_t t0, int64_t t1)
      : in_(in),
        out_(out),
        b_(b),
        t_(t),
        hq_(hq),
        hk_(hk),
        d_(d),
        t0_(t0),
        t1_(t1),
        groups_(hq + hk),
        channels_(groups_ * d),
        rows_(b * t),
        width_(t1 * d),
        blocks_(row_blocks(b, t)),
        dz_all_(reinterpret_cast<bf16*>(scratch)) {
    thread_local ScratchBuffer<float> weight_buffer, row_dtemp_buffer, depthwise_buffer,
        bias_buffer, first_rows_buffer;
    wt_ = weight_buffer.get(t0 * channels_);
    detail::cca_depthwise_taps_major(wt_, in.w0, channels_, t0);
    w_ = packed_taps(in.w1, groups_, d, t1, /*for_input_gradient=*/true, DType::bf16);
    row_dtemp_ = row_dtemp_buffer.get(rows_ * hk);
    depthwise_partials_ =
        depthwise_buffer.get(static_cast<int64_t>(blocks_.size()) * depthwise_sums());
    bias_partials_ = bias_buffer.get(bias_sum_chunks(b, t) * channels_);
    first_rows_ = first_rows_buffer.get(std::max<int64_t>(1, b * first_rows() * channels_));
  }

  const std::vector<RowBlock>& blocks() const { return blocks_; }

  // Task i: dz of the block's rows and of the rows after it that its windows read, then its
  // rows' dc, their dy and the depthwise backward over them.
  void block(int64_t i) {
    const RowBlock& blk = blocks_[i];
    const int64_t rows_left = t_ - blk.pos;  // in the sequence, from the block's first
    const int64_t dy_rows = std::min(rows_left, blk.rows + t0_ - 1);
    const int64_t dz_rows = std::min(rows_left, dy_rows + t1_ - 1);
    const Scratch s = scratch(kBlockRows + t0_ - 1 + t1_ - 1);
    norm_rows_backward(blk, dz_rows, dy_rows, s);
    bias_sums(blk, s.dz);
    if (blk.pos == 0)  // the rows that read b0 before the sequence (dz_rows ≥ first_rows())
      std::copy_n(s.dz, first_rows() * channels_,
                  first_rows_ + blk.row / t_ * first_rows() * channels_);
    matmul(MatView{s.stacked, DType::bf16, {groups_, dy_rows, width_},
                   {dy_rows * width_, width_, 1}},
           MatView{w_, DType::bf16, {groups_, width_, d_}, {width_ * d_, d_, 1}},
           OutView{s.dy, {groups_, dy_rows, d_}, {dy_rows * d_, d_, 1}});
    detail::cca_depthwise_backward_rows_grouped(
        out_.dc, depthwise_partials_ + i * depthwise_sums(), s.dy, dy_rows, blk.row, in_.c, wt_,
        blk.row / t_, t_, blk.pos, blk.pos + blk.rows, groups_, d_, t0_);
  }

  // The sums, each in the order of its whole-batch form, and dW over every row.
  void finish() {
    detail::cca_sum_row_dtemp(out_.dtemp, row_dtemp_, rows_, hk_);
    add_chunk_sums(out_.db1, bias_partials_, bias_sum_chunks(b_, t_), channels_);
    cca_grouped_conv_before_backward(out_.db0, first_rows_, first_rows(), in_.w1, b_, t_, groups_,
                                     d_, t1_);
    detail::cca_depthwise_backward_sums(out_.dw0, out_.db0, depthwise_partials_,
                                        static_cast<int64_t>(blocks_.size()), channels_, t0_);
    // dW[g][(i, ci), o] = Σ_rows [y(t − pad) ‖ … ‖ y(t)][g][(i, ci)] · dz(t)[g][o]
    const StackedTaps ys(in_.kept, groups_, rows_, width_, DType::bf16);
    thread_local ScratchBuffer<float> dw_buffer;
    float* dw = dw_buffer.get(groups_ * width_ * d_);
    matmul(ys.groups_transposed(),
           MatView{dz_all_, DType::bf16, {groups_, rows_, d_}, {rows_ * width_, width_, 1}},
           OutView{dw, {groups_, width_, d_}, {width_ * d_, d_, 1}});
    add_weight_gradient(out_.dw1, dw, groups_, d_, t1_);
  }

 private:
  // A task's scratch (this thread's), for `rows` rows from the block's first.
  struct Scratch {
    float* dz;      // [rows, C]: the QK norm's and the means' gradient
    bf16* stacked;  // [G, rows, t1·d]: the window from each row on, in bf16
    float* dy;      // [G, rows, d]
    float* dtemp;   // [Hk]: one row's dτ
  };
  Scratch scratch(int64_t rows) const {
    thread_local ScratchBuffer<float> dz, dy, dtemp;
    thread_local ScratchBuffer<bf16> stacked;
    return {dz.get(rows * channels_), stacked.get(groups_ * rows * width_),
            dy.get(groups_ * rows * d_), dtemp.get(hk_)};
  }

  int64_t depthwise_sums() const { return (t0_ + 1) * channels_; }
  // Positions of each sequence whose grouped window reads before its start.
  int64_t first_rows() const { return std::min(t_, t1_ - 1); }

  // dz of rows [0, dz_rows) from the block's first, each row in bf16 into the stacked windows
  // that read it (dy(r) = Σ_i dz(r + i)·W_{t1−1−i} for the dy_rows rows; taps past the
  // sequence's end zero) and, for the block's own rows, into dz_all for dW; the own rows' dc
  // (the means' part, written) and dτ (kept per row).
  void norm_rows_backward(const RowBlock& blk, int64_t dz_rows, int64_t dy_rows,
                          const Scratch& s) {
    for (int64_t r = 0; r < dz_rows; ++r) {
      const int64_t row = blk.row + r;
      const bool own = r < blk.rows;
      float* dz = s.dz + r * channels_;
      std::fill_n(s.dtemp, hk_, 0.0f);
      detail::cca_qk_norm_means_backward_row(dz, own ? out_.dc + row * channels_ : nullptr,
                                             s.dtemp, in_.dq, in_.dk, in_.qk, in_.rnorm,
                                             in_.temp, row, hq_, hk_, d_);
      if (own) std::copy_n(s.dtemp, hk_, row_dtemp_ + row * hk_);
      for (int64_t g = 0; g < groups_; ++g) {
        for (int64_t i = 0; i < t1_; ++i)  // dz(r) is tap i of window r − i
          if (r - i >= 0 && r - i < dy_rows)
            to_bf16_serial(dz + g * d_, s.stacked + (g * dy_rows + r - i) * width_ + i * d_, d_);
        if (own) to_bf16_serial(dz + g * d_, dz_all_ + (g * rows_ + row) * width_, d_);
      }
    }
    for (int64_t r = std::max<int64_t>(0, dz_rows - t1_ + 1); r < dy_rows; ++r)
      for (int64_t i = dz_rows - r; i < t1_; ++i)
        for (int64_t g = 0; g < groups_; ++g)
          std::fill_n(s.stacked + (g * dy_rows + r) * width_ + i * d_, d_, bf16{});
  }

  // db1's partial sums of the block's own rows: its bias-sum chunks (whole, as kBlockRows is
  // a multiple of kBiasSumRows).
  void bias_sums(const RowBlock& blk, const float* dz) {
    const int64_t first_chunk = blk.row / t_ * bias_sum_chunks(1, t_) + blk.pos / kBiasSumRows;
    for (int64_t r0 = 0; r0 < blk.rows; r0 += kBiasSumRows)
      column_sums(bias_partials_ + (first_chunk + r0 / kBiasSumRows) * channels_,
                  dz + r0 * channels_,
                  std::min(kBiasSumRows, blk.rows - r0), channels_);
  }

  const Inputs in_;
  const Outputs out_;
  const int64_t b_, t_, hq_, hk_, d_, t0_, t1_, groups_, channels_, rows_, width_;
  const std::vector<RowBlock> blocks_;
  // [G, B·T, t1·d], the first d of each row written: dW's operand with the row stride of the
  // whole-batch form's (the first tap of its stacked dz), so that the library runs the same
  // product and sums in the same order. Its kernel may split the rows differently for a
  // different stride (it does with AVX-512 BF16 without AMX). t1·d bf16 per row fits the
  // scratch of G·d floats as t1 ≤ 2.
  bf16* dz_all_;
  float* wt_ = nullptr;
  const void* w_ = nullptr;
  float* row_dtemp_ = nullptr;           // [B·T, Hk]
  float* depthwise_partials_ = nullptr;  // [blocks][t0 + 1, C]
  float* bias_partials_ = nullptr;       // [bias_sum_chunks][C]
  float* first_rows_ = nullptr;          // [B, first_rows(), C]: their dz, for db0
};

}  // namespace

void cca_qk_norm_convs_backward_gemm(float* dc, float* dtemp, float* dw0, float* db0, float* dw1,
                                     float* db1, float* scratch, const float* dq, const float* dk,
                                     const float* qk, const float* rnorm, const float* temp,
                                     const float* kept, const float* c, const float* w0,
                                     const float* w1, int64_t b, int64_t t, int64_t hq, int64_t hk,
                                     int64_t d, int64_t t0, int64_t t1) {
  FOUNDRY_CHECK(cca_convs_fused(t1, DType::bf16) && t1 >= 1 && t0 >= 1 && hq > 0 && hk > 0 &&
                d > 0 && b > 0 && t > 0);
  BlockedBackward backward({dq, dk, qk, rnorm, temp, kept, c, w0, w1},
                           {dc, dtemp, dw0, db0, dw1, db1}, scratch, b, t, hq, hk, d, t0, t1);
  run_side_by_side(static_cast<int64_t>(backward.blocks().size()),
                   [&](int64_t i) { backward.block(i); });
  backward.finish();
}

}  // namespace foundry::ops
