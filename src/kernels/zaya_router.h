// The ZAYA1 router's elementwise and gating pieces, and residual scaling, forward and
// backward, as free functions on raw pointers (the conventions of kernels/ops.h: shapes in
// every comment; backward ACCUMULATES (+=) into parameter and input gradients unless the
// comment says "writes"; templated on float and double; reductions over tokens use a fixed
// chunking independent of the thread count, no atomics).
//
// Names: N tokens, C channels (hidden size), R router latent (256 in ZAYA1), E experts,
// S = E + 1 router classes when the skip class is enabled (S = E otherwise; the skip class,
// when present, has index E), K choices per token.
//
// ---- How a model composes one ZAYA1 MoE sublayer from these kernels and its GEMMs ---------
// Parameters of MoE sublayer l: Wdown [R, C], bdown [R], gamma [R] (EDA, init 1; unused in
// the first MoE sublayer), norm_w [R] (router RMSNorm), W1 [R, R], b1 [R], W2 [R, R], b2 [R],
// W3 [S, R] (no bias); balancing bias [S] in a ZayaBalancer (not a parameter).
// "GEMM y = x·W^T" is the model's matmul; everything else is a call below or in ops.h.
//
// Forward (x [N, C] = RMSNorm(res), the same normalized input the experts see):
//   r      = x·Wdown^T                      [N, R]   GEMM
//   bias_add_forward(r, bdown, N, R)
//   eda_forward(r, r_prev, gamma, N, R)              skipped in the first MoE sublayer;
//                                                    r_prev = the previous MoE sublayer's r
//                                                    (post-EDA, pre-norm). Keep r: it is the
//                                                    next sublayer's r_prev and the norm's input.
//   rmsnorm_forward(u, rstd, r, norm_w, N, R, eps)   u [N, R]
//   a1 = u·W1^T; gelu_bias_forward(g1, a1, b1, N, R)   keep g1, and a1 (now gelu'(a1 + b1))
//   a2 = g1·W2^T; gelu_bias_forward(g2, a2, b2, N, R)  keep g2, and a2 (now gelu'(a2 + b2))
//   logits = g2·W3^T                        [N, S]   GEMM (fp32 output)
//   zaya_gating_forward(probs, choice, gate, logits, balancer.bias.data(), N, E, K,
//                       skip_class, skip_passes_input)
//   moe_dispatch_plan(offsets [S+1], slot_token, assignment_slot, choice, N, S, K)
//     (ops.h; the skip class is dispatched like a class of its own)
//   moe_gather(xs, x, slot_token, N*K, C)
//   expert e < E runs on rows [offsets[e], offsets[e+1]) of xs, writing the same rows of ys;
//   skip rows [offsets[E], offsets[E+1]) of ys: zero by default, a copy of xs when
//     skip_passes_input (the skip class is then the identity "expert", and its gate is p_skip)
//   moe_combine(out, ys, gate, assignment_slot, N, K, C)              out [N, C] zeroed first
//   zaya_class_counts(counts, choice, N, K, S)   → summed over data-parallel ranks → after
//     the optimizer step: balancer.update(global_counts, global_N * K)
//
// Backward (reverse order; d_r is the router-state gradient buffer of this sublayer: on entry
// it holds what the next MoE sublayer's eda_backward added, or zero for the last one):
//   moe_combine_backward(dys, dgate, dout, ys, gate, assignment_slot, N, K, C)
//   dxs = expert backward on rows < offsets[E]; skip rows: zero by default, dys when
//     skip_passes_input; moe_gather_backward(dx, dxs, …)
//   zaya_gating_backward(dlogits, dgate, probs, choice, N, E, K, skip_class, skip_passes_input)
//   dW3 += dlogits^T·g2; dg2 = dlogits·W3                                GEMMs
//   gelu_bias_backward(da2, db2, dg2, a2, N, R); dW2, dg1 GEMMs
//   gelu_bias_backward(da1, db1, dg1, a1, N, R); dW1, du  GEMMs
//   rmsnorm_backward(d_r, dnorm_w, du, r, norm_w, rstd, N, R)           d_r += : now complete
//   eda_backward(d_r_prev, dgamma, d_r, r_prev, gamma, N, R)            d_r_prev: the previous
//                                                    MoE sublayer's buffer (written; zeroed
//                                                    instead where a sublayer has no EDA);
//                                                    skipped in the first one
//   bias_add_backward(dbdown, d_r, N, R); dWdown += d_r^T·x; dx += d_r·Wdown   GEMMs
//   then the pre-norm's rmsnorm_backward from dx into the residual gradient.
// (EDA is r ← r + gamma ⊙ r_prev, so the gradient of the pre-EDA r, which bias_add_backward
// and the Wdown GEMMs consume, is d_r itself.)
//
// Residual scaling (every sublayer, attention or MoE; α, β [C] for the residual and for the
// incoming sublayer output):
//   residual_scale_forward(res_new, res, h, alpha_res, beta_res, alpha_h, beta_h, N, C)
//   h_new = Mixer(RMSNorm(res_new))
// and, backward, with d_res_new complete (the next merge's dres plus this sublayer's norm
// backward):
//   residual_scale_backward(d_res, d_h, dalpha_res, dbeta_res, dalpha_h, dbeta_h,
//                           d_res_new, res, h, alpha_res, beta_res, alpha_h, beta_h, N, C)
// which writes d_res and d_h (the only gradients of res and h there are). A training step
// writes d_res later instead, in the sublayer's pre-norm backward (d_res = alpha_res ⊙
// d_res_new + the norm's gradient: rmsnorm_backward_residual), and d_h alone here
// (residual_scale_backward_params), so d_res is written once.
#pragma once
#include <cstdint>
#include <vector>

