// ZAYA1's CCA operations on the GPU (kernels/cca.h's layouts and contracts), fp32 on device
// pointers, queued on the default stream. Reductions over tokens (the convolutions' weight
// and bias gradients, the temperature's) go through fixed chunks of rows summed in chunk
// order: deterministic, no atomics. `scratch` arguments hold the *_scratch(...) floats.
#pragma once
#include <cstdint>

namespace foundry::gpu::ops {

// qk [N, C] += [mq ‖ mk] from c [N, C] (ops::cca_means_forward); dc [N, C] += its backward.
void cca_means_forward(float* qk, const float* c, int64_t n, int64_t hq, int64_t hk, int64_t d);
void cca_means_backward(float* dc, const float* dqk, int64_t n, int64_t hq, int64_t hk, int64_t d);

// y [B, T, C] (writes) = the causal depthwise convolution of c; backward: dc +=, dw0 +=, db0 +=.
void cca_depthwise_conv_forward(float* y, const float* c, const float* w0, const float* b0,
                                int64_t b, int64_t t, int64_t channels, int64_t taps);
void cca_depthwise_conv_backward(float* dc, float* dw0, float* db0, const float* dy,
                                 const float* c, const float* w0, int64_t b, int64_t t,
                                 int64_t channels, int64_t taps, float* scratch);
int64_t cca_depthwise_conv_scratch(int64_t b, int64_t t, int64_t channels, int64_t taps);

// z [B, T, G·d] (writes) = the causal grouped convolution of y (b1 null: no bias; y before
// position 0: `before` [G·d], zero where null); backward: dy +=, dw1 +=, db1 +=, dbefore +=
// (unless null; ops::cca_grouped_conv_before_backward's sums). Products through cuBLASLt in
// fp32, one per group with the taps stacked in K; scratch: cca_grouped_conv_forward_scratch /
// cca_grouped_conv_scratch floats.
void cca_grouped_conv_forward(float* z, const float* y, const float* w1, const float* b1,
                              const float* before, int64_t b, int64_t t, int64_t groups, int64_t d,
                              int64_t taps, float* scratch);
int64_t cca_grouped_conv_forward_scratch(int64_t b, int64_t t, int64_t groups, int64_t d,
                                         int64_t taps);
void cca_grouped_conv_backward(float* dy, float* dw1, float* db1, float* dbefore, const float* dz,
                               const float* y, const float* w1, const float* before, int64_t b,
                               int64_t t, int64_t groups, int64_t d, int64_t taps, float* scratch);
int64_t cca_grouped_conv_scratch(int64_t b, int64_t t, int64_t groups, int64_t d, int64_t taps);

// The value shift in place (ops::cca_value_shift_inplace_forward/backward); last_out may be
// null.
void cca_value_shift_inplace_forward(float* v, float* last_out, int64_t b, int64_t t, int64_t half);
void cca_value_shift_inplace_backward(float* dv, int64_t b, int64_t t, int64_t half);

// The QK L2-norm with temperature (ops::cca_qk_norm_forward/backward).
void cca_qk_norm_forward(float* q, float* k, float* rnorm, const float* qk, const float* temp,
                         int64_t n, int64_t hq, int64_t hk, int64_t d, float eps);
void cca_qk_norm_backward(float* dqk, float* dtemp, const float* dq, const float* dk,
                          const float* qk, const float* rnorm, const float* temp, int64_t n,
                          int64_t hq, int64_t hk, int64_t d, float* scratch);
int64_t cca_qk_norm_scratch(int64_t n, int64_t hk);

}  // namespace foundry::gpu::ops
