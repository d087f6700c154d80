#include "optim/device_optimizer.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/timer.h"
#include "cuda/adamw.h"
#include "cuda/muon.h"
#include "cuda/reductions.h"
#include "cuda/runtime.h"

namespace foundry {
namespace {

// One state slab (laid out like the parameters) on the GPU, with its host copy for checkpoints.
struct StateSlab {
  std::string name;
  gpu::DeviceBuffer device;
  std::vector<float> host;  // allocated at the first save or load
};

class DeviceOptimizer final : public DataParallelOptimizer {
 public:
  DeviceOptimizer(const ParamTable& table, const OptimizerOptions& options)
      : table_(table), options_(options), adam_(table, options.adamw) {
    const int64_t bytes = table.total_elements() * static_cast<int64_t>(sizeof(float));
    for (const std::string& name : AdamW::state_names())
      slabs_.push_back({name, gpu::DeviceBuffer(bytes), {}});  // zeroed
    if (options.muon) {
      muon_.emplace(table, *options.muon);  // checks the options; its tensors are Muon's
      slabs_.push_back({Muon::state_names().front(), gpu::DeviceBuffer(bytes), {}});
    }
    std::vector<gpu::AdamWRange> all, adam;
    for (const ParamInfo& p : table.params()) {
      if (p.numel == 0) continue;
      all.push_back({p.offset, p.numel, 0});
      if (updated_by_adamw(p)) adam.push_back({p.offset, p.numel, adam_.decays(p) ? 1 : 0});
    }
    all_ranges_ = upload(all);
    adam_ranges_ = upload(adam);
    all_count_ = static_cast<int64_t>(all.size());
    adam_count_ = static_cast<int64_t>(adam.size());
    sum_squares_ = gpu::DeviceBuffer(sizeof(double));
  }

  void begin_backward(float*) override {}
  void gradients_final(int64_t) override {}

  double step(float* params, float* grads, double lr, int64_t step, double max_norm,
              const UpdateVeto& veto) override {
    ScopedOpTimer t(op_times_, "optimizer");
    check_max_norm(max_norm);  // before any work
    if (step < 1)
      fail(fmt::format("optimizer step number {} must be >= 1 (steps are 1-based)", step));
    upload_loaded_state();
    const double norm = grad_norm(grads);
    if ((veto && veto(norm)) || !std::isfinite(norm)) return norm;
    const float grad_scale = clip_factor(norm, max_norm);
    auto* weights16 = reinterpret_cast<uint16_t*>(weights_bf16_);
    if (adam_count_ > 0) {
      const AdamWScalars s = adamw_scalars(options_.adamw, lr, step);
      const gpu::AdamWCoefficients c{s.beta1,     s.one_minus_beta1,  s.beta2, s.one_minus_beta2,
                                     s.step_size, s.sqrt_correction2, s.eps,   s.decay_factor};
      gpu::adamw_update(params, grads, slab("exp_avg"), slab("exp_avg_sq"), weights16,
                        adam_ranges_.as<gpu::AdamWRange>(), adam_count_, c, grad_scale);
    }
    if (options_.muon) muon_step(params, grads, lr, grad_scale, weights16);
    return norm;
  }

  const GradientReduceStats* last_reduce() const override { return nullptr; }
  bool write_bf16_weights(bf16* mirror) override {
    weights_bf16_ = mirror;
    return true;
  }

  int64_t state_bytes() const override {
    int64_t n = 0;
    for (const StateSlab& s : slabs_) n += s.device.bytes();
    return n;
  }
  SlabRange parameters_to_save() const override { return {0, table_.total_elements()}; }
  std::vector<StateRun> states_to_save_runs() override {
    for (StateSlab& s : slabs_) {
      host_copy(s);
      s.device.download(s.host.data(), s.device.bytes());
    }
    return runs();
  }
  std::vector<StateRun> states_to_load_runs() override {
    for (StateSlab& s : slabs_) host_copy(s);
    loaded_ = true;
    return runs();
  }
  std::vector<StateRun> live_state_runs() override { return runs(/*on_device=*/true); }

  void shard_expert_storage(Model&, int) override {}
  std::string describe() const override {
    return describe_optimizer_split(table_, options_.muon.has_value()) + " on the GPU";
  }
  const char* layout_name() const override { return "single process"; }
  void set_op_times(OpTimes* times) override { op_times_ = times; }