#include "base/bf16.h"

namespace foundry::ops {

// ---- bias of a linear layer ----------------------------------------------------------------
// y [N, M] += bias [M] (in place, per row).
template <typename T>
void bias_add_forward(T* y, const T* bias, int64_t n, int64_t m);
// dbias [M] += Σ_n dy[n, :]. The input gradient is dy itself (nothing to do).
template <typename T>
void bias_add_backward(T* dbias, const T* dy, int64_t n, int64_t m);

// ---- GELU, exact form --------------------------------------------------------------------
// gelu(x) = x·Φ(x) = x/2·(1 + erf(x/√2)) (not the tanh approximation).
// out [N, C] (writes) = gelu(in [N, C]); out may alias in.
template <typename T>
void gelu_forward(T* out, const T* in, int64_t n, int64_t c);
// din [N, C] (writes) = dout · gelu'(in), gelu'(x) = Φ(x) + x·φ(x), φ(x) = e^{−x²/2}/√(2π).
// din may alias dout; `in` is the pre-activation input of the forward pass.
template <typename T>
void gelu_backward(T* din, const T* dout, const T* in, int64_t n, int64_t c);
// A router layer's bias and GELU in one pass, keeping the derivative instead of the input:
// a [N, C] += bias [C]; g [N, C] (writes) = gelu(a); then a (overwritten) = gelu'(a). The
// backward, from that: da [N, C] (writes) = dg ⊙ gelu'(a); dbias [C] += Σ_n da. The same
// bits as bias_add_forward + gelu_forward, and gelu_backward + bias_add_backward.
template <typename T>
void gelu_bias_forward(T* g, T* a, const T* bias, int64_t n, int64_t c);
template <typename T>
void gelu_bias_backward(T* da, T* dbias, const T* dg, const T* derivative, int64_t n, int64_t c);

// ---- exponential depth averaging (one step) ----------------------------------------------
// r [N, R] += gamma [R] ⊙ r_prev [N, R] (in place).
template <typename T>
void eda_forward(T* r, const T* r_prev, const T* gamma, int64_t n, int64_t r_dim);
// From dr [N, R] (the gradient of the post-EDA r): dr_prev [N, R] (writes) = gamma ⊙ dr;
// dgamma [R] += Σ_n r_prev ⊙ dr. The gradient of the pre-EDA r is dr itself.
template <typename T>
void eda_backward(T* dr_prev, T* dgamma, const T* dr, const T* r_prev, const T* gamma,
                  int64_t n, int64_t r_dim);

// ---- ZAYA gating ---------------------------------------------------------------------------
// logits [N, S], S = E + (skip_class ? 1 : 0). Writes:
//   probs [N, S] = softmax(logits) (float when T = float: the router softmax runs in fp32);
//   choice [N, K] = the K classes with the largest score + balance_bias, in descending order
//     of that sum (ties: lower index first), where the score is probs under
//     BiasOn::probs (the ZAYA1 description) or logits under BiasOn::logits (the same choice
//     as log(probs) + bias: docs/zaya1.md, "Balancing"); balance_bias [S] may be null
//     (= zero) and gets no gradient;
//   gate [N, K] = probs[n, choice] (the unbiased probability, not renormalized), except for
//     the skip class (index E): gate 0 by default (the token gets no expert output from that
//     choice), or probs[n, E] = p_skip when skip_passes_input (the caller then adds
//     p_skip · x, i.e. treats the skip class as an identity expert, and the gradient of
//     p_skip flows back through gate).
// skip_passes_input requires skip_class. 1 ≤ K ≤ S.
enum class BiasOn { probs, logits };
template <typename T>
void zaya_gating_forward(T* probs, int32_t* choice, T* gate, const T* logits,
                         const T* balance_bias, BiasOn bias_on, int64_t n, int64_t e, int64_t k,
                         bool skip_class, bool skip_passes_input);
// dlogits [N, S] (writes) from dgate [N, K] through the softmax: dp[choice] = dgate (dropped
// for a skip choice whose gate is the constant 0), dlogits = p ⊙ (dp − <dp, p>). The choice
// itself is piecewise constant in the logits and contributes nothing.
template <typename T>
void zaya_gating_backward(T* dlogits, const T* dgate, const T* probs, const int32_t* choice,
                          int64_t n, int64_t e, int64_t k, bool skip_class,
                          bool skip_passes_input);

// ---- load statistics and the balancing bias -----------------------------------------------
// counts [S] (writes) = number of the N·K choices that went to each class (exact integers,
// so the result, and a sum of it over ranks, is independent of order and thread count).
void zaya_class_counts(int64_t* counts, const int32_t* choice, int64_t n, int64_t k,
                       int64_t classes);
// near [S] (writes) = per class, how many of the N tokens have it within `window` of their
// selection boundary under the biased scores (score + balance_bias, the score as in
// zaya_gating_forward): a chosen class that beats the best unchosen one by less than window
// (it would leave if its bias fell by window), or an unchosen class that trails the lowest
// chosen one by less than window (it would join if its bias rose by window). So
// near[s] / (2·window·N·K) estimates d load_s / d bias_s, the slope the newton rule divides
// by. Exact integers, summable over ranks like the class counts.
template <typename T>
void zaya_boundary_counts(int64_t* near, const T* probs, const T* logits, const T* balance_bias,
                          BiasOn bias_on, const int32_t* choice, int64_t n, int64_t classes,
                          int64_t k, double window);
// err [S] (writes) = counts[s] / assignments − 1/S, assignments = the N·K the counts cover
// (global over data-parallel ranks when the counts are).
void zaya_load_error(double* err, const int64_t* counts, int64_t assignments, int64_t classes);

// The per-class balancing bias of one MoE sublayer and its update rule. The load error err
// [S] is the bias's "gradient": an over-used class (err > 0) moves down, an under-used one up.
// Four rules (docs/zaya1.md, "Balancing", explains the choice; the model's default is
// model.balance_rule, these options' is proportional):
//
// - proportional: bias −= gain·err, gain = `lr`. The bias is then the integral
//   of the load error (an integral controller): a persistent error keeps moving it, a
//   batch's noise moves it by only gain × the noise. On the logits (BiasOn::logits), where
//   the scores keep their scale through training, one gain serves the whole run.
// - sign_adaptive: a per-class step size that follows the scale of the routing scores. Each
//   class moves by its step against the sign of its error; the step grows by `increase`
//   while the sign persists and shrinks by `decrease` when it flips, within
//   [step_min, step_max]; on a flip the class does not move that update (the Rprop rule of
//   Riedmiller and Braun, 1993, in its iRprop− form):
//     same sign as last:  step = min(step·increase, step_max);  bias −= sign(err)·step
//     sign flipped:       step = max(step·decrease, step_min);  no move, last sign := 0
//     otherwise:          bias −= sign(err)·step
//   It suits scores whose scale changes by orders of magnitude (the probabilities), but a
//   batch's noise flips the sign often, which shrinks the step to step_min and leaves a
//   class to lag a drifting router.
// - newton: a proportional step whose gain is the inverse of the class's measured slope,
//   a damped Newton step on each class's load as a function of its own bias:
//     slope = near / (2·window·assignments)   (zaya_boundary_counts)
//     bias −= lr / max(slope, lr / gain_max) · err
//   lr (the damping, 0.5 by default) halves the full step because every class moves at once
//   and an exchange of tokens between two classes closes both errors. Where few tokens sit
//   near a class's boundary (a flat load) the step is large, up to gain_max·err, so a
//   drifting router is tracked closely; where many do (a cluster of tokens that two classes
//   nearly tie on) it is small, so the cluster is split instead of flipped back and forth.
// - adamw: the bias's AdamW step without weight decay (torch.optim.AdamW's form), the rule
//   the ZAYA1 description gives:
//     step += 1;  m = β1·m + (1 − β1)·err;  v = β2·v + (1 − β2)·err²
//     bias −= lr / (1 − β1^step) · m / (√v / √(1 − β2^step) + eps)
//
// The arithmetic is double; the state is stored in float. Serializable state (all of it;
// saved in checkpoints and load_state()d back to resume bitwise): bias [S], the rule's
// per-class vectors (proportional and newton: none; adamw: exp_avg m, exp_avg_sq v;
// sign_adaptive: step size, last sign in {−1, 0, 1}), and step (the number of updates
// applied). The options are configuration.
enum class BalanceRule { proportional, sign_adaptive, adamw, newton };
const char* balance_rule_name(BalanceRule rule);

struct ZayaBalancerOptions {
  BalanceRule rule = BalanceRule::proportional;
  // proportional: the gain; adamw: the learning rate; sign_adaptive: the initial step;
  // newton: the damping of the Newton step.
  double lr = 1.0;
  double window = 0.1;     // newton: the boundary window, in units of the routing score
  double gain_max = 4.0;   // newton: the largest gain (where no token is near the boundary)
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double step_min = 1e-6;  // sign_adaptive
  double step_max = 0.05;
  double increase = 1.2;
  double decrease = 0.5;
  float skip_bias_init = -1.0f;  // initial bias of the skip class (experts start at 0)
};

struct ZayaBalancer {
  ZayaBalancerOptions options;
  std::vector<float> bias;        // [S]
  std::vector<float> exp_avg;     // [S] adamw (empty under the other rules)
  std::vector<float> exp_avg_sq;  // [S] adamw
  std::vector<float> step_size;   // [S] sign_adaptive (empty under the other rules)
  std::vector<float> last_sign;   // [S] sign_adaptive
  int64_t step = 0;

