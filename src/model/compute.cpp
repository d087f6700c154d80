#include "model/compute.h"

namespace foundry {

const void* Compute::weight(int64_t offset) const {
  if (precision == DType::bf16) return params_bf16_ + offset;
  return params_ + offset;
}

const void* Compute::input(const float* x, int64_t n, int slot) {
  return input(x, n, scratch_[slot]);
}

const void* Compute::input(const float* x, int64_t n, GrowingBuffer& keep) const {
  if (precision == DType::f32) return x;
  auto* copy = static_cast<bf16*>(keep.get(n * static_cast<int64_t>(sizeof(bf16))));
  ops.to_bf16(copy, x, n);
  return copy;
}

void Compute::linear_forward(float* y, const float* x, int64_t weight_offset, int64_t n,
                             int64_t out, int64_t in, int slot, bool accumulate) {
  ops.gemm(input(x, n * in, slot), false, weight(weight_offset), true, y, n, out, in, precision,
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
    ops.gemm(dy_in, false, weight(weight_offset), false, dx, n, in, out, precision,
             accumulate_dx, dy_ld);
  ops.gemm(dy_in, true, input(x, n * in, 1), false, g(weight_offset), out, in, n, precision,
           /*accumulate=*/true, dy_ld);
}

void Compute::projections_backward(float* dx, const float* x, int64_t n, int64_t in,
                                   std::initializer_list<Projection> projections) {
  const void* x_in = input(x, n * in, 2);
  bool accumulate = false;
  for (const Projection& p : projections) {
    const void* dy_in = input(p.dy, n * p.out, 0);
    ops.gemm(dy_in, false, weight(p.weight), false, dx, n, in, p.out, precision, accumulate);
    ops.gemm(dy_in, true, x_in, false, g(p.weight), p.out, in, n, precision,
             /*accumulate=*/true);
    accumulate = true;
  }
}

void Compute::rmsnorm_backward(const InputGradient& to, int64_t weight_offset, const float* dn,
                               const float* x, const float* rstd, int64_t n, int64_t c) {
  auto t = time("rmsnorm");
  if (to.residual)
    ops.rmsnorm_backward_residual(to.dx, g(weight_offset), dn, x, p(weight_offset), rstd,
                                  to.residual, to.residual_scale, n, c);
  else
    ops.rmsnorm_backward(to.dx, g(weight_offset), dn, x, p(weight_offset), rstd, n, c);
}

}  // namespace foundry
