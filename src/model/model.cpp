#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/error.h"
#include "base/hash.h"
#include "base/rng.h"
#include "model/architecture.h"
#include "model/cca_sublayer.h"
#include "model/compute.h"
#include "model/context_parallel.h"
#include "model/expert_parallel.h"
#include "model/experts.h"

namespace foundry {
namespace {
// The first of `ranges` that is out of order or not inside one of `within` (sorted, disjoint).
std::optional<SlabRange> first_outside(const SlabRanges& ranges, const SlabRanges& within) {
  int64_t last = 0;
  for (const SlabRange& r : ranges) {
    bool inside = false;
    for (const SlabRange& w : within) inside = inside || (w.begin <= r.begin && r.end <= w.end);
    if (r.begin < last || r.end < r.begin || !inside) return r;
    last = r.end;
  }
  return std::nullopt;
}

}  // namespace

Model::Model(const ModelConfig& config, DType precision, Backend& backend, ModelUse use,
             const SlabHoles& device_holes)
    : config_(config), table_(config), precision_(precision), backend_(backend), use_(use) {
  const int64_t n = table_.total_elements();
  if (on_device()) {
    using Released = Backend::Released;
    constexpr int64_t kF32 = sizeof(float), kBf16 = sizeof(bf16);
    device_params_ = BackendBuffer::slab(
        backend_, n * kF32, to_byte_ranges(device_holes.params, kF32), Released::scratch);
    if (use_ == ModelUse::training)
      device_grads_ = BackendBuffer::slab(
          backend_, n * kF32, to_byte_ranges(device_holes.gradients, kF32), Released::zeros);
    if (precision_ == DType::bf16)
      device_bf16_ = BackendBuffer::slab(
          backend_, n * kBf16, to_byte_ranges(device_holes.bf16, kBf16), Released::scratch);
    device_holes_ = device_holes;
    sharded_ = !device_holes.empty();
  } else {
    params_ = PageSlab<float>(static_cast<size_t>(n));
    grads_ = PageSlab<float>(static_cast<size_t>(n));
    if (precision_ == DType::bf16) params_bf16_ = PageSlab<bf16>(static_cast<size_t>(n));
  }
  reset_balancers();
  op_times_.set_clock(backend_.op_clock());
  compute_ = std::make_unique<Compute>(config_, precision_, backend, param_slab(), grad_slab(),
                                       bf16_slab(), &op_times_, &gradients_final_);
  compute_->set_progress(&progress_);
  experts_ = std::make_unique<Experts>(*compute_, config_.n_layers);
  const ArchitectureParts parts{*compute_,  *experts_,     table_,
                                balancers_, class_counts_, boundary_counts_};
  arch_ = config_.is_zaya() ? make_zaya1(parts) : make_standard_moe(parts);
}

Model::~Model() = default;

void Model::init_weights(uint64_t seed) {
  if (on_device()) {  // initialized on the host, as on the CPU, and copied over
    std::vector<float> host(static_cast<size_t>(slab_size()), 0.0f);
    init_tensors(host.data(), seed, [](const ParamInfo&) { return true; });
    reset_balancers();
    write_params(host.data());
    return;
  }
  // A tensor only partly stored here is written whole; write_all hands the holes back.
  params_.write_all([&](float* P) {
    params_.for_each_stored([&](int64_t b, int64_t e) { std::fill(P + b, P + e, 0.0f); });
    init_tensors(P, seed, [&](const ParamInfo& p) {
      return params_.stores_any(p.offset, p.offset + p.numel);
    });
  });
  reset_balancers();
  sync_weights();
}

// Each tensor draws from its own stream, so they fill side by side with the same values as one
// by one (a 1.8 B-parameter model in seconds, not a minute): the largest first, for balance.
void Model::init_tensors(float* slab, uint64_t seed,
                         const std::function<bool(const ParamInfo&)>& wanted) const {
  std::vector<const ParamInfo*> order;
  for (const auto& p : table_.params())
    if (wanted(p)) order.push_back(&p);
  std::stable_sort(order.begin(), order.end(),
                   [](const ParamInfo* a, const ParamInfo* b) { return a->numel > b->numel; });
  const int64_t count = static_cast<int64_t>(order.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < count; ++i) init_tensor(*order[i], seed, slab + order[i]->offset);
}

void Model::init_tensor(const ParamInfo& p, uint64_t seed, float* w) const {
  if (p.init == ParamInit::constant) {
    std::fill(w, w + p.numel, static_cast<float>(p.init_value));
    return;
  }
  // One stream per tensor, keyed by its name, so adding a tensor never shifts the others.
  uint64_t key = seed ^ hash64(p.name.data(), p.name.size());
  Rng rng(Rng::splitmix64(key));
  int64_t rows_real = p.numel;
  if (p.kind == ParamKind::embedding) rows_real = config_.vocab_size * config_.d_model;
  for (int64_t i = 0; i < rows_real; ++i) w[i] = static_cast<float>(rng.normal() * p.init_value);
}

void Model::read_params(float* host) const {
  backend_.to_host(host, params(), slab_size() * static_cast<int64_t>(sizeof(float)));
}

void Model::write_params(const float* host) {
  for (const SlabRange& r : complement(released_param_ranges(), slab_size()))
    backend_.from_host(param_slab() + r.begin, host + r.begin,
                       r.size() * static_cast<int64_t>(sizeof(float)));
  sync_weights();
}

void Model::read_grads(float* host) const {
  check_training("reading the gradients");
  backend_.to_host(host, const_cast<Model*>(this)->grad_slab(),
                   slab_size() * static_cast<int64_t>(sizeof(float)));
}

void Model::check_training(const char* what) const {
  if (use_ == ModelUse::inference)
    fail(fmt::format("{}: this model was built for inference and has no gradients", what),
         "build the model for training (ModelUse::training)");
}

void Model::sync_weights() {
  if (precision_ != DType::bf16) return;
  if (on_device()) {
    backend_.to_bf16(bf16_slab(), param_slab(), slab_size());
    return;
  }
  params_bf16_.for_each_stored([&](int64_t b, int64_t e) {
    convert_to_bf16(params_.data() + b, params_bf16_.data() + b, e - b);
  });
}

void Model::zero_grads() {
  check_training("zero_grads");
  // The expert weights backward writes whole are left alone: sorted slab intervals to skip.
  SlabRanges skip;
  for (const ParamInfo& p : table_.params())
    if (p.numel > 0 && experts_->writes_whole_gradient(p))
      skip.emplace_back(p.offset, p.offset + p.numel);
  std::sort(skip.begin(), skip.end());
  float* g = grad_slab();
  auto zero = [&](int64_t b, int64_t e) {
    if (e > b) backend_.zero(g + b, (e - b) * static_cast<int64_t>(sizeof(float)));
  };
  auto for_each_stored = [&](const std::function<void(int64_t, int64_t)>& f) {
    if (on_device())
      for (const SlabRange& r : complement(device_holes_.gradients, slab_size())) f(r.begin, r.end);
    else
      grads_.for_each_stored(f);
  };
  for_each_stored([&](int64_t b, int64_t e) {
    int64_t at = b;
    for (const auto& [skip_b, skip_e] : skip) {
      if (skip_e <= at) continue;
      if (skip_b >= e) break;
      zero(at, skip_b);
      at = std::max(at, skip_e);
    }
    zero(at, e);
  });
  grads_zeroed_ = true;
}

void Model::shard_expert_storage(const SlabRanges& released,
                                 std::optional<SlabRanges> gradient_holes) {
  const ExpertSharding* sharding = experts_->sharding();
  if (!sharding) fail("shard_expert_storage needs expert parallelism (set_expert_parallel first)");
  const int ep_rank = experts_->group()->rank();
  const auto unowned = unowned_expert_ranges(table_, *sharding, ep_rank);
  const SlabRanges& grad_holes = gradient_holes ? *gradient_holes : unowned;
  const SlabHoles holes{released, grad_holes, precision_ == DType::bf16 ? unowned : SlabRanges{}};
  if (on_device() && sharded_ && holes == device_holes_) return;  // the slabs were made so
  if (sharded_) fail("shard_expert_storage: the expert storage is already sharded otherwise");
  for (const SlabRanges* ranges : {&released, &grad_holes})
    if (const auto bad = first_outside(*ranges, unowned))
      fail(
          fmt::format("shard_expert_storage on EP rank {}: [{}, {}) is not a sorted, "
                      "disjoint range inside another rank's experts",
                      ep_rank, bad->begin, bad->end));
  // Holes first: if a slab fails to hand its chunks back, none of them is written again.
  sharded_ = true;
  if (!on_device()) {
    params_.set_holes(released);
    grads_.set_holes(grad_holes);
    if (!params_bf16_.empty()) params_bf16_.set_holes(unowned);
    return;
  }
  device_holes_ = holes;
  using Released = Backend::Released;
  auto hand_back = [&](BackendBuffer& slab, const SlabRanges& ranges, int64_t element,
                       Released reads) {
    if (slab) backend_.release_slab_ranges(slab.as<void>(), to_byte_ranges(ranges, element), reads);
  };
  hand_back(device_params_, released, sizeof(float), Released::scratch);
  hand_back(device_grads_, grad_holes, sizeof(float), Released::zeros);
  hand_back(device_bf16_, holes.bf16, sizeof(bf16), Released::scratch);
}

int64_t Model::resident_slab_bytes() const {
  if (!on_device())
    return static_cast<int64_t>(params_.resident_bytes() + grads_.resident_bytes() +
                                params_bf16_.resident_bytes());
  int64_t bytes = 0;
  for (const BackendBuffer* slab : {&device_params_, &device_grads_, &device_bf16_})
    if (*slab) bytes += backend_.slab_memory_bytes(slab->as<void>(), slab->bytes());
  return bytes;
}

// ---- expert parallelism ---------------------------------------------------------------------

void Model::set_expert_parallel(const Communicator* group, gpu::NcclGroup* nccl) {
  // (Slabs made with holes take their group once, before shard_expert_storage names them: the
  // holes must be in the other ranks' experts of that group.)
  if (sharded_ && experts_->sharding())
    fail("the expert storage is sharded (shard_expert_storage): this rank no longer holds the "
         "other ranks' experts, so expert parallelism cannot change");
  if (sharded_) {
    const int size = group ? group->size() : 1, rank = group ? group->rank() : 0;
    const SlabRanges unowned =
        unowned_expert_ranges(table_, ExpertSharding(config_.n_experts, size, rank), rank);
    for (const SlabRanges* h :
         {&device_holes_.params, &device_holes_.gradients, &device_holes_.bf16})
      if (const auto bad = first_outside(*h, unowned))
        fail(fmt::format("this model's slabs were made without [{}, {}), which EP rank {} of "
                         "{} owns",
                         bad->begin, bad->end, rank, size),
             "make the model with the holes of its own expert-parallel group and rank");
  }
  experts_->set_group(group, nccl);  // validates first: on error the model keeps its setting
  arch_->drop_activations();
}

const ExpertSharding* Model::expert_sharding() const { return experts_->sharding(); }

const Communicator* Model::expert_parallel_group() const { return experts_->group(); }

int Model::expert_owner(const ParamInfo& p) const {
  const ExpertSharding* s = experts_->sharding();
  return s ? s->owner(p) : -1;
}

void Model::set_context_parallel(const Communicator* group, gpu::NcclGroup* nccl) {
  context_ = group && group->size() > 1
                 ? std::make_unique<ContextParallel>(*group, &backend(), nccl)
                 : nullptr;
  compute_->context_parallel = context_.get();
  arch_->drop_activations();
}

void Model::set_data_parallel(const Communicator* group) { arch_->set_data_parallel(group); }

std::vector<int64_t> Model::expert_loads() const {
  if (!arch_->class_offsets(0)) return {};
  const int64_t E = config_.n_experts;
  std::vector<int64_t> loads(config_.n_layers * E);
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    const int64_t* offs = arch_->class_offsets(l);
    for (int64_t e = 0; e < E; ++e) loads[l * E + e] = offs[e + 1] - offs[e];
  }
  return loads;
}

