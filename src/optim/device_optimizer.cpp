#include "optim/device_optimizer.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/page_slab.h"
#include "base/slab_range.h"
#include "base/timer.h"
#include "kernels/backend.h"

namespace foundry {
namespace {

// One state slab (laid out like the part of the parameter slab) in the backend's memory, with
// its host copy once a checkpoint is saved or loaded through host memory (released after a
// load's upload). Only the ranges of the tensors its optimizer updates take memory: the rest
// of the part (Muon's matrices in AdamW's slabs, everything else in Muon's) are the slab's
// holes, and the host copy's pages there are never written.
struct StateSlab {
  std::string name;
  SlabRanges kept;  // of the part, sorted
  BackendBuffer device;
  PageSlab<float> host;  // allocated at the first save or load
};

// `ranges` sorted, with adjacent ones joined.
SlabRanges joined(SlabRanges ranges) {
  std::sort(ranges.begin(), ranges.end());
  SlabRanges out;
  for (const SlabRange& r : ranges)
    if (!out.empty() && out.back().end == r.begin)
      out.back().end = r.end;
    else
      out.push_back(r);
  return out;
}

class DeviceOptimizer final : public DataParallelOptimizer {
 public:
  DeviceOptimizer(const ParamTable& table, const OptimizerOptions& options, Backend& backend,
                  std::unique_ptr<OptimizerKernels> kernels, DeviceOptimizerPart part)
      : table_(table),
        options_(options),
        backend_(backend),
        kernels_(std::move(kernels)),
        range_(part.range.value_or(SlabRange{0, table.total_elements()})),
        total_sum_of_squares_(std::move(part.total_sum_of_squares)),
        adam_(table, options.adamw),
        update_(backend) {
    const SlabRange r = range_;
    FOUNDRY_CHECK(r.begin >= 0 && r.end <= table.total_elements() && r.begin <= r.end);
    const int64_t bytes = r.size() * static_cast<int64_t>(sizeof(float));
    SlabRanges adam_kept, muon_kept;
    for (const ParamInfo& p : table.params()) {
      const SlabRange in = intersect({p.offset, p.offset + p.numel}, r);
      if (in.size() == 0) continue;
      const SlabRange local{in.begin - r.begin, in.end - r.begin};
      if (updated_by_adamw(p))
        adam_kept.push_back(local);
      else if (options.muon && muon_applies(p))
        muon_kept.push_back(local);
    }
    // Zeroed, as allocate_slab gives them.
    auto add_slab = [&](const std::string& name, const SlabRanges& kept) {
      const ByteRanges holes =
          to_byte_ranges(complement(kept, r.size()), static_cast<int64_t>(sizeof(float)));
      slabs_.push_back({name, kept, BackendBuffer::slab(backend, bytes, holes), {}});
    };
    for (const std::string& name : AdamW::state_names()) add_slab(name, joined(adam_kept));
    if (options.muon) {
      muon_.emplace(table, *options.muon);  // checks the options; its tensors are Muon's
      add_slab(Muon::state_names().front(), joined(muon_kept));
      for (const ParamInfo& t : muon_->tensors()) {
        const SlabRange in = intersect({t.offset, t.offset + t.numel}, r);
        if (in.size() == 0) continue;
        if (in.size() != t.numel)
          fail(fmt::format("the optimizer's part [{}, {}) of the slab cuts Muon matrix {} "
                           "([{}, {}))",
                           r.begin, r.end, t.name, t.offset, t.offset + t.numel),
               "a part holds each Muon matrix whole or not at all (Zero1Layout::state_range)");
        muon_tensors_.push_back(t);
      }
    }
    std::vector<SlabChunk> norm, adam;
    for (const ParamInfo& p : table.params()) {
      const SlabRange in = intersect({p.offset, p.offset + p.numel}, r);
      if (in.size() == 0) continue;
      norm.push_back({in.begin - r.begin, in.size(), false});
      if (updated_by_adamw(p)) adam.push_back({in.begin - r.begin, in.size(), adam_.decays(p)});
    }
    kernels_->set_runs(norm, adam);
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
    const int64_t b = range_.begin;
    float* p = params + b;
    const float* g = grads + b;
    double sum = kernels_->sum_of_squares(g);
    if (total_sum_of_squares_) sum = total_sum_of_squares_(sum);
    const double norm = std::sqrt(sum);
    if ((veto && veto(norm)) || !std::isfinite(norm)) return norm;
    const float grad_scale = clip_factor(norm, max_norm);
    bf16* p16 = weights_bf16_ ? weights_bf16_ + b : nullptr;
    kernels_->adamw(p, g, slab("exp_avg"), slab("exp_avg_sq"), p16,
                    adamw_scalars(options_.adamw, lr, step), grad_scale);
    if (options_.muon) muon_step(params, grads, lr, grad_scale);
    return norm;
  }

  const GradientReduceStats* last_reduce() const override { return nullptr; }
  bool write_bf16_weights(bf16* mirror) override {
    weights_bf16_ = mirror;
    return true;
  }

