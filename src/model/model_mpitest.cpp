// Expert parallelism on several ranks (test_model_mpi; ctest runs it under mpirun at 2, 3
// and 4 ranks). Every rank runs every test in the same order: the tests are collective, so
// they check with EXPECT_* (never return early between collectives) and rank 0 prints the
// usual report while the other ranks print only their failures.
//
//   RoundTrip      dispatch delivers each rank's rows to the owners of their experts in the
//                  documented order, and combine returns them bit-exactly, with random
//                  counts including experts that receive nothing and ranks that send nothing.
//   Equivalence    a standard-MoE and a ZAYA1 model with experts sharded over EP = all ranks
//                  (and EP = 2 in a world of 4) give the loss and gradients of the same model
//                  without expert parallelism, and repeat bitwise.
//   Errors, router statistics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/rng.h"
#include "comm/comm.h"
#include "comm/mpi_test_main.h"
#include "kernels/cpu_backend.h"
#include "model/context_parallel.h"
#include "model/expert_parallel.h"
#include "model/model.h"
#include "model/test_support.h"

namespace foundry {
namespace {

Communicator* g_world = nullptr;
Communicator& world() { return *g_world; }

// The EP sizes this world is tested with: all ranks, and 2 when the world has 4 (two EP
// groups of two, i.e. DP 2 × EP 2).
std::vector<int> ep_sizes() {
  std::vector<int> sizes = {world().size()};
  if (world().size() == 4) sizes.push_back(2);
  return sizes;
}

// ---- round trip -----------------------------------------------------------------------------

// What one EP rank routes in a trial: per-expert row counts and the rows [R + skip, width]
// (the skip rows after the expert rows must come back untouched). A pure function of
// (trial, EP group, rank), so every rank can rebuild what the others of its group sent.
struct Routed {
  std::vector<int64_t> offsets;  // [E + 1]
  std::vector<float> rows;       // [(offsets[E] + kSkipRows) · width]
};
constexpr int64_t kSkipRows = 2;

Routed routed_rows(int trial, int group, int rank, int ep_size, int64_t n_experts,
                   int64_t width) {
  Rng rng((static_cast<uint64_t>(trial) * 1000003u + static_cast<uint64_t>(group)) * 1009u +
          static_cast<uint64_t>(rank));
  Routed r;
  r.offsets.assign(n_experts + 1, 0);
  // Trial 0: nobody sends anything. Otherwise rank (trial % P) sends nothing, expert
  // (trial % E) receives nothing from anyone, and about a third of the other counts are 0.
  const bool silent = trial == 0 || rank == trial % ep_size;
  for (int64_t e = 0; e < n_experts; ++e) {
    int64_t count = static_cast<int64_t>(rng.below(6));
    if (rng.below(3) == 0 || silent || e == trial % n_experts) count = 0;
    r.offsets[e + 1] = r.offsets[e] + count;
  }
  r.rows.resize((r.offsets[n_experts] + kSkipRows) * width);
  for (float& x : r.rows) x = static_cast<float>(rng.normal());
  return r;
}

void round_trip(const Communicator& ep, int trial) {
  const int P = ep.size(), me = ep.rank();
  const int64_t El = 1 + trial % 3, E = P * El, width = 1 + trial % 4;
  SCOPED_TRACE(fmt::format("trial {}: EP rank {} of {}, {} experts, width {}", trial, me, P, E,
                           width));
  std::vector<Routed> all;
  const int group = world().rank() / P;  // EP groups of one layout route different rows
  for (int p = 0; p < P; ++p) all.push_back(routed_rows(trial, group, p, P, E, width));
  const Routed& mine = all[me];
  const int64_t R = mine.offsets[E];

  ExpertSharding sharding(E, P, me);
  ExpertExchange ex;
  ex.plan(ep, sharding, mine.offsets.data());
  const int64_t first = sharding.first_expert(me);
  int64_t expected_local = 0;
  for (int i = 0; i < P; ++i)
    for (int64_t j = 0; j < El; ++j) {
      const int64_t rows = all[i].offsets[first + j + 1] - all[i].offsets[first + j];
      EXPECT_EQ(ex.rows_from(i, j), rows) << "source " << i << " local expert " << j;
      expected_local += rows;
    }
  for (int p = 0; p < P; ++p)
    EXPECT_EQ(ex.rows_to(p), mine.offsets[(p + 1) * El] - mine.offsets[p * El]) << "peer " << p;
  EXPECT_EQ(ex.origin_rows(), R);
  EXPECT_EQ(ex.local_rows(), expected_local);

  // Dispatch: local expert j's rows from rank 0, then rank 1, ..., each in its sender's order.
  std::vector<float> wire, local(ex.local_rows() * width, -99.0f);
  ex.dispatch(mine.rows.data(), local.data(), width, wire);
  std::vector<float> expected;
  for (int64_t j = 0; j < El; ++j) {
    EXPECT_EQ(ex.local_offsets()[j], static_cast<int64_t>(expected.size()) / width);
    for (int i = 0; i < P; ++i) {
      const float* begin = all[i].rows.data() + all[i].offsets[first + j] * width;
      const float* end = all[i].rows.data() + all[i].offsets[first + j + 1] * width;
      expected.insert(expected.end(), begin, end);
    }
  }
  EXPECT_TRUE(local == expected) << "dispatched rows are not in the documented layout";

  // Combine the rows unchanged: every row returns bit-exactly, the skip rows stay as they are.
  std::vector<float> back(mine.rows.size(), 0.0f);
  std::copy(mine.rows.begin() + R * width, mine.rows.end(), back.begin() + R * width);
  ex.combine(local.data(), back.data(), width, wire);
  EXPECT_TRUE(back == mine.rows) << "a row did not come back to where it left from";

  // Combine an expert-dependent function of the rows: each row must have been at its own
  // expert (2x + expert index, the same float operations on both sides).
  for (int64_t j = 0; j < El; ++j)
    for (int64_t i = ex.local_offsets()[j] * width; i < ex.local_offsets()[j + 1] * width; ++i)
      local[i] = 2.0f * local[i] + static_cast<float>(first + j);
  ex.combine(local.data(), back.data(), width, wire);
  bool same = true;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = mine.offsets[e] * width; i < mine.offsets[e + 1] * width; ++i)
      same = same && back[i] == 2.0f * mine.rows[i] + static_cast<float>(e);
  EXPECT_TRUE(same) << "a row came back from an expert other than its own";
}

TEST(ExpertParallelMpi, RoundTripIsExact) {
  for (int ep_size : ep_sizes()) {
    ExpertParallelGroups groups = split_expert_parallel(world(), ep_size);
    for (int trial = 0; trial < 12; ++trial) round_trip(groups.expert, trial);
  }
}

// ---- equivalence with the model without expert parallelism ---------------------------------

// E = 2·W experts: divisible by every EP size tested, and with a few tokens per rank some
// experts get no rows at all.
ModelConfig moe_config() { return testing::small_moe_config(2 * world().size()); }

ModelConfig zaya_config() {
  ModelConfig c = moe_config();
  c.n_layers = 3;  // EDA chains the router state over the MoE sublayers
  return testing::small_zaya_config(c);
}

struct StepResult {
  double loss = 0;
  std::vector<float> grads;
  std::vector<int64_t> loads, class_counts;
};

// ZAYA1's CCA depthwise biases (zero at initialization) set to 0.3·N(0, 1): chunk 0's halo
// must then carry b0, what the grouped convolution reads before a sequence's start.
void perturb_depthwise_biases(Model& model, uint64_t seed) {
  Rng rng(seed);
  for (const auto& p : model.table().params()) {
    if (p.name.find("conv_qk_depthwise.bias") == std::string::npos) continue;
    float* w = model.params() + p.offset;
    for (int64_t i = 0; i < p.numel; ++i) w[i] = static_cast<float>(0.3 * rng.normal());
  }
  model.sync_weights();
}

StepResult train_step(Model& model, const testing::Batch& batch, int64_t b, int64_t t) {
  model.zero_grads();
  StepResult r;
  r.loss = model.forward(batch.inputs.data(), batch.targets.data(), b, t).loss;
  r.loads = model.expert_loads();
  r.class_counts = model.router_class_counts();
  model.backward();
  r.grads.assign(model.grads(), model.grads() + model.slab_size());
  return r;
}

// max |a − b| over the tensor, relative to max |b| (the scale of the tensor's gradient).
double relative_error(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// Tolerances. Expert parallelism changes only the order of floating-point reductions: an
// owner's expert GEMMs run over the rows of all EP ranks at once (other row counts, hence
// other blockings inside oneDNN), and an expert's weight gradient is one sum over all those
// rows instead of a sum of per-rank sums. The expert outputs therefore differ in the last
// bits, and so does everything downstream of them. Measured here over 2–4 ranks: the loss
// within 3e-8 (relative), gradients within 1.1e-6 of each tensor's largest entry for the
// standard MoE and 2.5e-6 for ZAYA1 (its router gradients pass through the gating softmax
// and three router layers, which amplify rounding). The bounds leave room for other CPUs'
// oneDNN blockings; a misplaced row, a wrong expert or a missing rank's contribution changes
// a gradient by the order of the gradient itself (checked below: cross_rank).
constexpr double kLossRelTol = 1e-6;  // of |loss|
constexpr double kGradRelTol = 1e-5;  // of max |reference gradient| of the tensor

void expect_equivalent(const ModelConfig& c, int ep_size) {
  ExpertParallelGroups groups = split_expert_parallel(world(), ep_size);
  const Communicator& ep = groups.expert;
  const int rank = world().rank();
  SCOPED_TRACE(fmt::format("{} model, world rank {}, EP rank {} of {}", arch_name(c.arch), rank,
                           ep.rank(), ep.size()));
  // Each rank its own batch, of its own size: the exchange does not need equal loads.
  const int64_t B = 1 + rank % 2, T = 6;
  const testing::Batch batch = testing::random_batch(c, B * T, 100 + rank);

  Model model(c, DType::f32);
  model.init_weights(11);  // the same weights on every rank
  const StepResult ref = train_step(model, batch, B, T);
  // The reference for an expert tensor: the sum over the EP group of every rank's local
  // gradient (the owner computes all of the group's tokens for its experts).
  std::vector<float> expert_sum = ref.grads;
  ep.allreduce(expert_sum.data(), expert_sum.data(), expert_sum.size());

  model.set_expert_parallel(&ep);
  const StepResult got = train_step(model, batch, B, T);
  const StepResult again = train_step(model, batch, B, T);

  EXPECT_EQ(got.loads, ref.loads) << "the routing itself must not change";
  EXPECT_EQ(got.class_counts, ref.class_counts);
  EXPECT_NEAR(got.loss, ref.loss, kLossRelTol * std::abs(ref.loss));
  int owned = 0, cross_rank = 0;
  for (const auto& p : model.table().params()) {
    const float* g = got.grads.data() + p.offset;
    const int owner = model.expert_owner(p);
    if (owner < 0) {
      // Not sharded (attention, router, norms, embedding, scales): this rank's own tokens.
      EXPECT_LE(relative_error(g, ref.grads.data() + p.offset, p.numel), kGradRelTol) << p.name;
    } else if (owner == ep.rank()) {
      // Owned expert: the contributions of all EP ranks' tokens.
      ++owned;
      EXPECT_LE(relative_error(g, expert_sum.data() + p.offset, p.numel), kGradRelTol) << p.name;
      if (relative_error(expert_sum.data() + p.offset, ref.grads.data() + p.offset, p.numel) >
          1e-3)
        ++cross_rank;
    } else {
      // Another rank's expert: never touched here.
      bool zero = true;
      for (int64_t i = 0; i < p.numel; ++i) zero = zero && g[i] == 0.0f;
      EXPECT_TRUE(zero) << p.name << " is owned by EP rank " << owner << " but got a gradient";
    }
  }
  EXPECT_EQ(owned, c.n_layers * (c.n_experts / ep.size()) * 3);  // gate|up, up, down
  EXPECT_GT(cross_rank, 0) << "no owned expert received another rank's tokens: the test "
                              "would not notice a missing contribution";
  // Bitwise repeatable.
  EXPECT_EQ(again.loss, got.loss);
  EXPECT_TRUE(again.grads == got.grads) << "a second identical step differs";
}

TEST(ExpertParallelMpi, StandardMoeMatchesWithoutExpertParallelism) {
  for (int ep_size : ep_sizes()) expect_equivalent(moe_config(), ep_size);
}

TEST(ExpertParallelMpi, ZayaMatchesWithoutExpertParallelism) {
  for (int ep_size : ep_sizes()) expect_equivalent(zaya_config(), ep_size);
}

// Two training steps of `device` against `host` on the same batch: the same loss, expert loads
// and gradients, bit for bit.
void expect_the_hosts_steps(Model& host, Model& device, const testing::Batch& batch, int64_t b,
                            int64_t t) {
  for (int step = 0; step < 2; ++step) {
    const StepResult want = train_step(host, batch, b, t);
    device.zero_grads();
    const double loss = device.forward(batch.inputs.data(), batch.targets.data(), b, t).loss;
    EXPECT_EQ(device.expert_loads(), want.loads);
    device.backward();
    std::vector<float> grads(device.slab_size());
    device.read_grads(grads.data());
    EXPECT_EQ(loss, want.loss) << "step " << step;
    EXPECT_TRUE(grads == want.grads) << "step " << step;
  }
}

// On a device (a CPU backend posing as one) the exchanged rows go through host memory: the
// same loss, loads and gradients as the host model's, bit for bit, in fp32 and bf16.
void expect_device_matches_host(const ModelConfig& c, int ep_size, DType precision) {
  ExpertParallelGroups groups = split_expert_parallel(world(), ep_size);
  const int rank = world().rank();
  SCOPED_TRACE(fmt::format("{} model, {}, world rank {}, EP size {}", arch_name(c.arch),
                           dtype_name(precision), rank, ep_size));
  const int64_t B = 1 + rank % 2, T = 6;
  const testing::Batch batch = testing::random_batch(c, B * T, 200 + rank);
  const std::unique_ptr<Backend> backend = make_cpu_backend_posing_as_device();
  Model host(c, precision), device(c, precision, *backend);
  host.set_expert_parallel(&groups.expert);
  device.set_expert_parallel(&groups.expert);
  host.init_weights(12);
  device.init_weights(12);
  expect_the_hosts_steps(host, device, batch, B, T);
}

TEST(ExpertParallelMpi, OnADeviceTheRowsGoThroughHostMemoryToTheHostModelsBits) {
  for (DType precision : {DType::f32, DType::bf16})
    for (int ep_size : ep_sizes()) {
      expect_device_matches_host(moe_config(), ep_size, precision);
      expect_device_matches_host(zaya_config(), ep_size, precision);
    }
}

// The expert storage sharded on a device as on the host: the device's slabs are made without
// the other ranks' experts (`made_so`) or hand back their chunks there later (the CPU posing as
// a device maps those chunks as a GPU does, one shared chunk each kind, its gradient holes
// read-only: a write there is a crash here, where a GPU would spoil the zeros every hole
// reads; a read that relies on a parameter there finds another place's), and the loss and
// gradients stay the sharded host model's bits.
void expect_sharded_device_matches_host(ModelConfig c, int ep_size, DType precision, bool made_so) {
  c.ffn_dim = 512;  // experts of whole pages
  ExpertParallelGroups groups = split_expert_parallel(world(), ep_size);
  const int rank = world().rank();
  SCOPED_TRACE(fmt::format("{} model, {}, world rank {}, EP size {}, sharded storage {}",
                           arch_name(c.arch), dtype_name(precision), rank, ep_size,
                           made_so ? "from the start" : "later"));
  const int64_t B = 1 + rank % 2, T = 6;
  const testing::Batch batch = testing::random_batch(c, B * T, 300 + rank);
  const std::unique_ptr<Backend> backend = make_cpu_backend_posing_as_device();
  Model host(c, precision);
  host.set_expert_parallel(&groups.expert);
  const SlabRanges unowned =
      unowned_expert_ranges(host.table(), *host.expert_sharding(), groups.expert.rank());
  const int64_t whole = Model(c, precision, *backend).resident_slab_bytes();
  const SlabHoles holes{unowned, unowned, precision == DType::bf16 ? unowned : SlabRanges{}};
  Model device(c, precision, *backend, ModelUse::training, made_so ? holes : SlabHoles{});
  device.set_expert_parallel(&groups.expert);
  if (made_so) {  // slabs made without another EP rank's holes refuse this rank's group
    const SlabRanges theirs = unowned_expert_ranges(host.table(), *host.expert_sharding(),
                                                    (groups.expert.rank() + 1) % ep_size);
    Model wrong(c, precision, *backend, ModelUse::training, SlabHoles{theirs, theirs, {}});
    EXPECT_THROW(wrong.set_expert_parallel(&groups.expert), Error);
  }
  host.shard_expert_storage(unowned);
  device.shard_expert_storage(unowned, unowned);  // made so: the same holes, nothing to do
  EXPECT_THROW(device.shard_expert_storage({}, SlabRanges{}), Error);  // other holes
  EXPECT_TRUE(device.storage_sharded());
  EXPECT_EQ(device.released_param_ranges(), unowned);
  int64_t unowned_elements = 0;
  for (const SlabRange& r : unowned) unowned_elements += r.size();
  const int64_t element_bytes = 8 + (precision == DType::bf16 ? 2 : 0);  // fp32 w, g; bf16
  EXPECT_LT(device.resident_slab_bytes(), whole);
  EXPECT_GE(device.resident_slab_bytes(), whole - unowned_elements * element_bytes);
  host.init_weights(12);
  device.init_weights(12);
  expect_the_hosts_steps(host, device, batch, B, T);
}

TEST(ExpertParallelMpi, OnADeviceTheShardedStorageGivesTheHostModelsBits) {
  for (DType precision : {DType::f32, DType::bf16})
    for (int ep_size : ep_sizes())
      for (bool made_so : {true, false}) {
        expect_sharded_device_matches_host(moe_config(), ep_size, precision, made_so);
        expect_sharded_device_matches_host(zaya_config(), ep_size, precision, made_so);
      }
}

// ---- data parallel: the aux loss of the global batch
// ---------------------------------------------

TEST(DataParallelMpi, AuxLossAndGradientsAreTheGlobalBatchs) {
  const ModelConfig c = moe_config();  // aux_loss_coef 0.1
  const int p = world().size(), rank = world().rank();
  const int64_t B = 2, T = 6;
  // Every rank's batch, and the global batch they make (rank order), on every rank.
  std::vector<testing::Batch> batches;
  testing::Batch global;
  for (int r = 0; r < p; ++r) {
    batches.push_back(testing::random_batch(c, B * T, 300 + r));
    for (auto [from, to] : {std::pair{&batches.back().inputs, &global.inputs},
                            std::pair{&batches.back().targets, &global.targets}})
      to->insert(to->end(), from->begin(), from->end());
  }
  Model model(c, DType::f32);
  model.init_weights(5);
  model.zero_grads();
  const ForwardResult ref = model.forward(global.inputs.data(), global.targets.data(), p * B, T);
  model.backward();
  const std::vector<float> ref_grads(model.grads(), model.grads() + model.slab_size());

  auto mean = [&](double x) {
    world().allreduce(&x, &x, 1);
    return x / p;
  };
  // Without the group: each rank's shares are its own batch's, and the mean aux loss is not
  // the global one (the test would not notice a missing all-reduce otherwise).
  model.zero_grads();
  const double local_aux =
      mean(model.forward(batches[rank].inputs.data(), batches[rank].targets.data(), B, T).aux_loss);
  EXPECT_GT(std::abs(local_aux - ref.aux_loss), 1e-4 * ref.aux_loss);

  model.set_data_parallel(&world());
  model.zero_grads();
  const ForwardResult got =
      model.forward(batches[rank].inputs.data(), batches[rank].targets.data(), B, T);
  model.backward();
  std::vector<float> grads(model.grads(), model.grads() + model.slab_size());
  world().allreduce(grads.data(), grads.data(), grads.size());
  for (float& g : grads) g /= static_cast<float>(p);
  EXPECT_NEAR(mean(got.aux_loss), ref.aux_loss, 1e-6 * ref.aux_loss);  // float loss
  EXPECT_NEAR(mean(got.loss), ref.loss, 1e-6 * ref.loss);
  for (const auto& prm : model.table().params())
    EXPECT_LE(relative_error(grads.data() + prm.offset, ref_grads.data() + prm.offset, prm.numel),
              kGradRelTol)
        << prm.name;
  model.set_data_parallel(nullptr);
}

// ---- router statistics -------------------------------------------------------------------------

TEST(ExpertParallelMpi, RouterCountsSumOverAllRanks) {
  const ModelConfig c = zaya_config();
  const int W = world().size(), rank = world().rank();
  ExpertParallelGroups groups = split_expert_parallel(world(), W);
  Model model(c, DType::f32);
  model.init_weights(3);
  model.set_expert_parallel(&groups.expert);
  const int64_t N = 6 * (1 + rank);
  const testing::Batch batch = testing::random_batch(c, N, 7 + rank);
  model.forward(batch.inputs.data(), batch.targets.data(), 1 + rank, 6);
  std::vector<int64_t> counts = model.router_class_counts();
  std::vector<int64_t> loads = model.expert_loads();
  // The expected sums, in rank order from every rank's own counts.
  std::vector<int64_t> all(counts.size() * W), all_loads(loads.size() * W);
  world().allgather(counts.data(), all.data(), counts.size());
  world().allgather(loads.data(), all_loads.data(), loads.size());
  sum_router_counts(world(), counts);
  sum_router_counts(world(), loads);
  for (size_t i = 0; i < counts.size(); ++i) {
    int64_t sum = 0;
    for (int r = 0; r < W; ++r) sum += all[r * counts.size() + i];
    EXPECT_EQ(counts[i], sum) << "class count " << i;
  }
  const int64_t S = c.router_classes(), E = c.n_experts;
  const int64_t global_assignments = 6 * W * (W + 1) / 2 * c.top_k;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    int64_t total = 0, routed = 0;
    for (int64_t s = 0; s < S; ++s) total += counts[l * S + s];
    for (int64_t e = 0; e < E; ++e) routed += loads[l * E + e];
    EXPECT_EQ(total, global_assignments) << "layer " << l;
    EXPECT_EQ(routed + counts[l * S + E], global_assignments) << "layer " << l;
  }
  // Summed counts keep the balancers identical on every rank (they decide the routing), with
  // the boundary counts summed likewise when the rule uses them.
  std::vector<int64_t> near = model.router_boundary_counts();
  if (!near.empty()) sum_router_counts(world(), near);
  model.update_balancers(counts.data(), global_assignments, near.empty() ? nullptr : near.data());
  std::vector<double> bias(model.balancers()[0].bias.begin(), model.balancers()[0].bias.end());
  std::vector<double> hi = bias, lo = bias;
  world().allreduce(hi.data(), hi.data(), hi.size(), ReduceOp::max);
  world().allreduce(lo.data(), lo.data(), lo.size(), ReduceOp::min);
  EXPECT_EQ(hi, lo);

  // Ranks that disagree on the number of counts all fail, and none is left waiting.
  std::vector<int64_t> uneven(rank == 0 ? 3 : 4, 1);
  try {
    sum_router_counts(world(), uneven);
    ADD_FAILURE() << "uneven counts were summed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("rank {} of {}", rank, W)),
              std::string::npos)
        << e.what();
  }
}