// ---- forward, backward, decoding ------------------------------------------------------------

ForwardResult Model::forward(const int32_t* inputs, const int32_t* targets, int64_t batch,
                             int64_t seq) {
  const ModelConfig& c = config_;
  if (sharded_ && !experts_->sharding())
    fail(
        "this model's slabs were made without the other ranks' experts: it needs its "
        "expert-parallel group (set_expert_parallel) before a step");
  if (seq > c.max_seq_len)
    fail(fmt::format("sequence length {} exceeds model.max_seq_len = {}", seq, c.max_seq_len));
  for (int64_t i = 0; i < batch * seq; ++i) {
    if (inputs[i] < 0 || inputs[i] >= c.vocab_size)
      fail(fmt::format("input token id {} at position {} is outside the vocabulary [0, {})",
                       inputs[i], i, c.vocab_size),
           "the data and the model config disagree on the vocabulary");
  }
  BatchShape shape{batch, seq};
  if (context_) {
    shape.context = context_->size();
    if (seq % 2 != 0)
      fail(fmt::format("with context parallelism a rank's rows are two chunks of each "
                       "sequence, but it was given {} rows per sequence", seq));
    const int64_t halo = c.context_halo_rows();
    if (shape.chunk() < std::max<int64_t>(halo, 1))
      fail(fmt::format("context-parallel chunks of {} tokens are shorter than the {} rows the "
                       "CCA convolutions read before each chunk",
                       shape.chunk(), halo),
           "use longer sequences or a smaller train.context_parallel");
    if (shape.full_seq() > c.max_seq_len)
      fail(fmt::format("sequence length {} ({} ranks × {} rows) exceeds model.max_seq_len = {}",
                       shape.full_seq(), shape.context, seq, c.max_seq_len));
  }
  return arch_->forward(inputs, targets, shape);
}

