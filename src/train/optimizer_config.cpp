#include "train/optimizer_config.h"

#include "base/error.h"

namespace foundry {
namespace {

// Its keys' ranges are checked with the run config (check_train_config).
MuonOptions muon_options(const TrainConfig& tc) {
  MuonOptions o;
  o.momentum = tc.muon_momentum;
  o.nesterov = tc.muon_nesterov;
  o.ns_steps = static_cast<int>(tc.muon_ns_steps);
  o.bf16_newton_schulz = tc.muon_ns_precision == DType::bf16;
  o.weight_decay = tc.weight_decay;  // one decay coefficient for both (see optim/muon.h)
  o.rms_scale = tc.muon_rms_scale;
  return o;
}

}  // namespace

OptimizerOptions optimizer_options(const TrainConfig& tc) {
  OptimizerOptions o;
  o.adamw.beta1 = tc.beta1;
  o.adamw.beta2 = tc.beta2;
  o.adamw.eps = tc.eps;
  o.adamw.weight_decay = tc.weight_decay;
  if (tc.optimizer == OptimizerKind::muon) {
    o.muon = muon_options(tc);
    // AdamW keeps only what Muon does not update (embedding, norms, router, ...).
    o.adamw.applies = [](const ParamInfo& info) { return !muon_applies(info); };
  }
  o.zero1 = tc.zero1;
  o.bucket_elements = static_cast<int64_t>(tc.grad_bucket_mib * (1 << 20) / sizeof(float));
  return o;
}

}  // namespace foundry