// ---- errors ------------------------------------------------------------------------------------

TEST(ExpertParallelMpi, LayoutsThatDoNotDivideAreRejectedOnEveryRank) {
  const int W = world().size(), rank = world().rank();
  ModelConfig c = moe_config();
  c.n_experts = 2 * W - 1;  // odd: no EP size > 1 of this world divides it
  Model model(c, DType::f32);
  try {
    model.set_expert_parallel(&world());
    ADD_FAILURE() << c.n_experts << " experts were sharded over " << W << " ranks";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fmt::format("rank {} of {}", rank, W)), std::string::npos) << what;
    EXPECT_NE(what.find(fmt::format("{} experts cannot be sharded over {} ranks", c.n_experts, W)),
              std::string::npos)
        << what;
  }
  EXPECT_EQ(model.expert_sharding(), nullptr) << "a rejected group must leave the model as it was";
  try {
    split_expert_parallel(world(), W + 1);
    ADD_FAILURE() << "EP size " << W + 1 << " accepted in a world of " << W;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide"), std::string::npos) << e.what();
  }
  // The world is still usable: every rank got here.
  world().barrier();
}

// ---- DP × EP groups --------------------------------------------------------------------------

TEST(ExpertParallelMpi, GroupsOfADataByExpertLayout) {
  const int W = world().size(), rank = world().rank();
  for (int P = 1; P <= W; ++P) {
    if (W % P != 0) continue;
    ExpertParallelGroups g = split_expert_parallel(world(), P);
    EXPECT_EQ(g.expert.size(), P);
    EXPECT_EQ(g.expert.rank(), rank % P);
    EXPECT_EQ(g.replicas.size(), W / P);
    EXPECT_EQ(g.replicas.rank(), rank / P);
    // Members of my EP group: world ranks (rank / P)·P + i, in EP-rank order.
    std::vector<int64_t> me = {rank}, members(P);
    g.expert.allgather(me.data(), members.data(), 1);
    for (int i = 0; i < P; ++i) EXPECT_EQ(members[i], rank / P * P + i);
  }
}


