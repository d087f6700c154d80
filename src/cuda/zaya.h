// ZAYA1's router and residual scaling on the GPU (kernels/zaya_router.h's contracts), fp32 on
// device pointers, queued on the default stream. Sums over tokens (bias, EDA and residual
// scaling gradients) go through fixed chunks of rows summed in order; the load statistics are
// exact integer counts. `scratch` arguments hold the *_scratch(...) floats. The balancing rule
// itself stays on the host (S values a step, from the counts copied back after the step).
#pragma once
#include <cstdint>

namespace foundry::gpu::ops {

// y [N, M] += bias [M]; dbias [M] += Σ_n dy[n, :].
void bias_add_forward(float* y, const float* bias, int64_t n, int64_t m);
void bias_add_backward(float* dbias, const float* dy, int64_t n, int64_t m, float* scratch);
int64_t column_sum_scratch(int64_t n, int64_t columns);

// Exact GELU (erf form); out may alias in, din may alias dout.
void gelu_forward(float* out, const float* in, int64_t n, int64_t c);
void gelu_backward(float* din, const float* dout, const float* in, int64_t n, int64_t c);

// r += gamma ⊙ r_prev; backward: dr_prev (writes) = gamma ⊙ dr, dgamma += Σ_n r_prev ⊙ dr.
void eda_forward(float* r, const float* r_prev, const float* gamma, int64_t n, int64_t r_dim);
void eda_backward(float* dr_prev, float* dgamma, const float* dr, const float* r_prev,
                  const float* gamma, int64_t n, int64_t r_dim, float* scratch);

// ops::zaya_gating_forward/backward; bias_on_logits: BiasOn::logits (else probs);
// balance_bias may be null.
void zaya_gating_forward(float* probs, int32_t* choice, float* gate, const float* logits,
                         const float* balance_bias, bool bias_on_logits, int64_t n, int64_t e,
                         int64_t k, bool skip_class, bool skip_passes_input);
void zaya_gating_backward(float* dlogits, const float* dgate, const float* probs,
                          const int32_t* choice, int64_t n, int64_t e, int64_t k,
                          bool skip_class, bool skip_passes_input);

// counts [S] (writes) of the N·K choices; near [S] (writes): ops::zaya_boundary_counts.
void zaya_class_counts(int64_t* counts, const int32_t* choice, int64_t n, int64_t k,
                       int64_t classes);
void zaya_boundary_counts(int64_t* near, const float* probs, const float* logits,
                          const float* balance_bias, bool bias_on_logits, const int32_t* choice,
                          int64_t n, int64_t classes, int64_t k, double window);

// out = (res + β_res) ⊙ α_res + (h + β_h) ⊙ α_h; backward writes dres, dh and accumulates the
// four parameter gradients (ops::residual_scale_backward). scratch: column_sum_scratch(n, 3·c).
void residual_scale_forward(float* out, const float* res, const float* h, const float* alpha_res,
                            const float* beta_res, const float* alpha_h, const float* beta_h,
                            int64_t n, int64_t c);
void residual_scale_backward(float* dres, float* dh, float* dalpha_res, float* dbeta_res,
                             float* dalpha_h, float* dbeta_h, const float* dout, const float* res,
                             const float* h, const float* alpha_res, const float* beta_res,
                             const float* alpha_h, const float* beta_h, int64_t n, int64_t c,
                             float* scratch);
// The same without dres (the sublayer's norm backward adds α_res ⊙ dout), dh as bf16 when
// dh_bf16; the same scratch.
void residual_scale_backward_params(void* dh, bool dh_bf16, float* dalpha_res, float* dbeta_res,
                                    float* dalpha_h, float* dbeta_h, const float* dout,
                                    const float* res, const float* h, const float* alpha_res,
                                    const float* beta_res, const float* alpha_h,
                                    const float* beta_h, int64_t n, int64_t c, float* scratch);

}  // namespace foundry::gpu::ops
