// The ZAYA1 architecture (arch "zaya1"): forward, backward and incremental decoding, composed
// from the kernels in kernels/cca.h, kernels/zaya_router.h, kernels/ops.h and attention.h
// following the recipes in those headers. See model.h for the layer structure.
#include <cmath>
#include <cstring>
#include <limits>

#include "base/error.h"
#include "kernels/attention.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace foundry {

struct ZayaActivations {};

void ZayaActivationsDeleter::operator()(ZayaActivations* a) const { delete a; }

void Model::reset_balancers() {
  balancers_.clear();
  class_counts_.clear();
  if (!config_.is_zaya()) return;
  ops::ZayaBalancerOptions o;
  o.lr = config_.balance_bias_lr;
  o.skip_bias_init = static_cast<float>(config_.skip_bias_init);
  for (int64_t l = 0; l < config_.n_layers; ++l)
    balancers_.emplace_back(config_.n_experts, config_.router_skip_class, o);
  class_counts_.assign(config_.n_layers * config_.router_classes(), 0);
}

void Model::update_balancers(const int64_t* counts, int64_t assignments) {
  const int64_t S = config_.router_classes();
  for (size_t l = 0; l < balancers_.size(); ++l) balancers_[l].update(counts + l * S, assignments);
}

json Model::balancer_state() const {
  json layers = json::array();
  for (const auto& b : balancers_)
    layers.push_back({{"bias", b.bias}, {"exp_avg", b.exp_avg}, {"exp_avg_sq", b.exp_avg_sq},
                      {"step", b.step}});
  return layers;
}

void Model::load_balancer_state(const json& state) {
  if (!state.is_array() || state.size() != balancers_.size())
    fail(fmt::format("router balancer state holds {} MoE sublayers, the model has {}",
                     state.is_array() ? state.size() : 0, balancers_.size()),
         "load a checkpoint written for this model config");
  try {
    for (size_t l = 0; l < balancers_.size(); ++l) {
      const json& s = state[l];
      balancers_[l].load_state(s.at("bias").get<std::vector<float>>(),
                               s.at("exp_avg").get<std::vector<float>>(),
                               s.at("exp_avg_sq").get<std::vector<float>>(),
                               s.at("step").get<int64_t>());
    }
  } catch (const json::exception& e) {
    fail(fmt::format("router balancer state is malformed: {}", e.what()),
         "load a checkpoint written by this version of foundry");
  }
}

}  // namespace foundry

namespace foundry {
ForwardResult Model::zaya_forward(const int32_t*, const int32_t*, int64_t, int64_t) {
  fail("zaya1 forward: not built yet");
}
void Model::zaya_backward() { fail("zaya1 backward: not built yet"); }
Model::DecodeState Model::zaya_new_decode_state(int64_t) const { fail("zaya1 decode: not built yet"); }
const float* Model::zaya_decode_step(DecodeState&, int32_t) { fail("zaya1 decode: not built yet"); }
const float* Model::zaya_logits() const { fail("zaya1 logits: not built yet"); }
void Model::ensure_zaya_activations(int64_t, int64_t) {}
}  // namespace foundry