void Model::backward(bool accumulate) {
  check_training("backward");
  if (!grads_zeroed_ && !accumulate)
    fail(
        "Model::backward needs zero_grads() since the last backward (it writes the experts' "
        "gradients whole instead of adding to them), or accumulate");
  grads_zeroed_ = false;
  // Reset however backward ends: an error must not leave the next backward adding.
  struct Accumulating {
    Compute& cx;
    ~Accumulating() { cx.accumulate_grads = false; }
  } scope{*compute_};
  compute_->accumulate_grads = accumulate;
  arch_->backward();
}

void Model::set_loss_weight(double weight) {
  FOUNDRY_CHECK(weight > 0 && weight <= 1);
  compute_->loss_weight = weight;
}

const float* Model::logits() const { return arch_->logits(); }

int64_t Model::activation_arena_bytes(const ModelConfig& config, int64_t batch, int64_t seq) {
  const BatchShape s{batch, seq};
  return config.is_zaya() ? zaya1_arena_bytes(config, s, false)
                          : standard_moe_arena_bytes(config, s, false);
}

Model::DecodeState Model::decode_state(int64_t max_len, int64_t batch, bool own_caches) const {
  DecodeState s;
  s.max_len = max_len;
  s.batch = batch;
  s.logits.resize(batch * config_.padded_vocab());
  s.arch = arch_->new_decode(max_len, batch, own_caches);
  if (on_device()) {
    const int64_t bytes = batch * (config_.padded_vocab() + 1) * 4;  // logits, then tokens
    s.device_io = BackendBuffer(backend_, bytes);
  }
  return s;
}