// ---- context parallelism ---------------------------------------------------------------------

// The CP sizes this world is tested with: all ranks, and 2 when the world has 4 (DP 2 × CP 2).
std::vector<int> cp_sizes() {
  std::vector<int> sizes = {world().size()};
  if (world().size() == 4) sizes.push_back(2);
  return sizes;
}

// A CP group of `cp` consecutive world ranks.
Communicator split_context_parallel(int cp) {
  return world().split(world().rank() / cp, world().rank());
}

// Row values that name their place: sequence b, position t, column j.
float position_code(int64_t b, int64_t t, int64_t j) {
  return static_cast<float>(b * 10000 + t * 10 + j);
}

// On the host, and with the tensors on a device (a CPU backend posing as one), where every
// exchange goes through host staging.
TEST(ContextParallelMpi, ExchangesMoveTheRightRows) {
  const std::unique_ptr<Backend> posing = make_cpu_backend_posing_as_device();
  for (bool device : {false, true})
    for (int cp_size : cp_sizes()) {
      const Communicator group = split_context_parallel(cp_size);
      ContextParallel cp(group, device ? posing.get() : nullptr);
      Backend& ops = device ? *posing : cpu_backend();
      const int64_t B = 2, tc = 3, T = 2 * cp_size * tc, W = 2;
      SCOPED_TRACE(
          fmt::format("CP rank {} of {}{}", cp.rank(), cp.size(), device ? ", on a device" : ""));
      std::vector<float> full(B * T * W);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t j = 0; j < W; ++j) full[(b * T + t) * W + j] = position_code(b, t, j);
      std::vector<float> local(B * 2 * tc * W);
      cp.take_local(full.data(), local.data(), B, T, W);
      for (int64_t b = 0; b < B; ++b)
        for (int slot = 0; slot < 2; ++slot)
          EXPECT_EQ(local[((2 * b + slot) * tc) * W], position_code(b, cp.chunk(slot) * tc, 0));

      // gather: the whole sequences in position order.
      std::vector<float> gathered(full.size());
      cp.gather(local.data(), gathered.data(), B, tc, W);
      EXPECT_EQ(gathered, full);
      // reduce_scatter: the sum over the group of (rank + 1)·full, this rank's rows.
      std::vector<float> scaled(full), summed(local.size());
      for (float& x : scaled) x *= static_cast<float>(cp.rank() + 1);
      cp.reduce_scatter(scaled.data(), summed.data(), B, tc, W);
      const float ranks_sum = static_cast<float>(cp_size * (cp_size + 1) / 2);
      for (size_t i = 0; i < local.size(); ++i) EXPECT_EQ(summed[i], ranks_sum * local[i]);

      // exchange_halo: each slot's halo is the last 2 rows before its chunk (zero before 0).
      const int64_t rows = 2;
      std::vector<float> tails(B * 2 * rows * W), halos(tails.size(), -1.0f);
      take_chunk_rows(ops, local.data(), tails.data(), B, tc, W, tc - rows, rows);
      cp.exchange_halo(tails.data(), halos.data(), B, rows, W);
      for (int64_t b = 0; b < B; ++b)
        for (int slot = 0; slot < 2; ++slot)
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t t = cp.chunk(slot) * tc - rows + r;  // the position of halo row r
            EXPECT_EQ(halos[((2 * b + slot) * rows + r) * W + 1],
                      t < 0 ? 0.0f : position_code(b, t, 1))
                << "b " << b << " slot " << slot << " row " << r;
          }
      // return_halo_gradient: every halo's gradient arrives at the tail it came from, once.
      std::vector<float> dtails(tails.size(), 0.0f);
      cp.return_halo_gradient(halos.data(), dtails.data(), B, rows, W);
      for (int64_t b = 0; b < B; ++b)
        for (int slot = 0; slot < 2; ++slot) {
          // The last chunk (2C − 1) has no successor: nobody's halo came from it.
          const bool has_successor = cp.chunk(slot) < 2 * cp_size - 1;
          for (int64_t i = 0; i < rows * W; ++i) {
            const int64_t at = (2 * b + slot) * rows * W + i;
            EXPECT_EQ(dtails[at], has_successor ? tails[at] : 0.0f)
                << "b " << b << " slot " << slot;
          }
        }
    }
}

