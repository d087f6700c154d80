// The model: parameters, gradients and (for bf16) GEMM weight copies in slabs laid out by the
// ParamTable, and one architecture that computes with them, chosen once from model.arch:
//   arch "moe"    the standard decoder-only MoE transformer   (model/standard_moe.cpp)
//   arch "zaya1"  ZAYA1: CCA attention, the ZAYA1 router with its EDA state and balancing
//                 biases, residual scaling                     (model/zaya.cpp)
// Both are short compositions of the sublayers, each a forward/backward pair over its own
// activation struct: attention_sublayer.h, cca_sublayer.h, moe_sublayer.h (with routers.h
// and experts.h), lm_head.h. Activations for a batch shape are one allocation.
// Loss = mean cross-entropy (+ aux_loss_coef · mean over layers of the load-balancing loss
// for arch moe). The ZAYA1 balancing biases are model state (not parameters) updated after
// every optimizer step from the class counts.
//
// Expert parallelism (optional, set_expert_parallel): the experts of every MoE sublayer are
// sharded over a group of ranks and the routed rows travel to their experts' owners and
// back around the expert computation (model/expert_parallel.h, docs/expert-parallel.md).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "base/bf16.h"
#include "base/config_reader.h"
#include "base/page_slab.h"
#include "base/slab_range.h"
#include "base/timer.h"
#include "kernels/cca.h"
#include "kernels/cpu_backend.h"
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

namespace gpu {
class NcclGroup;
}
class Architecture;
class Communicator;
class Compute;
class ContextParallel;
class ExpertSharding;
class Experts;
struct DecodeRows;

// An architecture's per-sequence decoding state (KV caches and per-token buffers).
struct DecodeScratch {
  virtual ~DecodeScratch() = default;
};

// The balancer options of a config's MoE sublayers (model.balance_rule, balance_bias_lr,
// skip_bias_init); balance_bias_lr 0 takes the rule's default below.
ops::ZayaBalancerOptions balancer_options(const ModelConfig& config);
// The gain of the proportional rule on the logits (docs/zaya1.md, "Balancing"): a load error
// of 0.1 moves the bias by this × 0.1 logit units in one update.
inline constexpr double kProportionalBalanceGain = 1.0;
// The newton rule's damping (its balance_bias_lr) and its boundary window: 0.1 logit units
// on the logits, 0.01 on the probabilities (both about one step of a balanced class).
inline constexpr double kNewtonBalanceDamping = 0.5;
inline constexpr double kNewtonWindowLogits = 0.1;
inline constexpr double kNewtonWindowProbs = 0.01;
// balance_bias_lr's default under a rule: kProportionalBalanceGain, kNewtonBalanceDamping,
// or 1e-3 (adamw's lr and sign_adaptive's initial step).
double default_balance_bias_lr(ops::BalanceRule rule);
// Router balancers as JSON, one object per MoE sublayer: {"rule": name, "bias": [S], the
// rule's state vectors by name (none, "exp_avg" and "exp_avg_sq", or "step_size" and
// "last_sign"), "step": n}; and its inverse into balancers built for the config, which fails
// (Error) naming the problem on a state of another shape. A state saved under another rule
// gives its biases (so routing is as trained) with the configured rule's initial state, and
// returns a note saying so (empty otherwise). States without "rule" are read by the vectors
// they hold.
json balancers_to_json(const std::vector<ops::ZayaBalancer>& balancers);
std::string balancers_from_json(std::vector<ops::ZayaBalancer>& balancers, const json& state);

// What a model is built for: training, or inference alone (evaluation, generation), which
// needs no gradients: on a device their slab is then not allocated (on the host it is never
// touched, so it takes no memory either way).
enum class ModelUse { training, inference };

// The parts of a model's slabs a process on a device never stores (an expert-parallel rank's
// share of the other ranks' experts: Model::shard_expert_storage), in elements: its slabs are
// made without memory there from the start, so they never take the whole model's.
struct SlabHoles {
  SlabRanges params, gradients, bf16;
  bool empty() const { return params.empty() && gradients.empty() && bf16.empty(); }
  bool operator==(const SlabHoles&) const = default;
};