Model::DecodeState Model::new_decode_state(int64_t max_len, int64_t batch) const {
  if (max_len > config_.max_seq_len)
    fail(fmt::format("generation length {} exceeds model.max_seq_len = {}", max_len,
                     config_.max_seq_len),
         "shorten the prompt or the number of new tokens");
  if (max_len < 1 || batch < 1)
    fail(fmt::format("a decode state needs max_len >= 1 and batch >= 1 (got {} and {})",
                     max_len, batch));
  return decode_state(max_len, batch, /*own_caches=*/true);
}

void Model::run_decode(DecodeState& s, const DecodeRows& rows, const int32_t* tokens) {
  const int64_t n = rows.n, Vp = config_.padded_vocab();
  check_tokens(tokens, n);
  const RowInvariantGemms row_invariant;  // a sequence decodes alike alone and beside others
  if (on_device()) {
    float* logits = s.device_io.as<float>();
    auto* device_tokens = reinterpret_cast<int32_t*>(logits + s.batch * Vp);
    backend_.from_host(device_tokens, tokens, n * static_cast<int64_t>(sizeof(int32_t)));
    arch_->decode_rows(*s.arch, rows, device_tokens, logits);
    backend_.to_host(s.logits.data(), logits, n * Vp * static_cast<int64_t>(sizeof(float)));
  } else {
    arch_->decode_rows(*s.arch, rows, tokens, s.logits.data());
  }
  for (int64_t r = 0; r < n; ++r)
    std::fill(s.logits.begin() + r * Vp + config_.vocab_size, s.logits.begin() + (r + 1) * Vp,
              -std::numeric_limits<float>::infinity());
}

