// The standard decoder-only MoE transformer, as flat forward and backward passes over the
// kernels. Parameters, gradients and (for bf16) GEMM weight copies live in slabs laid out
// by the ParamTable; activations for one batch shape live in buffers allocated once.
//
// Per layer:  x += o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1)))  n1 = rms(x)
//             x += sum_j w_j · expert_j(n2)                                       n2 = rms(x)
// Output: logits = rms(x) · embed^T over the padded vocabulary (padded ids get no mass).
// Loss = mean cross-entropy + aux_loss_coef · mean over layers of the load-balancing loss.
//
// Arch "zaya1" (model/zaya.cpp) composes the ZAYA1 layer instead: a CCA attention sublayer
// and an MoE sublayer with the ZAYA1 router, each followed by residual scaling:
//   res = (embed(tokens) + β_in) ⊙ α_in
//   per layer:  res = (res + β) ⊙ α + (h + β_h) ⊙ α_h,  h = CCA(rms(res))          (attention)
//               res = (res + β) ⊙ α + (h + β_h) ⊙ α_h,  h = Σ_j p_j · expert_j(rms(res))  (MoE)
//   logits = rms(res) · embed^T
// The router chains its EDA state through the MoE sublayers; its balancing biases are model
// state (not parameters) updated after every optimizer step from the class counts.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "base/bf16.h"
#include "base/config_reader.h"
#include "base/timer.h"
#include "kernels/cca.h"
#include "kernels/gemm.h"
#include "kernels/zaya_router.h"
#include "model/config.h"
#include "model/params.h"

namespace foundry {

struct ForwardResult {
  double loss = 0;      // cross-entropy + aux term (what backward differentiates)
  double ce_loss = 0;   // mean cross-entropy alone
  double aux_loss = 0;  // mean over layers of the load-balancing loss (before the coefficient)
};

struct Activations;      // per-batch-shape buffers (model.cpp)
struct ZayaActivations;  // the same for arch zaya1 (zaya.cpp)
struct ZayaActivationsDeleter {
  void operator()(ZayaActivations* a) const;
};

class Model {
 public:
  Model(const ModelConfig& config, DType precision);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const ParamTable& table() const { return table_; }
  DType precision() const { return precision_; }

  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  int64_t slab_size() const { return table_.total_elements(); }
  float* param(const std::string& name) { return params_.data() + table_.get(name).offset; }
  float* grad(const std::string& name) { return grads_.data() + table_.get(name).offset; }

  // Normal(0, init_std) matrices (output projections scaled by 1/sqrt(2·n_layers)), unit
  // norms, zero padded-vocabulary rows. Deterministic in `seed`.
  void init_weights(uint64_t seed);
  // Refreshes the bf16 GEMM copies after the fp32 weights change (no-op in fp32).
  void sync_weights();

  // inputs/targets [B, T]. Keeps what backward needs. targets may be null (logits only).
  ForwardResult forward(const int32_t* inputs, const int32_t* targets, int64_t batch,
                        int64_t seq);
  // Accumulates d(loss)/d(params) into grads() for the last forward (which had targets).
  void backward();
  void zero_grads();

  // Logits [B, T, padded_vocab] of the last forward (after forward with targets == null).
  const float* logits() const;

  OpTimes& op_times() { return op_times_; }

  // ---- ZAYA1 router balancing (arch zaya1; empty for arch moe) ----------------------------
  // One balancer per MoE sublayer (layer order), holding the per-class balancing bias used
  // for the expert choice and its AdamW state.
  std::vector<ops::ZayaBalancer>& balancers() { return balancers_; }
  const std::vector<ops::ZayaBalancer>& balancers() const { return balancers_; }
  // Class counts of the last forward: [n_layers × router_classes()] (row l = MoE sublayer l),
  // each row summing to batch·seq·top_k. Empty for arch moe.
  const std::vector<int64_t>& router_class_counts() const { return class_counts_; }
  // One balancing step per MoE sublayer from counts laid out like router_class_counts()
  // (the caller sums them over data-parallel ranks first) covering `assignments` choices
  // per sublayer. No-op for arch moe.
  void update_balancers(const int64_t* counts, int64_t assignments);
  // Every balancer back to its initial state (init_weights calls this).
  void reset_balancers();
  // The balancers' complete state (bias, exp_avg, exp_avg_sq, step per sublayer) as JSON,
  // and its inverse, which fails naming the problem on a state of another shape.
  json balancer_state() const;
  void load_balancer_state(const json& state);

  // ---- incremental decoding (generation) -------------------------------------------------
  // One token at position `pos` (0-based) of a single sequence; uses and extends a KV cache
  // that holds positions < pos. Returns logits [padded_vocab] (padded entries = -inf).
  struct DecodeState {
    int64_t pos = 0, max_len = 0;
    std::vector<std::vector<float>> k_cache, v_cache;  // per layer [max_len, KVH·D]
    std::vector<float> x, n, q, att, h, act, y, scores, router_logits, router_probs, logits;
    // arch zaya1: per-layer convolution and value-shift state, and per-token scratch
    std::vector<ops::CcaDecodeState<float>> cca;
    std::vector<float> c, qk, rnorm, k, v, r, r_prev, u, a1, a2, g1, g2;
  };
  DecodeState new_decode_state(int64_t max_len) const;
  const float* decode_step(DecodeState& state, int32_t token);

 private:
  const void* gemm_weight(const std::string& name) const;  // fp32 or bf16 slab pointer
  const void* gemm_weight(int64_t offset) const;
  const void* as_gemm_input(const float* x, int64_t n, int which);  // converts when bf16
  void linear_forward(float* y, const float* x, int64_t weight_offset, int64_t n, int64_t out,
                      int64_t in, int slot = 0);
  void linear_backward(float* dx, float* dweight, const float* dy, const float* x,
                       int64_t weight_offset, int64_t n, int64_t out, int64_t in,
                       bool accumulate_dx);
  void ensure_activations(int64_t batch, int64_t seq);
  void experts_forward(const int64_t* offsets, int64_t n_experts, const float* xs, float* h,
                       float* act, float* ys, const std::vector<int64_t>& w13,
                       const std::vector<int64_t>& w2);
  void experts_backward(const int64_t* offsets, int64_t n_experts, const float* dys,
                        const float* xs, const float* h, const float* act, float* dxs, float* dh,
                        float* dact, const std::vector<int64_t>& w13,
                        const std::vector<int64_t>& w2);
  // arch zaya1 (zaya.cpp)
  void ensure_zaya_activations(int64_t batch, int64_t seq);
  ForwardResult zaya_forward(const int32_t* inputs, const int32_t* targets, int64_t batch,
                             int64_t seq);
  void zaya_backward();
  DecodeState zaya_new_decode_state(int64_t max_len) const;
  const float* zaya_decode_step(DecodeState& state, int32_t token);
  const float* zaya_logits() const;

  ModelConfig config_;
  ParamTable table_;
  DType precision_;
  std::vector<float> params_, grads_;
  std::vector<bf16> params_bf16_;
  std::vector<bf16> convert_scratch_[3];
  std::unique_ptr<Activations> acts_;
  std::unique_ptr<ZayaActivations, ZayaActivationsDeleter> zacts_;
  std::vector<ops::ZayaBalancer> balancers_;
  std::vector<int64_t> class_counts_;
  OpTimes op_times_;
};

}  // namespace foundry