  // S = experts + (skip_class ? 1 : 0) classes; bias 0 for experts, skip_bias_init for skip.
  ZayaBalancer(int64_t experts, bool skip_class, const ZayaBalancerOptions& options = {});

  int64_t classes() const { return static_cast<int64_t>(bias.size()); }
  // The rule's per-class state vectors, with their names in checkpoints: none
  // (proportional), exp_avg and exp_avg_sq (adamw), or step_size and last_sign
  // (sign_adaptive).
  std::vector<const char*> rule_state_names() const;
  std::vector<const std::vector<float>*> rule_state() const;
  // One update from counts [S] covering `assignments` = N·K choices, and (newton only,
  // which requires them) the boundary counts near [S] of the same tokens.
  void update(const int64_t* counts, int64_t assignments, const int64_t* near = nullptr);
  // Whether the rule needs boundary counts.
  bool needs_boundary_counts() const { return options.rule == BalanceRule::newton; }
  // One update from a load error [S] computed elsewhere.
  void update_from_error(const double* err);
  // Restores the state saved from a balancer with the same number of classes and rule
  // (`rule_in` the vectors of rule_state(), in order); fails (Error) on a size mismatch, a
  // negative step or values the rule cannot hold.
  void load_state(std::vector<float> bias_in, std::vector<std::vector<float>> rule_in,
                  int64_t step_in);

