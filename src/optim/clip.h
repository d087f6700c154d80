// Global gradient-norm clipping.
//
// The norm is the L2 norm over every tensor of the slab (alignment padding excluded),
// accumulated in double: each fixed chunk of the slab (optim/slab_chunks.h) sums its squares
// in double, then the per-chunk sums are added in chunk order. The chunking does not depend
// on the thread count, so the norm is bitwise identical with any number of threads.
#pragma once
#include <cstdint>
#include <functional>
#include <span>

#include "model/params.h"
#include "optim/slab_chunks.h"

namespace foundry {

// The global L2 norm of `grads` (a slab of table.total_elements() floats). +inf when some
// gradient is infinite, NaN when some gradient is NaN.
double grad_norm(const float* grads, const ParamTable& table);

// Returns the global L2 norm before clipping. When it exceeds `max_norm`, every gradient is
// multiplied by max_norm / norm (so the clipped norm is max_norm up to float rounding);
// otherwise, or when max_norm = 0 (clipping off), the gradients are untouched.
//
// A non-finite gradient makes the returned norm non-finite (check with std::isfinite); the
// gradients are then left untouched so the caller can skip the step and report it.
double clip_grad_norm(float* grads, const ParamTable& table, double max_norm);

// Fails, naming train.grad_clip, unless max_norm >= 0 (0 = clipping off).
void check_max_norm(double max_norm);

// The factor clipping multiplies the gradients by, as clip_grad_norm would apply it: max_norm /
// norm rounded to float when a finite norm exceeds max_norm, else 1. Fails on a negative
// max_norm.
float clip_factor(double norm, double max_norm);

// An optimizer step's last word before it changes anything: called with the global gradient
// norm before clipping (the same value on every rank, NaN or inf included) once it is known
// and before any parameter or state is written; true drops the update, and the step returns
// with every parameter and optimizer state as it was. Under data parallelism every rank
// calls it at the same point of the step, so it may communicate.
using UpdateVeto = std::function<bool(double grad_norm)>;

// The pieces, shared with the ZeRO-1 optimizer (optim/zero1.h) so a sharded norm adds the
// same numbers in the same order. The sum of x[i]² over n elements in eight double lanes
// (element i to lane i % 8) combined pairwise: the order is fixed by the code, not by the
// vector width or the alignment. And x *= factor.
double sum_of_squares(const float* x, int64_t n);
// out[c] = sum_of_squares(at(chunks[c].offset), chunks[c].size) for every chunk, bitwise, in
// parallel (consecutive chunks of one size are read side by side, for memory bandwidth).
void chunk_sums_of_squares(std::span<const SlabChunk> chunks,
                           const std::function<const float*(int64_t offset)>& at, double* out);
void scale_in_place(float* x, int64_t n, float factor);

}  // namespace foundry
