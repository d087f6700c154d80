#include "model/lm_head.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "base/error.h"
#include "kernels/ops.h"

namespace foundry {

LmHeadWeights LmHeadWeights::of(const ParamTable& t) {
  return {t.get("model.norm.weight").offset, t.get("model.embed_tokens.weight").offset};
}

void LmHeadActs::take(Arena& arena, const ModelConfig& c, BatchShape s) {
  const int64_t N = s.rows();
  n = arena.take<float>(N * c.d_model);
  rstd = arena.take<float>(N);
  logits = arena.take<float>(N * c.padded_vocab());
  losses = arena.take<float>(N);
  mean_loss = arena.take<double>(1);
}

void check_targets(const int32_t* targets, int64_t n, int64_t vocab_size) {
  for (int64_t i = 0; i < n; ++i)
    if (targets[i] < 0 || targets[i] >= vocab_size)
      fail(fmt::format("target token id {} at position {} is outside the vocabulary [0, {})",
                       targets[i], i, vocab_size));
}

double lm_head_forward(Compute& cx, const LmHeadWeights& w, LmHeadActs& a, const float* x,
                       const int32_t* targets, int64_t N) {
  const ModelConfig& c = cx.config;
  const int64_t C = c.d_model, Vp = c.padded_vocab();
  {
    auto t = cx.time("rmsnorm");
    cx.ops.rmsnorm_forward(a.n, a.rstd, x, cx.p(w.norm), N, C, static_cast<float>(c.rms_norm_eps));
  }
  {
    auto t = cx.time("lm_head_gemm");
    cx.linear_forward(a.logits, a.n, w.embed, N, Vp, C);
  }
  if (!targets) return 0;
  auto t = cx.time("cross_entropy");
  // dlogits overwrite the logits in place: backward needs only the gradient. In bf16 they are
  // written as the backward GEMMs' input, with no float copy between.
  // d(mean loss)/dlogits, times the loss's weight in the step (1, or 1/n of n micro-batches).
  const float scale = static_cast<float>(cx.loss_weight) / static_cast<float>(N);
  if (cx.precision == DType::bf16)
    cx.ops.cross_entropy_bf16(reinterpret_cast<bf16*>(a.logits), 2 * Vp, a.losses, a.mean_loss,
                              a.logits, targets, N, c.vocab_size, Vp, scale);
  else
    cx.ops.cross_entropy(a.logits, a.losses, a.mean_loss, a.logits, targets, N, c.vocab_size, Vp,
                         scale);
  double loss = 0;
  cx.ops.to_host(&loss, a.mean_loss, sizeof(double));
  return loss;
}

void lm_head_backward(Compute& cx, const LmHeadWeights& w, const LmHeadActs& a, const float* x,
                      float* dx, float* dn, int64_t N) {
  const int64_t C = cx.config.d_model, Vp = cx.config.padded_vocab();
  {
    auto t = cx.time("lm_head_gemm");
    // logits = n·Eᵀ: dn = dlogits·E, dE += dlogitsᵀ·n.
    // dlogits in the GEMM precision, in place of the logits (bf16 rows at stride 2·Vp).
    const int64_t ld = cx.precision == DType::bf16 ? 2 * Vp : Vp;
    cx.linear_backward(dn, a.logits, ld, a.n, w.embed, N, Vp, C, false);
  }
  auto t = cx.time("rmsnorm");
  cx.ops.zero(dx, N * C * sizeof(float));
  cx.ops.rmsnorm_backward(dx, cx.g(w.norm), dn, x, cx.p(w.norm), a.rstd, N, C);
}

void lm_head_decode(Compute& cx, const LmHeadWeights& w, const float* x, int64_t batch,
                    float* n, float* rstd, float* logits) {
  const ModelConfig& c = cx.config;
  const int64_t Vp = c.padded_vocab();
  cx.ops.rmsnorm_forward(n, rstd, x, cx.p(w.norm), batch, c.d_model,
                       static_cast<float>(c.rms_norm_eps));
  cx.linear_forward(logits, n, w.embed, batch, Vp, c.d_model);
}

}  // namespace foundry
