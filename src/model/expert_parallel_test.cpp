// Single-process checks of expert parallelism: the ownership arithmetic, the errors for
// layouts that do not divide, and a group of one rank, where dispatch and combine must be
// the identity and a model with expert parallelism must compute exactly what it computes
// without. Several ranks: model_mpitest.cpp (test_model_mpi under mpirun).
#include "model/expert_parallel.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/test_expect_error.h"
#include "base/error.h"
#include "base/rng.h"
#include "model/model.h"
#include "model/test_support.h"

namespace foundry {
namespace {

// One MPI session for the whole binary (MPI starts once per process). Without mpirun the
// process is a singleton: world size 1.
Communicator& world() {
  static MpiSession session;
  return session.world();
}


TEST(ExpertSharding, OwnersAreConsecutiveBlocks) {
  ExpertSharding s(8, 4);
  EXPECT_EQ(s.experts_per_rank(), 2);
  const int owners[8] = {0, 0, 1, 1, 2, 2, 3, 3};
  for (int e = 0; e < 8; ++e) EXPECT_EQ(s.owner(e), owners[e]) << "expert " << e;
  for (int p = 0; p < 4; ++p) EXPECT_EQ(s.first_expert(p), 2 * p);
  ExpertSharding one(6, 1);
  for (int e = 0; e < 6; ++e) EXPECT_EQ(one.owner(e), 0);
  ExpertSharding each(6, 6);
  for (int e = 0; e < 6; ++e) EXPECT_EQ(each.owner(e), e);
  ExpertSharding dense(1, 1);  // a dense FFN is one expert
  EXPECT_EQ(dense.owner(0), 0);
}

TEST(ExpertSharding, OwnerOfTensors) {
  ModelConfig c;
  c.vocab_size = 50;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.n_experts = 8;
  c.ffn_dim = 8;
  ParamTable table(c);
  ExpertSharding s(8, 4);
  for (const char* w : {"w1", "w3", "w2"})
    EXPECT_EQ(s.owner(table.get(fmt::format("model.layers.1.block_sparse_moe.experts.5.{}.weight",
                                            w))),
              2);
  EXPECT_EQ(s.owner(table.get("model.layers.0.block_sparse_moe.experts.0.w1.weight")), 0);
  EXPECT_EQ(s.owner(table.get("model.layers.0.block_sparse_moe.gate.weight")), -1);
  EXPECT_EQ(s.owner(table.get("model.embed_tokens.weight")), -1);
  EXPECT_EQ(s.owner(table.get("model.layers.0.self_attn.q_proj.weight")), -1);
  int sharded = 0;
  for (const auto& p : table.params()) sharded += s.owner(p) >= 0;
  EXPECT_EQ(sharded, 2 * 8 * 3);  // layers × experts × (w1, w3, w2)

  c.arch = Arch::zaya1;
  c.norm_topk_prob = false;
  c.aux_loss_coef = 0;
  c.router_latent_dim = 8;
  ParamTable zaya(c);
  EXPECT_EQ(s.owner(zaya.get("model.layers.0.mlp.experts.7.down_proj.weight")), 3);
  EXPECT_EQ(s.owner(zaya.get("model.layers.0.mlp.gate.router_mlp.out_proj.weight")), -1);
}

TEST(ExpertSharding, RejectsSizesThatDoNotDivide) {
  expect_error([] { ExpertSharding(4, 3, 1); }, "rank 1 of 3");
  expect_error([] { ExpertSharding(4, 3, 1); }, "4 experts cannot be sharded over 3 ranks");
  expect_error([] { ExpertSharding(8, 0); }, "at least 1");
  expect_error([] { ExpertSharding(1, 2); }, "1 experts cannot be sharded over 2 ranks");
  expect_error([] { split_expert_parallel(world(), 2); },
               "expert-parallel size of 2 does not divide the 1 ranks");
  expect_error([] { split_expert_parallel(world(), 0); }, "does not divide");
}

TEST(ExpertParallelGroups, OneRankIsItsOwnGroup) {
  ASSERT_EQ(world().size(), 1) << "run without mpirun";
  ExpertParallelGroups g = split_expert_parallel(world(), 1);
  EXPECT_EQ(g.expert.size(), 1);
  EXPECT_EQ(g.replicas.size(), 1);
}

// Random expert counts with some zeros; rows numbered so any misplacement shows.
TEST(ExpertExchange, SizeOneGroupIsTheIdentity) {
  ASSERT_EQ(world().size(), 1) << "run without mpirun";
  const int64_t E = 6, W = 5, skip_rows = 3;
  const int64_t counts[E] = {3, 0, 1, 0, 0, 4};
  std::vector<int64_t> offsets(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  const int64_t R = offsets[E];
  std::vector<float> origin((R + skip_rows) * W);
  Rng rng(3);
  for (float& x : origin) x = static_cast<float>(rng.normal());

  ExpertSharding sharding(E, 1, 0);
  ExpertExchange ex;
  EXPECT_FALSE(ex.planned());
  ex.plan(world(), sharding, offsets.data());
  ASSERT_TRUE(ex.planned());
  EXPECT_EQ(ex.origin_rows(), R);
  EXPECT_EQ(ex.local_rows(), R);
  EXPECT_EQ(ex.local_experts(), E);
  EXPECT_EQ(ex.rows_to(0), R);
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(ex.local_offsets()[e], offsets[e]);
    EXPECT_EQ(ex.rows_from(0, e), counts[e]);
  }

  std::vector<float> wire, local(R * W, -1.0f);
  ex.dispatch(origin.data(), local.data(), W, wire);
  EXPECT_EQ(local, std::vector<float>(origin.begin(), origin.begin() + R * W));
  // The combine writes the expert rows and leaves the skip rows after them alone.
  std::vector<float> back(origin.size(), 7.0f);
  for (float& x : local) x *= 2;
  ex.combine(local.data(), back.data(), W, wire);
  for (int64_t i = 0; i < R * W; ++i) ASSERT_EQ(back[i], 2 * origin[i]) << "element " << i;
  for (int64_t i = R * W; i < static_cast<int64_t>(back.size()); ++i) ASSERT_EQ(back[i], 7.0f);

  // Nothing routed at all.
  std::vector<int64_t> none(E + 1, 0);
  ex.plan(world(), sharding, none.data());
  EXPECT_EQ(ex.local_rows(), 0);
  ex.dispatch(origin.data(), local.data(), W, wire);
  ex.combine(local.data(), back.data(), W, wire);
}

TEST(ExpertExchange, RejectsBadPlansAndUse) {
  ExpertExchange ex;
  std::vector<float> wire, rows(4);
  expect_error([&] { ex.dispatch(rows.data(), rows.data(), 1, wire); }, "without a plan");
  ExpertSharding sharding(2, 1, 0);
  const int64_t decreasing[3] = {0, 3, 2};
  expect_error([&] { ex.plan(world(), sharding, decreasing); },
               "offsets decrease at expert 1 (3 → 2)");
  EXPECT_FALSE(ex.planned());
  const int64_t shifted[3] = {1, 2, 3};
  expect_error([&] { ex.plan(world(), sharding, shifted); }, "start at offset 1");
  ExpertSharding two(2, 2);
  const int64_t fine[3] = {0, 1, 2};
  expect_error([&] { ex.plan(world(), two, fine); }, "sharded over 2 ranks, the group has 1");
}

TEST(RouterCounts, SumOverOneRankIsUnchanged) {
  std::vector<int64_t> counts = {5, 0, 3, (int64_t{1} << 40)};
  const std::vector<int64_t> before = counts;
  sum_router_counts(world(), counts);
  EXPECT_EQ(counts, before);
}

ModelConfig small_moe() { return testing::small_moe_config(); }
ModelConfig small_zaya() { return testing::small_zaya_config(small_moe()); }

struct StepResult {
  double loss;
  std::vector<float> grads;
  std::vector<int64_t> loads;
};

StepResult step(Model& model, const testing::Batch& batch, int64_t b, int64_t t) {
  model.zero_grads();
  StepResult r;
  r.loss = model.forward(batch.inputs.data(), batch.targets.data(), b, t).loss;
  r.loads = model.expert_loads();
  model.backward();
  r.grads.assign(model.grads(), model.grads() + model.slab_size());
  return r;
}

// On one rank the owned experts are all experts and the local layout is the origin layout:
// the same GEMMs on the same rows, so the results must be bitwise those without EP.
void expect_size_one_group_changes_nothing(const ModelConfig& c, DType precision) {
  ASSERT_EQ(world().size(), 1) << "run without mpirun";
  Model model(c, precision);
  model.init_weights(5);
  const testing::Batch batch = testing::random_batch(c, 12, 9);
  const StepResult plain = step(model, batch, 2, 6);
  EXPECT_EQ(model.expert_sharding(), nullptr);
  for (const auto& p : model.table().params())
    EXPECT_EQ(model.expert_owner(p), -1) << "without expert parallelism nothing is sharded";
  model.set_expert_parallel(&world());
  ASSERT_NE(model.expert_sharding(), nullptr);
  EXPECT_EQ(model.expert_parallel_group(), &world());
  for (const auto& p : model.table().params())
    EXPECT_EQ(model.expert_owner(p), p.kind == ParamKind::expert ? 0 : -1) << p.name;
  const StepResult ep = step(model, batch, 2, 6);
  EXPECT_EQ(ep.loss, plain.loss);
  EXPECT_EQ(ep.loads, plain.loads);
  EXPECT_TRUE(ep.grads == plain.grads) << "gradients differ with a group of one rank";
  model.set_expert_parallel(nullptr);
  EXPECT_EQ(model.expert_sharding(), nullptr);
  const StepResult again = step(model, batch, 2, 6);
  EXPECT_EQ(again.loss, plain.loss);
  EXPECT_TRUE(again.grads == plain.grads);
}

TEST(ModelExpertParallel, SizeOneGroupChangesNothingMoe) {
  expect_size_one_group_changes_nothing(small_moe(), DType::f32);
  expect_size_one_group_changes_nothing(small_moe(), DType::bf16);
}

TEST(ModelExpertParallel, SizeOneGroupChangesNothingZaya) {
  expect_size_one_group_changes_nothing(small_zaya(), DType::f32);
}

TEST(ModelExpertParallel, ExpertLoadsCountRoutedRows) {
  for (const ModelConfig& c : {small_moe(), small_zaya()}) {
    Model model(c, DType::f32);
    EXPECT_TRUE(model.expert_loads().empty()) << "no forward yet";
    model.init_weights(2);
    const testing::Batch batch = testing::random_batch(c, 12, 4);
    model.forward(batch.inputs.data(), batch.targets.data(), 2, 6);
    const std::vector<int64_t> loads = model.expert_loads();
    const int64_t E = c.n_experts, S = c.router_classes();
    ASSERT_EQ(static_cast<int64_t>(loads.size()), c.n_layers * E);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      int64_t total = 0;
      for (int64_t e = 0; e < E; ++e) {
        total += loads[l * E + e];
        if (c.is_zaya()) {
          EXPECT_EQ(loads[l * E + e], model.router_class_counts()[l * S + e]);
        }
      }
      const int64_t skipped = c.is_zaya() ? model.router_class_counts()[l * S + E] : 0;
      EXPECT_EQ(total + skipped, 12 * c.top_k) << arch_name(c.arch) << " layer " << l;
    }
  }
}

TEST(ModelExpertParallel, SizeOneGroupChangesNothingDense) {
  ModelConfig c = small_moe();
  c.n_experts = 1;  // a dense FFN: one expert, which a group of one rank owns
  c.top_k = 1;
  c.aux_loss_coef = 0;
  expect_size_one_group_changes_nothing(c, DType::f32);
}

}  // namespace
}  // namespace foundry