// Loss and gradients of a step over the global batch, one process, against the same batch
// split over DP × CP (× EP) ranks: each rank's rows are its chunks of its DP slice of the
// batch. The mean over ranks of the losses and of the gradients must be the reference's
// (every rank has the same number of tokens). Chunks of 3 tokens: every chunk's first
// positions read the previous chunk through the CCA convolutions and the value shift, and
// every query reads earlier chunks' keys, so a dropped exchange changes the result (checked:
// the same rows without context parallelism give another loss).
void expect_context_parallel_equivalent(ModelConfig c, int cp_size, int ep_size) {
  const int W = world().size(), rank = world().rank(), dp = W / cp_size;
  const int64_t B = 1 + (c.arch == Arch::zaya1), tc = 3, T = 2 * cp_size * tc;
  c.max_seq_len = T;
  SCOPED_TRACE(fmt::format("{} model, CP {} × DP {}, EP {}, world rank {}", arch_name(c.arch),
                           cp_size, dp, ep_size, rank));
  const testing::Batch global = testing::random_batch(c, dp * B * T, 700);

  Model model(c, DType::f32);
  model.init_weights(17);
  perturb_depthwise_biases(model, 18);
  model.set_data_parallel(&world());  // the aux loss's expert shares: the global batch's
  const StepResult ref = train_step(model, global, dp * B, T);

  const Communicator group = split_context_parallel(cp_size);
  std::optional<ExpertParallelGroups> ep;
  if (ep_size > 1) {
    ep.emplace(split_expert_parallel(world(), ep_size));
    model.set_expert_parallel(&ep->expert);
  }
  model.set_context_parallel(&group);
  const ContextParallel& cp = *model.context_parallel();
  testing::Batch mine;
  mine.inputs.resize(B * 2 * tc);
  mine.targets.resize(B * 2 * tc);
  const int64_t slice = (rank / cp_size) * B * T;
  cp.take_local(global.inputs.data() + slice, mine.inputs.data(), B, T, 1);
  cp.take_local(global.targets.data() + slice, mine.targets.data(), B, T, 1);
  const StepResult got = train_step(model, mine, B, 2 * tc);
  const StepResult again = train_step(model, mine, B, 2 * tc);

  double loss = got.loss;
  world().allreduce(&loss, &loss, 1);
  EXPECT_NEAR(loss / W, ref.loss, kLossRelTol * std::abs(ref.loss));
  std::vector<float> grads = got.grads;
  world().allreduce(grads.data(), grads.data(), grads.size());
  for (float& g : grads) g /= static_cast<float>(W);
  for (const auto& p : model.table().params())
    EXPECT_LE(relative_error(grads.data() + p.offset, ref.grads.data() + p.offset, p.numel),
              kGradRelTol)
        << p.name;
  EXPECT_EQ(again.loss, got.loss);
  EXPECT_TRUE(again.grads == got.grads) << "a second identical step differs";

  // The same rows as independent sequences: the exchanges carry something.
  model.set_context_parallel(nullptr);
  const StepResult alone = train_step(model, mine, 2 * B, tc);
  EXPECT_GT(std::abs(alone.loss - got.loss), 1e-4 * std::abs(got.loss));
  model.set_expert_parallel(nullptr);
  model.set_data_parallel(nullptr);
}

