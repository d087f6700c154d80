// Norms, clipping and Newton–Schulz on the GPU: what the optimizers need beyond AdamW's
// update. Sums of squares are in double over fixed blocks summed in order (deterministic);
// results that decide a scale stay on the device, so clipping needs no host round trip.
#pragma once
#include <cstdint>

#include "cuda/adamw.h"
#include "cuda/runtime.h"

namespace foundry::gpu::ops {

// *out (device) = Σ x[i]² over the ranges (AdamWRange, device memory), in double.
void sum_of_squares(double* out, const float* x, const AdamWRange* ranges, int64_t range_count,
                    Workspace& workspace);

// The clipping factor of optim/clip.h on the device: *factor = max_norm / √(*sum_squares)
// rounded to float when that norm is finite and exceeds max_norm, else 1 (max_norm 0: off).
void clip_factor(float* factor, const double* sum_squares, double max_norm);
// x *= *factor over the ranges.
void scale_ranges(float* x, const AdamWRange* ranges, int64_t range_count, const float* factor);

// out (rows × cols, row-major) = `steps` quintic Newton–Schulz iterations on
// g / (‖g‖_F + 1e-7), as optim/muon.h's NewtonSchulz (the same coefficients and orientation),
// with fp32 (or bf16-input) products through gpu::gemm. `out` may equal `g`.
void newton_schulz(const float* g, float* out, int64_t rows, int64_t cols, int steps,
                   bool use_bf16, Workspace& workspace);

}  // namespace foundry::gpu::ops