const float* Model::decode_step(DecodeState& s, const int32_t* tokens) {
  if (s.pos >= s.max_len) fail("decode state is full", "create a longer decode state");
  run_decode(s, arch_->own_caches(*s.arch).in_step(s.pos), tokens);
  ++s.pos;
  return s.logits.data();
}

void Model::check_tokens(const int32_t* tokens, int64_t n) const {
  for (int64_t b = 0; b < n; ++b)
    if (tokens[b] < 0 || tokens[b] >= config_.vocab_size)
      fail(fmt::format("token id {} is outside the vocabulary [0, {})", tokens[b],
                       config_.vocab_size));
}

int64_t Model::kv_segment_bytes(int64_t capacity) const {
  const ModelConfig& c = config_;
  int64_t floats = 2 * c.n_layers * ops::DecodeKv::floats(1, c.n_kv_heads, c.head_dim, capacity);
  if (c.arch == Arch::zaya1) floats += c.n_layers * ops::decode_state_floats(cca_dims(c));
  return floats * static_cast<int64_t>(sizeof(float));
}

Model::KvSegment Model::new_kv_segment(int64_t start, int64_t capacity,
                                       const KvSegment* after) const {
  const ModelConfig& c = config_;
  FOUNDRY_CHECK(start >= 0 && capacity >= 1 && start + capacity <= c.max_seq_len);
  FOUNDRY_CHECK(!after || after->start + after->len == start);
  KvSegment s;
  s.start = start;
  s.capacity = capacity;
  s.layers = c.n_layers;
  s.span_floats = ops::DecodeKv::floats(1, c.n_kv_heads, c.head_dim, capacity);
  if (c.arch == Arch::zaya1) s.cca_floats = ops::decode_state_floats(cca_dims(c));
  s.storage = BackendBuffer(backend_, kv_segment_bytes(capacity));  // zeroed
  if (after && s.cca_floats > 0)
    backend_.copy(s.cca(0), after->cca(0),
                  c.n_layers * s.cca_floats * static_cast<int64_t>(sizeof(float)));
  return s;
}