// On a device (a CPU backend posing as one) the chunks' rows go through host memory: the same
// losses and gradients as the host model's, bit for bit, in fp32 and bf16, with and without
// expert parallelism beside.
void expect_context_parallel_device_matches_host(const ModelConfig& base, int cp_size, int ep_size,
                                                 DType precision) {
  const int64_t B = 2, tc = 3;
  ModelConfig c = base;
  c.max_seq_len = 2 * cp_size * tc;
  SCOPED_TRACE(fmt::format("{} model, {}, CP {}, EP {}, world rank {}", arch_name(c.arch),
                           dtype_name(precision), cp_size, ep_size, world().rank()));
  const testing::Batch batch = testing::random_batch(c, B * 2 * tc, 300 + world().rank());
  const Communicator group = split_context_parallel(cp_size);
  std::optional<ExpertParallelGroups> ep;
  if (ep_size > 1) ep.emplace(split_expert_parallel(world(), ep_size));
  const std::unique_ptr<Backend> backend = make_cpu_backend_posing_as_device();
  Model host(c, precision), device(c, precision, *backend);
  for (Model* m : {&host, &device}) {
    if (ep) m->set_expert_parallel(&ep->expert);
    m->set_context_parallel(&group);
    m->init_weights(21);
    perturb_depthwise_biases(*m, 22);
  }
  for (int step = 0; step < 2; ++step) {
    const StepResult want = train_step(host, batch, B, 2 * tc);
    device.zero_grads();
    const double loss = device.forward(batch.inputs.data(), batch.targets.data(), B, 2 * tc).loss;
    device.backward();
    std::vector<float> grads(device.slab_size());
    device.read_grads(grads.data());
    EXPECT_EQ(loss, want.loss) << "step " << step;
    EXPECT_TRUE(grads == want.grads) << "step " << step;
  }
}

