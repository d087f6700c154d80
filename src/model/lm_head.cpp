// The LM head and loss, shared by both architectures: the final RMSNorm, logits through the
// tied embedding, and the mean cross-entropy over the real vocabulary.
#include "base/error.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace foundry {

double Model::lm_head_forward(const LmHead& h, const float* x, const int32_t* targets, int64_t N) {
  const ModelConfig& c = config_;
  const int64_t C = c.d_model, Vp = c.padded_vocab();
  {
    ScopedOpTimer t(&op_times_, "rmsnorm");
    ops::rmsnorm_forward(h.nf, h.nf_rstd, x, params_.data() + h.final_norm, N, C,
                         static_cast<float>(c.rms_norm_eps));
  }
  {
    ScopedOpTimer t(&op_times_, "lm_head_gemm");
    linear_forward(h.logits, h.nf, h.embed, N, Vp, C);
  }
  if (!targets) return 0;
  ScopedOpTimer t(&op_times_, "cross_entropy");
  for (int64_t i = 0; i < N; ++i)
    if (targets[i] < 0 || targets[i] >= c.vocab_size)
      fail(fmt::format("target token id {} at position {} is outside the vocabulary [0, {})",
                       targets[i], i, c.vocab_size));
  // dlogits overwrite the logits in place: backward needs only the gradient.
  return ops::cross_entropy(h.logits, h.losses, h.logits, targets, N, c.vocab_size, Vp,
                            1.0f / static_cast<float>(N));
}

void Model::lm_head_backward(const LmHead& h, float* dx, float* dn, const float* x, int64_t N) {
  const int64_t C = config_.d_model, Vp = config_.padded_vocab();
  float* G = grads_.data();
  {
    ScopedOpTimer t(&op_times_, "lm_head_gemm");
    // logits = nf · E^T: dnf = dlogits · E, dE += dlogits^T · nf.
    linear_backward(dn, G + h.embed, h.logits, h.nf, h.embed, N, Vp, C, false);
  }
  {
    ScopedOpTimer t(&op_times_, "rmsnorm");
    std::memset(dx, 0, N * C * sizeof(float));
    ops::rmsnorm_backward(dx, G + h.final_norm, dn, x, params_.data() + h.final_norm, h.nf_rstd,
                          N, C);
  }
  gradients_final(h.final_norm);
}

}  // namespace foundry