Model::DecodeState Model::new_rows_state(int64_t rows) const {
  FOUNDRY_CHECK(rows >= 1);
  return decode_state(config_.max_seq_len, rows, /*own_caches=*/false);
}

namespace {

// The rows as the architectures see them: each row's spans per layer (its chain's segments,
// the last with the new position), its position and where it is stored, and (arch zaya1) its
// last segment's CCA state per layer. Rows that write the same segment take its next positions
// in row order (a run of a prompt's tokens in one step), each continuing the one before; they
// must read the same chain. Checks that each chain covers positions 0, 1, … without a gap and
// that the last segment has room.
DecodeRows rows_view(const ModelConfig& c, const std::vector<Model::DecodeRow>& rows) {
  DecodeRows d;
  d.n = static_cast<int64_t>(rows.size());
  d.spans.resize(c.n_layers);
  d.first.push_back(0);
  if (c.arch == Arch::zaya1) d.cca.resize(c.n_layers);
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<Model::KvSegment*>& chain = rows[r].chain;
    FOUNDRY_CHECK(!chain.empty());
    int64_t ahead = 0;  // earlier rows of this step on the same segment
    for (size_t q = 0; q < r; ++q)
      if (rows[q].chain.back() == chain.back()) {
        FOUNDRY_CHECK(rows[q].chain == chain);  // one segment, one sequence
        ++ahead;
      }
    int64_t at = 0;
    for (Model::KvSegment* seg : chain) {
      FOUNDRY_CHECK(seg->start == at);
      const bool last = seg == chain.back();
      if (last && seg->len + ahead >= seg->capacity)
        fail(fmt::format("a decode segment of {} positions (from {}) is full", seg->capacity,
                         seg->start),
             "give the sequence a segment with room for its new tokens");
      for (int64_t l = 0; l < c.n_layers; ++l)
        d.spans[l].push_back(
            {seg->k(l), seg->v(l), seg->len + (last ? ahead + 1 : 0), seg->capacity});
      at += seg->len;
    }
    d.pos.push_back(at + ahead);
    d.store_at.push_back(chain.back()->len + ahead);
    d.first.push_back(static_cast<int64_t>(d.spans[0].size()));
    for (size_t l = 0; l < d.cca.size(); ++l) d.cca[l].push_back(chain.back()->cca(l));
  }
  d.same_position =
      std::all_of(d.pos.begin(), d.pos.end(), [&](int64_t p) { return p == d.pos[0]; });
  return d;
}

}  // namespace

const float* Model::decode_rows(DecodeState& s, const std::vector<DecodeRow>& rows) {
  const int64_t n = static_cast<int64_t>(rows.size());
  FOUNDRY_CHECK(n >= 1 && n <= s.batch);
  std::vector<int32_t> tokens;
  for (const DecodeRow& row : rows) tokens.push_back(row.token);
  run_decode(s, rows_view(config_, rows), tokens.data());
  for (const DecodeRow& row : rows) ++row.chain.back()->len;
  return s.logits.data();
}

// ---- ZAYA1 router balancing -----------------------------------------------------------------

ops::ZayaBalancerOptions balancer_options(const ModelConfig& config) {
  ops::ZayaBalancerOptions o;
  o.rule = config.balance_rule == "adamw"           ? ops::BalanceRule::adamw
           : config.balance_rule == "sign_adaptive" ? ops::BalanceRule::sign_adaptive
           : config.balance_rule == "newton"        ? ops::BalanceRule::newton
                                                    : ops::BalanceRule::proportional;
  o.lr = config.balance_bias_lr > 0 ? config.balance_bias_lr : default_balance_bias_lr(o.rule);
  o.window = config.balance_bias_on == "probs" ? kNewtonWindowProbs : kNewtonWindowLogits;
  o.skip_bias_init = static_cast<float>(config.skip_bias_init);
  return o;
}