  // The state's own bytes (its slabs' holes take none, up to the device's chunk granularity).
  int64_t state_bytes() const override {
    int64_t n = 0;
    for (const StateSlab& s : slabs_)
      for (const SlabRange& k : s.kept) n += k.size() * static_cast<int64_t>(sizeof(float));
    return n;
  }
  SlabRange parameters_to_save() const override { return range_; }
  // A loaded state reaches the device before anything reads it there (the first step, a save).
  std::vector<StateRun> states_to_save_runs() override {
    upload_loaded_state();
    for (StateSlab& s : slabs_) {
      host_copy(s);
      for (const SlabRange& k : s.kept)
        backend_.to_host(s.host.data() + k.begin, s.device.as<float>() + k.begin,
                         k.size() * static_cast<int64_t>(sizeof(float)));
    }
    return runs();
  }
  std::vector<StateRun> states_to_load_runs() override {
    for (StateSlab& s : slabs_) host_copy(s);
    loaded_ = true;
    return runs();
  }
  std::vector<StateRun> live_state_runs() override {
    upload_loaded_state();
    return runs(/*on_device=*/true);
  }

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

  float* slab(const std::string& name) {
    for (StateSlab& s : slabs_)
      if (s.name == name) return s.device.as<float>();
    FOUNDRY_CHECK(false);
    return nullptr;
  }

  void host_copy(StateSlab& s) const {
    if (s.host.empty()) s.host = PageSlab<float>(static_cast<size_t>(range_.size()));
  }

  // Each tensor's state (its elements in the part) in the slabs of the optimizer that updates
  // it (as LocalOptimizer): in the host copies, or where it lives on the device.
  std::vector<StateRun> runs(bool on_device = false) {
    std::vector<StateRun> out;
    const SlabRange r = range_;
    for (const ParamInfo& p : table_.params()) {
      const bool muon = options_.muon && muon_applies(p);
      if (!muon && !adam_.updates(p)) continue;
      const SlabRange in = intersect({p.offset, p.offset + p.numel}, r);
      if (in.size() == 0) continue;
      for (const std::string& name : muon ? Muon::state_names() : AdamW::state_names())
        for (StateSlab& s : slabs_)
          if (s.name == name) {
            float* base = on_device ? s.device.as<float>() : s.host.data();
            out.push_back({name, in.begin, in.end, base + (in.begin - r.begin), on_device});
          }
    }
    return out;
  }

  void upload_loaded_state() {
    if (!loaded_) return;
    for (StateSlab& s : slabs_) {
      for (const SlabRange& k : s.kept)
        backend_.from_host(s.device.as<float>() + k.begin, s.host.data() + k.begin,
                           k.size() * static_cast<int64_t>(sizeof(float)));
      s.host = PageSlab<float>();  // made again if a save needs it
    }
    loaded_ = false;
  }

  void muon_step(float* params, const float* grads, double lr, float grad_scale) {
    const MuonOptions& o = *options_.muon;
    float* momentum = slab(Muon::state_names().front());
    for (const ParamInfo& t : muon_tensors_) {
      const int64_t rows = t.shape[0], cols = t.shape[1], n = t.numel;
      float* u = update_.get_as<float>(n);
      kernels_->muon_momentum(u, momentum + (t.offset - range_.begin), grads + t.offset, n,
                              static_cast<float>(o.momentum), o.nesterov, grad_scale);
      kernels_->newton_schulz(u, rows, cols, o.ns_steps, o.bf16_newton_schulz);
      const float keep = t.weight_decay ? static_cast<float>(1.0 - lr * o.weight_decay) : 1.0f;
      const float step_size = static_cast<float>(
          lr * o.rms_scale * std::sqrt(static_cast<double>(std::max(rows, cols))));
      kernels_->muon_apply(params + t.offset, u, n, keep, step_size,
                           weights_bf16_ ? weights_bf16_ + t.offset : nullptr);
    }
  }

  const ParamTable& table_;
  OptimizerOptions options_;
  Backend& backend_;
  std::unique_ptr<OptimizerKernels> kernels_;
  SlabRange range_;  // the part of the slab this optimizer updates
  std::function<double(double)> total_sum_of_squares_;
  // The CPU optimizers for their rules (which tensors each updates, which decay) and option
  // checks; their host slabs are never written, so their pages take no memory.
  AdamW adam_;
  std::optional<Muon> muon_;
  std::vector<ParamInfo> muon_tensors_;  // the Muon matrices in the part
  std::vector<StateSlab> slabs_;
  GrowingBuffer update_;
  bf16* weights_bf16_ = nullptr;
  bool loaded_ = false;
  OpTimes* op_times_ = nullptr;
};

}  // namespace

std::unique_ptr<DataParallelOptimizer> make_device_optimizer(
    const ParamTable& table, const OptimizerOptions& options, Backend& backend,
    std::unique_ptr<OptimizerKernels> kernels, DeviceOptimizerPart part) {
  return std::make_unique<DeviceOptimizer>(table, options, backend, std::move(kernels),
                                           std::move(part));
}

}  // namespace foundry