class Model {
 public:
  // The arithmetic runs on `backend` (kernels/backend.h; the CPU's unless given). On a backend
  // without host memory (a GPU) the slabs are the backend's (Backend::allocate_slab), made
  // with `device_holes` (shard_expert_storage must then name the same ones).
  Model(const ModelConfig& config, DType precision, Backend& backend = cpu_backend(),
        ModelUse use = ModelUse::training, const SlabHoles& device_holes = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const ParamTable& table() const { return table_; }
  DType precision() const { return precision_; }

  // The slabs, in the backend's memory (device pointers on a GPU: read and write them there
  // through read_params / write_params / read_grads).
  float* params() { return param_slab(); }
  const float* params() const { return const_cast<Model*>(this)->param_slab(); }
  float* grads() { return grad_slab(); }
  int64_t slab_size() const { return table_.total_elements(); }
  float* param(const std::string& name) { return params() + table_.get(name).offset; }
  float* grad(const std::string& name) { return grads() + table_.get(name).offset; }

  // Where the arithmetic runs (kernels/backend.h).
  Backend& backend() const { return backend_; }
  // Whether the slabs and activations live in a device's memory instead of the host's.
  bool on_device() const { return !backend_.host_memory(); }
  // The whole parameter slab to and from host memory (write_params refreshes the bf16 GEMM
  // copy; it neither reads nor writes the released ranges), and the gradient slab to it:
  // slab_size() floats each.
  void read_params(float* host) const;
  void write_params(const float* host);
  void read_grads(float* host) const;

  // Normal(0, init_std) matrices (output projections scaled by 1/sqrt(2·n_layers)), unit
  // norms, zero padded-vocabulary rows. Deterministic in `seed`.
  void init_weights(uint64_t seed);
  // Refreshes the bf16 GEMM copies after the fp32 weights change (no-op in fp32).
  void sync_weights();
  // The bf16 GEMM copy's slab (laid out like params()), for an optimizer that writes it
  // during its update (DataParallelOptimizer::write_bf16_weights); null in fp32.
  bf16* bf16_weights() { return precision_ == DType::bf16 ? bf16_slab() : nullptr; }

  // inputs/targets [B, T]. Keeps what backward needs. targets may be null (logits only).
  ForwardResult forward(const int32_t* inputs, const int32_t* targets, int64_t batch,
                        int64_t seq);
  // d(loss)/d(params) into grads() for the last forward (which had targets). Needs
  // zero_grads() before each call: it adds into the zeroed gradients, except those of the
  // expert weights, which it writes whole (zero_grads leaves them alone); so two backward
  // passes never accumulate. `accumulate` (gradient accumulation over micro-batches: every
  // backward after the first since zero_grads()) adds to the experts' gradients too.
  void backward(bool accumulate = false);
  void zero_grads();
  // The weight of the next forwards' losses in the gradient backward computes: 1, or 1/n for
  // each of n micro-batches whose gradients add up to the step's (the losses a forward
  // returns stay their own means).
  void set_loss_weight(double weight);

  // Logits [B, T, padded_vocab] of the last forward (after forward with targets == null), in
  // the backend's memory.
  const float* logits() const;

  // The bytes of the activation arena a forward of `batch` sequences of `seq` tokens lays
  // out (everything it keeps for backward and the backward's buffers), measured from the
  // layout itself; model info's itemized estimate is checked against it.
  static int64_t activation_arena_bytes(const ModelConfig& config, int64_t batch, int64_t seq);

  OpTimes& op_times() { return op_times_; }

  // ---- overlapping gradient communication with backward -------------------------------------
  // backward() calls `hook` with decreasing slab offsets o, each meaning: every gradient at
  // offset >= o is final for this backward (the rest of the pass does not touch it): after
  // the final norm, after each layer's MoE sublayer (o = its post-attention norm) and
  // attention sublayer (o = the layer's first tensor), and with o = 0 at the end. A data-
  // parallel reducer starts communicating those gradients while the earlier layers'
  // backward still computes (optim/grad_reduce.h). An empty function turns it off.
  void set_gradients_final_hook(std::function<void(int64_t)> hook) {
    gradients_final_ = std::move(hook);
  }
  // Called with "forward" or "backward" after each layer's forward and backward: a long
  // step (a long sequence on few cores) shows progress layer by layer, so a watchdog can
  // tell it from a hang. An empty function turns it off.
  void set_progress_hook(std::function<void(const char*)> hook) { progress_ = std::move(hook); }

  // ---- ZAYA1 router balancing (arch zaya1; empty for arch moe) ----------------------------
  // One balancer per MoE sublayer (layer order), holding the per-class balancing bias used
  // for the expert choice and its update rule's state.
  std::vector<ops::ZayaBalancer>& balancers() { return balancers_; }
  const std::vector<ops::ZayaBalancer>& balancers() const { return balancers_; }
  // Class counts of the last forward: [n_layers × router_classes()] (row l = MoE sublayer l),
  // each row summing to batch·seq·top_k. Empty for arch moe.
  const std::vector<int64_t>& router_class_counts() const { return class_counts_; }
  // Under the newton balancing rule, the boundary counts of the last forward
  // (ops::zaya_boundary_counts), laid out like router_class_counts(); empty otherwise.
  const std::vector<int64_t>& router_boundary_counts() const { return boundary_counts_; }
  // One balancing step per MoE sublayer from counts laid out like router_class_counts()
  // (the caller sums them over data-parallel ranks first) covering `assignments` choices
  // per sublayer, with the boundary counts likewise summed when the rule needs them
  // (router_boundary_counts() not empty; null otherwise). No-op for arch moe.
  void update_balancers(const int64_t* counts, int64_t assignments,
                        const int64_t* near = nullptr);
  // Every balancer back to its initial state (init_weights calls this).
  void reset_balancers();
  // The balancers' complete state as JSON (balancers_to_json) and its inverse.
  json balancer_state() const;
  std::string load_balancer_state(const json& state);  // balancers_from_json's note

  // ---- router load statistics ---------------------------------------------------------------
  // Rows routed to each expert in the last forward on this rank: [n_layers × n_experts] (row l
  // = MoE sublayer l), both architectures (ZAYA1's skip class is not an expert; its count is
  // in router_class_counts()). For global loads, sum them over the ranks with
  // sum_router_counts (model/expert_parallel.h), as for router_class_counts().
  std::vector<int64_t> expert_loads() const;

  // ---- expert parallelism -------------------------------------------------------------------
  // Shards the experts of every MoE sublayer over `group` (P ranks, P | n_experts; EP rank p
  // owns experts [p·E/P, (p+1)·E/P)). null (the default) turns it off: everything runs
  // locally, exactly as without this call. `group` must outlive its use here.
  //
  // With a group, forward and backward are collective over it: every rank of the group calls
  // them the same number of times in the same order (batch shapes may differ between ranks).
  // Each rank's routed rows are computed by the experts' owners; a rank computes with, and
  // accumulates gradients for, only the experts it owns, and those gradients include the
  // contributions of every group rank's tokens. The parameter slab and table are unchanged:
  // every rank still stores all experts, and the tensors of experts it does not own keep a
  // zero gradient here. A data-parallel reduction must therefore SUM each expert tensor over
  // the ranks that own it and divide by the total number of ranks like every other tensor
  // (never average it over its owners alone). Averaging the whole gradient slab over all
  // ranks does exactly that and keeps every replica in step (docs/expert-parallel.md).
  // Decoding (decode_step) does not use the group.
  //
  // Must be set between steps (not between a forward and its backward). Fails, naming the
  // rank, unless P divides n_experts. On a device, `nccl` (optional: the same group over
  // NCCL, every rank on a GPU of its own) carries the rows instead of MPI through host memory.
  void set_expert_parallel(const Communicator* group, gpu::NcclGroup* nccl = nullptr);
  // ---- context parallelism ----------------------------------------------------------------
  // Splits every sequence over `group` (C ranks; null, the default, turns it off): rank r
  // holds chunks r and 2C−1−r of each sequence (model/context_parallel.h), and forward then
  // takes this rank's rows, inputs/targets [B, 2·Tc] (ContextParallel::take_local), for
  // sequences of seq·C tokens. Forward and backward are collective over the group; the
  // loss is the mean over this rank's tokens and the gradients are this rank's tokens'
  // (summed with the other ranks' by the data-parallel reduction, like a data-parallel
  // rank's). Must be set between steps. Decoding does not use the group. On a device, `nccl`
  // (optional, as for expert parallelism) carries the exchanged rows instead of MPI.
  void set_context_parallel(const Communicator* group, gpu::NcclGroup* nccl = nullptr);
  const ContextParallel* context_parallel() const { return context_.get(); }

  // The sharding in use, or null without expert parallelism.
  const ExpertSharding* expert_sharding() const;
  const Communicator* expert_parallel_group() const;
  // Stops storing the experts this rank does not own (needs set_expert_parallel): their bf16
  // copies are never needed here, nor their fp32 parameters in `released`, nor their
  // gradients in `gradient_holes` (sorted, disjoint slab ranges [begin, end) inside other EP
  // ranks' experts). ZeRO-1 keeps the parameters of its shard, which it updates
  // (zero1_released_ranges); the gradient holes are every unowned expert unless given (a
  // device's ZeRO-1 reduces into its own range of the gradient slab, so it keeps that).
  // On the CPU those pages go back to the OS and read as zero; the slabs keep these holes
  // (PageSlab): init_weights, zero_grads, sync_weights and backward never write them. On a
  // device the slabs' whole chunks inside them take no memory (made so, SlabHoles, or handed
  // back now: Backend::release_slab_ranges): released parameters and bf16 copies read as
  // scratch, gradient holes as zeros that nothing writes. So a rank holds its experts and the
  // dense tensors, not the whole model; the data-parallel all-gather and checkpoint loads skip
  // released_param_ranges(). Must be set between steps.
  void shard_expert_storage(const SlabRanges& released,
                            std::optional<SlabRanges> gradient_holes = std::nullopt);
  // Whether the expert storage is sharded (shard_expert_storage, or a device's slabs made
  // with holes).
  bool storage_sharded() const { return sharded_; }
  // The fp32 parameter ranges not stored here (sorted, disjoint; empty unless sharded).
  const SlabRanges& released_param_ranges() const {
    return on_device() ? device_holes_.params : params_.holes();
  }
  // Bytes of the parameter, gradient and bf16 slabs backed by memory now.
  int64_t resident_slab_bytes() const;
  // The EP rank whose experts include tensor `p`, or -1 when `p` is not EP-sharded (not an
  // expert tensor, or expert parallelism is off): tells which gradients are summed over
  // owners and which rank's copy of a tensor is the computed one.
  int expert_owner(const ParamInfo& p) const;

  // ---- data parallelism ------------------------------------------------------------------
  // Arch moe: the load-balancing loss's expert shares f_e are counted over `group` (the
  // data-parallel ranks; every rank passes its own batch, all the same size) instead of this
  // rank's batch. Each rank's loss is then E·Σ f_e^global·P_e^local, so the mean of the
  // ranks' losses and gradients (what data parallelism averages) is exactly the global
  // batch's, as in one process: the aux term no longer depends on the layout. forward()
  // becomes collective over `group` (one small all-reduce per MoE layer). null (the
  // default): the shares of this rank's batch. No effect on arch zaya1 (its balancers
  // already see the counts summed over ranks). `group` must outlive its use here.
  void set_data_parallel(const Communicator* group);

  // ---- incremental decoding (generation) -------------------------------------------------
  // `batch` sequences advance one token each per step, all at position `pos` (0-based), using
  // and extending their KV caches, which hold positions < pos. Each step reads the weights
  // once for the whole batch: the projections are GEMMs of B rows and each expert runs once
  // on the batch's tokens routed to it. Sequence b's logits are those it would get decoded
  // alone (up to the GEMMs' rounding order).
  // On a device the caches and buffers are in its memory; the tokens go in and the logits
  // come out through host memory each step.
  struct DecodeState {
    int64_t pos = 0, max_len = 0, batch = 1;
    std::vector<float> logits;             // [batch, padded_vocab] of the last step (host)
    std::unique_ptr<DecodeScratch> arch;   // the architecture's caches and buffers
    BackendBuffer device_io;               // on a device: the step's tokens and logits
  };
  DecodeState new_decode_state(int64_t max_len, int64_t batch = 1) const;
  // tokens [batch] → logits [batch, padded_vocab] (padded entries = -inf).
  const float* decode_step(DecodeState& state, const int32_t* tokens);
  // One sequence (batch 1): logits [padded_vocab].
  const float* decode_step(DecodeState& state, int32_t token) {
    return decode_step(state, &token);
  }

  // ---- decoding rows at their own positions over shared caches -----------------------------
  // The caches of a run of a sequence's positions, [start, start + capacity): a prefix that
  // several sequences share (read by each, stored once) or a sequence's own positions. A row
  // reads a chain of segments, position 0 onwards, and writes its new position at the end of
  // the last. A row's logits are those of its sequence decoded alone with decode_step, bit for
  // bit, however its positions are cut into segments and whatever rows run beside it: decoding
  // holds RowInvariantGemms (kernels/gemm.h), attention sums each row's positions in order
  // (kernels/attention.h), and CCA's decode step is per row. Rows that share a segment read
  // its keys and values once for all of them. On a GPU the same holds up to the products'
  // rounding, which cuBLASLt chooses by the row count.
  struct KvSegment {
    int64_t start = 0, capacity = 0;
    int64_t len = 0;  // positions written
    // In the backend's memory: per layer an ops::DecodeSpan's keys and values, then (arch
    // zaya1) per layer the CCA state after the segment's last position written
    // (ops::decode_state_floats).
    BackendBuffer storage;
    int64_t layers = 0, span_floats = 0, cca_floats = 0;
    float* k(int64_t layer) const { return storage.as<float>() + layer * span_floats; }
    float* v(int64_t layer) const { return k(layers + layer); }
    float* cca(int64_t layer) const {
      return storage.as<float>() + 2 * layers * span_floats + layer * cca_floats;
    }
    int64_t bytes() const { return storage.bytes(); }
  };
  // A segment for positions [start, start + capacity); its CCA state continues `after`'s (the
  // segment that ends at `start`), or starts at zero (start 0, or no `after`).
  KvSegment new_kv_segment(int64_t start, int64_t capacity,
                           const KvSegment* after = nullptr) const;
  // What new_kv_segment(·, capacity).bytes() will be.
  int64_t kv_segment_bytes(int64_t capacity) const;
  struct DecodeRow {
    int32_t token = 0;
    // Segments holding positions 0, 1, … in order, each but the last full up to its len; the
    // row's position is the last one's start + len, where its keys and values go.
    std::vector<KvSegment*> chain;
  };
  // The buffers of decode_rows steps of up to `rows` rows (no caches: the segments hold them).
  DecodeState new_rows_state(int64_t rows) const;
  // Every row's token at its position → logits [rows, padded_vocab]; each row's last segment
  // grows by one position. Several rows may write one segment (a run of a prompt's tokens
  // computed in one step): they take its next positions in row order, each attending to the
  // ones before, and must have the same chain.
  const float* decode_rows(DecodeState& state, const std::vector<DecodeRow>& rows);

 private:
  void init_tensors(float* slab, uint64_t seed,
                    const std::function<bool(const ParamInfo&)>& wanted) const;
  void init_tensor(const ParamInfo& p, uint64_t seed, float* w) const;
  // Gradients were asked of a model built for inference (Error naming `what`).
  void check_training(const char* what) const;
  // Token ids of a decode step, each in the vocabulary (Error naming the first that is not).
  void check_tokens(const int32_t* tokens, int64_t n) const;
  // A decode step of n rows through the architecture: the tokens in, the logits out to
  // s.logits with the padded vocabulary masked (−inf).
  void run_decode(DecodeState& s, const DecodeRows& rows, const int32_t* tokens);
  DecodeState decode_state(int64_t max_len, int64_t batch, bool own_caches) const;
  float* param_slab() { return on_device() ? device_params_.as<float>() : params_.data(); }
  float* grad_slab() { return on_device() ? device_grads_.as<float>() : grads_.data(); }
  bf16* bf16_slab() { return on_device() ? device_bf16_.as<bf16>() : params_bf16_.data(); }

  ModelConfig config_;
  ParamTable table_;
  DType precision_;
  Backend& backend_;
  ModelUse use_;
  PageSlab<float> params_, grads_;  // a backend with host memory: page-backed slabs
  PageSlab<bf16> params_bf16_;
  BackendBuffer device_params_, device_grads_, device_bf16_;  // otherwise
  // A device's sharded expert storage: the slabs' holes (the parameter ranges released, the
  // gradient ranges that read as zeros, the bf16 copies' holes).
  SlabHoles device_holes_;
  bool sharded_ = false;
  bool grads_zeroed_ = false;  // zero_grads() since the last backward()
  std::vector<ops::ZayaBalancer> balancers_;
  std::vector<int64_t> class_counts_;
  std::vector<int64_t> boundary_counts_;
  std::function<void(int64_t)> gradients_final_;
  std::function<void(const char*)> progress_;
  OpTimes op_times_;
  std::unique_ptr<Compute> compute_;
  std::unique_ptr<ContextParallel> context_;
  std::unique_ptr<Experts> experts_;
  std::unique_ptr<Architecture> arch_;  // the one dispatch point between the architectures
};

}  // namespace foundry