 private:
  void proportional_update(const double* err);
  void newton_update(const double* err, const int64_t* near, int64_t assignments);
  void adamw_update(const double* err);
  void sign_adaptive_update(const double* err);
};

// ---- residual scaling ----------------------------------------------------------------------
// out [N, C] (writes) = (res + beta_res) ⊙ alpha_res + (h + beta_h) ⊙ alpha_h, with the four
// vectors [C]. out may alias res or h (the backward pass needs the original res and h).
template <typename T>
void residual_scale_forward(T* out, const T* res, const T* h, const T* alpha_res,
                            const T* beta_res, const T* alpha_h, const T* beta_h, int64_t n,
                            int64_t c);
// From dout [N, C]: dres [N, C] (writes) = alpha_res ⊙ dout; dh [N, C] (writes) =
// alpha_h ⊙ dout;
// dalpha_res [C] += Σ_n (res + beta_res) ⊙ dout; dbeta_res [C] += alpha_res ⊙ Σ_n dout;
// dalpha_h [C] += Σ_n (h + beta_h) ⊙ dout; dbeta_h [C] += alpha_h ⊙ Σ_n dout.
// dres and dh must not alias dout or each other.
template <typename T>
void residual_scale_backward(T* dres, T* dh, T* dalpha_res, T* dbeta_res, T* dalpha_h,
                             T* dbeta_h, const T* dout, const T* res, const T* h,
                             const T* alpha_res, const T* beta_res, const T* alpha_h,
                             const T* beta_h, int64_t n, int64_t c);
// The same without dres, for a sublayer whose pre-norm backward adds alpha_res ⊙ dout itself
// (rmsnorm_backward_residual, ops.h): dh [N, C] (writes) = alpha_h ⊙ dout, as T or rounded to
// bf16 (DH = bf16: what the sublayer's first product reads); the four parameter gradients
// with the bits residual_scale_backward gives them.
template <typename T, typename DH>
void residual_scale_backward_params(DH* dh, T* dalpha_res, T* dbeta_res, T* dalpha_h,
                                    T* dbeta_h, const T* dout, const T* res, const T* h,
                                    const T* alpha_res, const T* beta_res, const T* alpha_h,
                                    const T* beta_h, int64_t n, int64_t c);

// The embedding's entry into the residual stream: out [N, C] = (x + beta) ⊙ alpha. Backward:
// dx [N, C] (writes) = alpha ⊙ dout; dalpha += Σ_n (x + beta) ⊙ dout; dbeta += alpha ⊙ Σ_n dout,
// each sum over the rows in order whatever the thread count.
void scale_shift_forward(float* out, const float* x, const float* alpha, const float* beta,
                         int64_t n, int64_t c);
void scale_shift_backward(float* dx, float* dalpha, float* dbeta, const float* dout,
                          const float* x, const float* alpha, const float* beta, int64_t n,
                          int64_t c);

}  // namespace foundry::ops
