#include "model/compute.h"

namespace foundry {

const void* Compute::weight(int64_t offset) const {
  if (precision == DType::bf16) return params_bf16_ + offset;
  return params_ + offset;
}

const void* Compute::input(const float* x, int64_t n, int slot) {
  return input(x, n, scratch_[slot]);
}

const void* Compute::input(const float* x, int64_t n, std::vector<bf16>& keep) const {
  if (precision == DType::f32) return x;
  if (static_cast<int64_t>(keep.size()) < n) keep.resize(n);
  convert_to_bf16(x, keep.data(), n);
  return keep.data();
}

void Compute::linear_forward(float* y, const float* x, int64_t weight_offset, int64_t n,
                             int64_t out, int64_t in, int slot, bool accumulate) {
  gemm(input(x, n * in, slot), false, weight(weight_offset), true, y, n, out, in, precision,
       accumulate);
}

void Compute::linear_backward(float* dx, const float* dy, const float* x, int64_t weight_offset,
                              int64_t n, int64_t out, int64_t in, bool accumulate_dx) {
  linear_backward(dx, input(dy, n * out, 0), out, x, weight_offset, n, out, in, accumulate_dx);
}

void Compute::linear_backward(float* dx, const void* dy_in, int64_t dy_ld, const float* x,
                              int64_t weight_offset, int64_t n, int64_t out, int64_t in,
                              bool accumulate_dx) {
  if (dx)
    matmul(MatView::rows_major(dy_in, precision, n, out, dy_ld),
           MatView::rows_major(weight(weight_offset), precision, out, in),
           OutView::rows_major(dx, n, in), accumulate_dx);
  matmul(MatView::transposed(dy_in, precision, out, n, dy_ld),
         MatView::rows_major(input(x, n * in, 1), precision, n, in),
         OutView::rows_major(g(weight_offset), out, in), /*accumulate=*/true);
}

void Compute::projections_backward(float* dx, const float* x, int64_t n, int64_t in,
                                   std::initializer_list<Projection> projections) {
  const void* x_in = input(x, n * in, 2);
  bool accumulate = false;
  for (const Projection& p : projections) {
    const void* dy_in = input(p.dy, n * p.out, 0);
    gemm(dy_in, false, weight(p.weight), false, dx, n, in, p.out, precision, accumulate);
    gemm(dy_in, true, x_in, false, g(p.weight), p.out, in, n, precision, /*accumulate=*/true);
    accumulate = true;
  }
}

}  // namespace foundry