TEST(ContextParallelMpi, OnADeviceTheChunksGoThroughHostMemoryToTheHostModelsBits) {
  const int everyone = world().size();
  for (DType precision : {DType::f32, DType::bf16}) {
    for (int cp_size : cp_sizes()) {
      expect_context_parallel_device_matches_host(moe_config(), cp_size, 1, precision);
      expect_context_parallel_device_matches_host(zaya_config(), cp_size, 1, precision);
    }
    expect_context_parallel_device_matches_host(zaya_config(), everyone == 4 ? 2 : everyone,
                                                everyone, precision);
  }
}

TEST(ContextParallelMpi, StandardMoeMatchesOneProcess) {
  for (int cp_size : cp_sizes()) expect_context_parallel_equivalent(moe_config(), cp_size, 1);
  // With expert parallelism over the whole world (CP groups and EP groups cross).
  expect_context_parallel_equivalent(moe_config(), world().size() == 4 ? 2 : world().size(),
                                     world().size());
}

// model.qk_norm normalizes each rank's own rows before the keys travel.
TEST(ContextParallelMpi, QkNormMatchesOneProcess) {
  for (QkNorm qk : {QkNorm::head, QkNorm::full}) {
    ModelConfig c = moe_config();
    c.qk_norm = qk;
    expect_context_parallel_equivalent(c, world().size(), 1);
  }
}

TEST(ContextParallelMpi, ZayaMatchesOneProcess) {
  for (int cp_size : cp_sizes()) expect_context_parallel_equivalent(zaya_config(), cp_size, 1);
  expect_context_parallel_equivalent(zaya_config(), world().size() == 4 ? 2 : world().size(),
                                     world().size());
}

}  // namespace
}  // namespace foundry

int main(int argc, char** argv) { return foundry::mpi_test_main(argc, argv, &foundry::g_world); }
