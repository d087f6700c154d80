#include "train/optimizer_config.h"

#include "base/error.h"

namespace foundry {
namespace {

// The run config accepts a wider range than Muon does for two keys: checked here, by name.
MuonOptions muon_options(const TrainConfig& tc) {
  if (tc.muon_ns_steps < 1)
    fail(fmt::format("train.muon_ns_steps = {}: Muon needs at least 1 Newton-Schulz step",
                     tc.muon_ns_steps),
         "set train.muon_ns_steps to 5 (the usual value)");
  if (!(tc.muon_rms_scale > 0))
    fail(fmt::format("train.muon_rms_scale = {} must be positive", tc.muon_rms_scale),
         "set train.muon_rms_scale to 0.2 (matches the RMS of a typical AdamW update)");
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