 private:
  bool updated_by_adamw(const ParamInfo& p) const {
    if (options_.muon && muon_applies(p)) return false;
    return adam_.updates(p);
  }

  static gpu::DeviceBuffer upload(const std::vector<gpu::AdamWRange>& ranges) {
    gpu::DeviceBuffer b(std::max<int64_t>(1, static_cast<int64_t>(ranges.size() *
                                                                  sizeof(gpu::AdamWRange))));
    if (!ranges.empty())
      b.upload(ranges.data(), static_cast<int64_t>(ranges.size() * sizeof(gpu::AdamWRange)));
    return b;
  }

  float* slab(const std::string& name) {
    for (StateSlab& s : slabs_)
      if (s.name == name) return s.device.as<float>();
    FOUNDRY_CHECK(false);
    return nullptr;
  }

  void host_copy(StateSlab& s) const {
    if (s.host.empty()) s.host.assign(static_cast<size_t>(table_.total_elements()), 0.0f);
  }

  // Each tensor's state in the slabs of the optimizer that updates it (as LocalOptimizer):
  // in the host copies, or where it lives on the device.
  std::vector<StateRun> runs(bool on_device = false) {
    std::vector<StateRun> out;
    for (const ParamInfo& p : table_.params()) {
      const bool muon = options_.muon && muon_applies(p);
      if (!muon && !adam_.updates(p)) continue;
      for (const std::string& name : muon ? Muon::state_names() : AdamW::state_names())
        for (StateSlab& s : slabs_)
          if (s.name == name) {
            float* base = on_device ? s.device.as<float>() : s.host.data();
            out.push_back({name, p.offset, p.offset + p.numel, base + p.offset, on_device});
          }
    }
    return out;
  }

  void upload_loaded_state() {
    if (!loaded_) return;
    for (StateSlab& s : slabs_) s.device.upload(s.host.data(), s.device.bytes());
    loaded_ = false;
  }

  double grad_norm(const float* grads) {
    gpu::ops::sum_of_squares(sum_squares_.as<double>(), grads,
                             all_ranges_.as<gpu::AdamWRange>(), all_count_, workspace_);
    double sum = 0;
    sum_squares_.download(&sum, sizeof sum);
    return std::sqrt(sum);
  }

  void muon_step(float* params, const float* grads, double lr, float grad_scale,
                 uint16_t* weights16) {
    const MuonOptions& o = *options_.muon;
    float* momentum = slab(Muon::state_names().front());
    for (const ParamInfo& t : muon_->tensors()) {
      const int64_t rows = t.shape[0], cols = t.shape[1], n = t.numel;
      auto* u = static_cast<float*>(update_.get(n * static_cast<int64_t>(sizeof(float))));
      gpu::muon_momentum(u, momentum + t.offset, grads + t.offset, n,
                         static_cast<float>(o.momentum), o.nesterov, grad_scale);
      gpu::ops::newton_schulz(u, u, rows, cols, o.ns_steps, o.bf16_newton_schulz, workspace_);
      const float keep = t.weight_decay ? static_cast<float>(1.0 - lr * o.weight_decay) : 1.0f;
      const float step_size = static_cast<float>(
          lr * o.rms_scale * std::sqrt(static_cast<double>(std::max(rows, cols))));
      gpu::muon_apply(params + t.offset, u, n, keep, step_size,
                      weights16 ? weights16 + t.offset : nullptr);
    }
  }

  const ParamTable& table_;
  OptimizerOptions options_;
  // The CPU optimizers for their rules (which tensors each updates, which decay) and option
  // checks; their host slabs are never written, so their pages take no memory.
  AdamW adam_;
  std::optional<Muon> muon_;
  std::vector<StateSlab> slabs_;
  gpu::DeviceBuffer all_ranges_, adam_ranges_, sum_squares_;
  int64_t all_count_ = 0, adam_count_ = 0;
  gpu::Workspace workspace_, update_;
  bf16* weights_bf16_ = nullptr;
  bool loaded_ = false;
  OpTimes* op_times_ = nullptr;
};

}  // namespace

std::unique_ptr<DataParallelOptimizer> make_device_optimizer(const ParamTable& table,
                                                             const OptimizerOptions& options) {
  return std::make_unique<DeviceOptimizer>(table, options);
}

}  // namespace foundry