double default_balance_bias_lr(ops::BalanceRule rule) {
  switch (rule) {
    case ops::BalanceRule::proportional: return kProportionalBalanceGain;
    case ops::BalanceRule::newton: return kNewtonBalanceDamping;
    case ops::BalanceRule::adamw:
    case ops::BalanceRule::sign_adaptive: break;
  }
  return 1e-3;
}

json balancers_to_json(const std::vector<ops::ZayaBalancer>& balancers) {
  json layers = json::array();
  for (const auto& b : balancers) {
    json layer = {{"rule", ops::balance_rule_name(b.options.rule)}, {"bias", b.bias}};
    const auto names = b.rule_state_names();
    const auto state = b.rule_state();
    for (size_t i = 0; i < names.size(); ++i) layer[names[i]] = *state[i];
    layer["step"] = b.step;
    layers.push_back(std::move(layer));
  }
  return layers;
}

namespace {

// The rule a saved balancer state was written under: its "rule", or for states written before
// that field, the rule whose vectors it holds.
std::string saved_balance_rule(const json& s) {
  if (s.contains("rule")) return s.at("rule").get<std::string>();
  if (s.contains("exp_avg")) return "adamw";
  if (s.contains("step_size")) return "sign_adaptive";
  return "proportional";
}

}  // namespace

std::string balancers_from_json(std::vector<ops::ZayaBalancer>& balancers, const json& state) {
  if (!state.is_array() || state.size() != balancers.size())
    fail(fmt::format("router balancer state holds {} MoE sublayers, the model has {}",
                     state.is_array() ? state.size() : 0, balancers.size()),
         "load a checkpoint written for this model config");
  std::string note;
  try {
    for (size_t l = 0; l < balancers.size(); ++l) {
      const json& s = state[l];
      ops::ZayaBalancer& b = balancers[l];
      const std::string rule = ops::balance_rule_name(b.options.rule);
      const std::string saved = saved_balance_rule(s);
      std::vector<std::vector<float>> rule_state;
      if (saved == rule) {
        for (const char* name : b.rule_state_names())
          rule_state.push_back(s.at(name).get<std::vector<float>>());
      } else {
        // Written under another rule: its biases route as trained; the rule starts afresh.
        const ops::ZayaBalancer initial(b.classes(), /*skip_class=*/false, b.options);
        for (const std::vector<float>* v : initial.rule_state()) rule_state.push_back(*v);
        note = fmt::format("the router balancers were saved under balance rule \"{}\"; their "
                           "biases are kept and model.balance_rule = \"{}\" continues from its "
                           "initial state",
                           saved, rule);
      }
      b.load_state(s.at("bias").get<std::vector<float>>(), std::move(rule_state),
                   s.at("step").get<int64_t>());
    }
  } catch (const json::exception& e) {
    fail(fmt::format("router balancer state is malformed: {}", e.what()),
         "load a checkpoint written by this version of foundry");
  }
  return note;
}

void Model::reset_balancers() {
  balancers_.clear();
  class_counts_.clear();
  boundary_counts_.clear();
  if (!config_.is_zaya()) return;
  const ops::ZayaBalancerOptions o = balancer_options(config_);
  for (int64_t l = 0; l < config_.n_layers; ++l)
    balancers_.emplace_back(config_.n_experts, config_.router_skip_class, o);
  class_counts_.assign(config_.n_layers * config_.router_classes(), 0);
  if (balancers_.front().needs_boundary_counts()) boundary_counts_ = class_counts_;
}

void Model::update_balancers(const int64_t* counts, int64_t assignments, const int64_t* near) {
  const int64_t S = config_.router_classes();
  for (size_t l = 0; l < balancers_.size(); ++l)
    balancers_[l].update(counts + l * S, assignments, near ? near + l * S : nullptr);
}

json Model::balancer_state() const { return balancers_to_json(balancers_); }

std::string Model::load_balancer_state(const json& state) {
  return balancers_from_json(balancers_, state);
}

}  // namespace foundry
