// Single-process tests of ZeRO-1: the shard layout arithmetic, where Muon matrices are split
// and who owns them, the memory formulas, and the optimizer on a communicator of one rank,
// which must reproduce the single-process step (clip, AdamW, Muon) bit for bit.
// Multi-rank behaviour is in zero1_mpitest.cpp.
#include "optim/zero1.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "base/test_expect_error.h"
#include "base/error.h"
#include "optim/clip.h"
#include "optim/test_util.h"

namespace foundry {
namespace {

using test::padding_offsets;
using test::random_slab;
using test::adamw_options;
using test::bitwise_equal;
using test::muon_options;
using test::tiny_moe_config;


SlabTensor adamw_tensor(int64_t offset, int64_t numel) {
  SlabTensor t;
  t.offset = offset;
  t.numel = numel;
  t.adamw = true;
  return t;
}

SlabTensor muon_tensor(int64_t offset, int64_t rows, int64_t cols) {
  SlabTensor t;
  t.offset = offset;
  t.numel = rows * cols;
  t.rows = rows;
  t.cols = cols;
  t.muon = true;
  return t;
}

// E = 100 over 4 ranks (B = 25):
//   [0,10) AdamW | [10,20) Muon 2×5 | [20,80) Muon 6×10 | [80,90) AdamW | [90,100) Muon 2×5
// The 6×10 matrix starts in shard 0 and ends in shard 3: shards 1 and 2 lie inside it and
// hold no matrix start.
Zero1Layout spanning_layout() {
  return Zero1Layout({adamw_tensor(0, 10), muon_tensor(10, 2, 5), muon_tensor(20, 6, 10),
                      adamw_tensor(80, 10), muon_tensor(90, 2, 5)},
                     100, 4);
}

TEST(Zero1Layout, ShardsAreCeilSizedAndContiguous) {
  struct Case {
    int64_t elements;
    int dp;
    std::vector<SlabRange> shards;
  };
  const std::vector<Case> cases = {
      {100, 1, {{0, 100}}},
      {100, 3, {{0, 34}, {34, 68}, {68, 100}}},
      {10, 4, {{0, 3}, {3, 6}, {6, 9}, {9, 10}}},
      {9, 4, {{0, 3}, {3, 6}, {6, 9}, {9, 9}}},    // the last shard is empty
      {5, 4, {{0, 2}, {2, 4}, {4, 5}, {5, 5}}},    // a short one, then an empty one
      {2, 4, {{0, 1}, {1, 2}, {2, 2}, {2, 2}}},    // more ranks than needed
  };
  for (const Case& c : cases) {
    Zero1Layout layout({}, c.elements, c.dp);
    EXPECT_EQ(layout.shard_elements(), (c.elements + c.dp - 1) / c.dp);
    std::vector<int64_t> counts;
    for (int r = 0; r < c.dp; ++r) {
      EXPECT_EQ(layout.shard(r), c.shards[r]) << c.elements << " over " << c.dp << ", rank " << r;
      counts.push_back(c.shards[r].size());
    }
    EXPECT_EQ(layout.shard_counts(), counts);
    for (int64_t e = 0; e < c.elements; ++e) {
      const SlabRange s = layout.shard(layout.rank_of(e));
      EXPECT_TRUE(e >= s.begin && e < s.end) << e;
    }
  }
}

TEST(Zero1Layout, MatrixSpanningFourShards) {
  const Zero1Layout layout = spanning_layout();
  const auto& m = layout.muon_matrices();
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].owner, 0);
  EXPECT_FALSE(m[0].split());
  EXPECT_EQ(m[1].owner, 0);  // the rank holding its first element
  EXPECT_EQ(m[1].last_rank, 3);
  EXPECT_TRUE(m[1].split());
  EXPECT_EQ(m[2].owner, 3);
  EXPECT_FALSE(m[2].split());

  EXPECT_EQ(layout.owned_matrices(0), (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(layout.owned_matrices(1).empty());
  EXPECT_TRUE(layout.owned_matrices(2).empty());
  EXPECT_EQ(layout.owned_matrices(3), (std::vector<size_t>{2}));
  EXPECT_EQ(layout.owned_split_matrix(0), 1);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(layout.owned_split_matrix(r), -1) << r;
  EXPECT_EQ(layout.held_split_matrix(0), -1);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(layout.held_split_matrix(r), 1) << r;

  EXPECT_EQ(layout.piece(1, 0), (SlabRange{20, 25}));
  EXPECT_EQ(layout.piece(1, 1), (SlabRange{25, 50}));
  EXPECT_EQ(layout.piece(1, 2), (SlabRange{50, 75}));
  EXPECT_EQ(layout.piece(1, 3), (SlabRange{75, 80}));
  EXPECT_EQ(layout.piece(0, 1).size(), 0);

  // State ranges: rank 0 keeps the whole split matrix, ranks 1 and 2 nothing.
  EXPECT_EQ(layout.state_range(0), (SlabRange{0, 80}));
  EXPECT_EQ(layout.state_range(1), (SlabRange{80, 80}));
  EXPECT_EQ(layout.state_range(2), (SlabRange{80, 80}));
  EXPECT_EQ(layout.state_range(3), (SlabRange{80, 100}));

  EXPECT_EQ(layout.adamw_elements(0), 10);
  EXPECT_EQ(layout.adamw_elements(1), 0);
  EXPECT_EQ(layout.adamw_elements(3), 10);
  EXPECT_EQ(layout.muon_elements(0), 70);
  EXPECT_EQ(layout.muon_elements(1), 0);
  EXPECT_EQ(layout.muon_elements(3), 10);
}

TEST(Zero1Layout, SplitAtBothEndsOfAShard) {
  // B = 25: a matrix crosses into shard 1 and another leaves it.
  //   [0,20) AdamW | [20,40) Muon 4×5 (ranks 0-1) | [40,45) AdamW | [45,60) Muon 3×5
  //   (ranks 1-2) | [60,75) AdamW
  const Zero1Layout layout({adamw_tensor(0, 20), muon_tensor(20, 4, 5), adamw_tensor(40, 5),
                            muon_tensor(45, 3, 5), adamw_tensor(60, 15)},
                           75, 3);
  EXPECT_EQ(layout.owned_split_matrix(0), 0);
  EXPECT_EQ(layout.held_split_matrix(1), 0);
  EXPECT_EQ(layout.owned_split_matrix(1), 1);
  EXPECT_EQ(layout.held_split_matrix(2), 1);
  EXPECT_EQ(layout.state_range(0), (SlabRange{0, 40}));
  EXPECT_EQ(layout.state_range(1), (SlabRange{40, 60}));
  EXPECT_EQ(layout.state_range(2), (SlabRange{60, 75}));
  EXPECT_EQ(layout.adamw_elements(1), 5);
  // A matrix that ends exactly on a boundary is not split.
  const Zero1Layout exact({muon_tensor(0, 5, 5), muon_tensor(25, 5, 5)}, 50, 2);
  EXPECT_FALSE(exact.muon_matrices()[0].split());
  EXPECT_EQ(exact.muon_matrices()[1].owner, 1);
  EXPECT_EQ(exact.state_range(1), (SlabRange{25, 50}));
}

// Properties of the layout of a real table over many rank counts.
void check_layout_properties(const ParamTable& table, int dp) {
  const Zero1Layout layout(table, dp, /*muon_enabled=*/true);
  const auto& matrices = layout.muon_matrices();
  int64_t next = 0, adamw = 0, muon = 0;
  for (int r = 0; r < dp; ++r) {
    const SlabRange range = layout.state_range(r);
    EXPECT_EQ(range.begin, next) << "state ranges must partition the slab, dp " << dp;
    EXPECT_LE(range.begin, range.end);
    next = range.end;
    adamw += layout.adamw_elements(r);
    muon += layout.muon_elements(r);
    int owned_split = 0, held_split = 0;
    for (const MuonPlacement& m : matrices) {
      owned_split += m.owner == r && m.split();
      held_split += m.owner < r && r <= m.last_rank;
    }
    EXPECT_LE(owned_split, 1) << "rank " << r << " of " << dp;
    EXPECT_LE(held_split, 1) << "rank " << r << " of " << dp;
  }
  EXPECT_EQ(next, table.total_elements());
  int64_t table_adamw = 0, table_muon = 0;
  for (const ParamInfo& p : table.params()) (muon_applies(p) ? table_muon : table_adamw) += p.numel;
  EXPECT_EQ(adamw, table_adamw);
  EXPECT_EQ(muon, table_muon);
  for (size_t i = 0; i < matrices.size(); ++i) {
    const MuonPlacement& m = matrices[i];
    EXPECT_EQ(m.owner, layout.rank_of(m.offset));
    int64_t covered = 0;
    for (int r = 0; r < dp; ++r) {
      const SlabRange p = layout.piece(i, r);
      if (r < m.owner || r > m.last_rank) EXPECT_EQ(p.size(), 0);
      else EXPECT_GT(p.size(), 0);
      covered += p.size();
    }
    EXPECT_EQ(covered, m.numel);
    const SlabRange owner_range = layout.state_range(m.owner);
    EXPECT_TRUE(m.offset >= owner_range.begin && m.offset + m.numel <= owner_range.end);
  }
}

TEST(Zero1Layout, PropertiesOnRealTables) {
  const ParamTable tiny(tiny_moe_config());
  for (int dp : {1, 2, 3, 4, 5, 7, 8, 16, 33, 64, 1000}) check_layout_properties(tiny, dp);
  ModelConfig zaya = tiny_moe_config();
  zaya.arch = Arch::zaya1;
  zaya.norm_topk_prob = false;
  zaya.aux_loss_coef = 0;
  zaya.router_latent_dim = 16;
  const ParamTable zaya_table(zaya);
  for (int dp : {1, 2, 3, 8, 100}) check_layout_properties(zaya_table, dp);
}

TEST(Zero1Layout, RejectsBadLayouts) {
  expect_error([] { Zero1Layout({}, 10, 0); }, "at least 1");
  expect_error([] { Zero1Layout({adamw_tensor(0, 10), adamw_tensor(5, 10)}, 20, 2); },
               "overlaps");
  expect_error([] { Zero1Layout({adamw_tensor(0, 30)}, 20, 2); }, "outside");
  SlabTensor both = muon_tensor(0, 2, 5);
  both.adamw = true;
  expect_error([&] { Zero1Layout({both}, 10, 2); }, "both AdamW and Muon");
  SlabTensor bad_shape = muon_tensor(0, 2, 5);
  bad_shape.numel = 9;
  expect_error([&] { Zero1Layout({bad_shape}, 10, 2); }, "2×5");
}

TEST(Zero1Memory, FormulaOnAKnownLayout) {
  const Zero1Layout layout = spanning_layout();
  const Zero1RankMemory r0 = zero1_rank_memory(layout, 0);
  EXPECT_EQ(r0.shard_elements, 25);
  EXPECT_EQ(r0.grad_shard_bytes, 4 * 25);
  EXPECT_EQ(r0.adamw_state_bytes, 8 * 10);
  EXPECT_EQ(r0.muon_momentum_bytes, 4 * 70);
  EXPECT_EQ(r0.exchange_bytes, 4 * 60);
  // Largest owned matrix 6×10: 60 floats of iterate, two 6×6 Gram matrices.
  EXPECT_EQ(r0.newton_schulz_bytes, 4 * (60 + 2 * 36));
  const Zero1RankMemory r1 = zero1_rank_memory(layout, 1);
  EXPECT_EQ(r1.total_bytes(), 4 * 25);  // only its gradient shard
  const Zero1RankMemory r3 = zero1_rank_memory(layout, 3);
  EXPECT_EQ(r3.total_bytes(), 4 * 25 + 8 * 10 + 4 * 10 + 4 * (10 + 2 * 4));

  const Zero1MemoryReport report = zero1_memory(layout);
  EXPECT_EQ(report.peak.rank, 0);
  EXPECT_EQ(report.peak.total_bytes(), r0.total_bytes());
  EXPECT_EQ(report.split_matrices, 1);
  EXPECT_EQ(report.gather_buffer_bytes, 400);
  EXPECT_EQ(report.replicated_bytes, 800);
  // Gathering replaces rank 0's 240-byte exchange buffer with the 400-byte slab.
  EXPECT_EQ(report.gather_peak_bytes, r0.total_bytes() - 240 + 400);
  EXPECT_NEAR(report.gather_buffer_share(), 400.0 / report.gather_peak_bytes, 1e-12);
}

TEST(Zero1Memory, FromTheTableShrinksWithRanksAndBeatsGathering) {
  const ParamTable table(tiny_moe_config());
  const int64_t E = table.total_elements();
  int64_t previous = std::numeric_limits<int64_t>::max();
  for (int dp : {1, 2, 4, 8, 64}) {
    const Zero1MemoryReport r = zero1_memory(table, dp, /*muon_enabled=*/true);
    EXPECT_EQ(r.dp, dp);
    EXPECT_EQ(r.slab_elements, E);
    EXPECT_EQ(r.gather_buffer_bytes, 4 * E);
    EXPECT_LT(r.peak.total_bytes(), r.gather_peak_bytes) << dp;
    EXPECT_LE(r.peak.total_bytes(), previous) << dp;
    previous = r.peak.total_bytes();
    if (dp == 1) {
      EXPECT_EQ(r.split_matrices, 0);
      EXPECT_EQ(r.peak.grad_shard_bytes, 4 * E);
    }
    const std::string text = format_zero1_memory(r);
    EXPECT_NE(text.find(fmt::format("ZeRO-1 over {} ranks", dp)), std::string::npos) << text;
    EXPECT_NE(text.find("gathering the whole slab"), std::string::npos) << text;
  }
  // Without Muon there is nothing to exchange: AdamW moments cover every tensor element.
  const Zero1MemoryReport adamw = zero1_memory(table, 2, /*muon_enabled=*/false);
  EXPECT_EQ(adamw.muon_matrices, 0);
  EXPECT_EQ(adamw.peak.exchange_bytes + adamw.peak.muon_momentum_bytes, 0);
  EXPECT_EQ(zero1_memory(table, 1, false).peak.adamw_state_bytes, 8 * table.parameter_count());
}

// ---- the optimizer on one rank: exactly the single-process step -------------------------

Communicator& world() { return test::mpi_world(); }

class Zero1OneRank : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (world().size() != 1) GTEST_SKIP() << "expects a singleton (no mpirun)";
  }
};

// Several steps, clipping on some and off on others, with a small message limit on one run
// (the windowed collectives): parameters, norms and every state slab equal the single-process
// optimizers' bit for bit.
TEST_P(Zero1OneRank, MatchesSingleProcessBitwise) {
  const bool with_muon = GetParam();
  const ParamTable table(tiny_moe_config());
  for (int64_t message_limit : {int64_t{1} << 30, int64_t{1000}}) {
    std::vector<float> reference = random_slab(table, 11, 0.5, 7.0f);
    std::vector<float> params = reference;
    AdamW adam(table, adamw_options(with_muon));
    std::optional<Muon> muon;
    if (with_muon) muon.emplace(table, MuonOptions{});
    Zero1Optimizer zero(table, adamw_options(with_muon), muon_options(with_muon), world(),
                        Zero1Options{.max_message_elements = message_limit});
    for (int64_t step = 1; step <= 4; ++step) {
      const double clip = step % 2 ? 1.0 : 0.0;
      std::vector<float> grads = random_slab(table, 100 + step, 0.05, 0.0f);
      const std::vector<float> grads_before = grads;
      const double norm = zero.step(params.data(), grads.data(), 1e-2, step, clip);
      EXPECT_TRUE(bitwise_equal(grads, grads_before)) << "step must not write the gradients";
      const double expected_norm = clip_grad_norm(grads.data(), table, clip);
      adam.step(reference.data(), grads.data(), 1e-2, step);
      if (muon) muon->step(reference.data(), grads.data(), 1e-2, step);
      EXPECT_EQ(norm, expected_norm) << "step " << step;
      EXPECT_TRUE(bitwise_equal(params, reference)) << "step " << step;
    }
    for (const std::string& name : zero.state_names()) {
      const std::vector<float> full = zero.gather_state(name);
      const std::span<const float> expected =
          name == "muon_momentum" ? muon->state(name) : adam.state(name);
      EXPECT_TRUE(bitwise_equal(full, expected)) << name;
    }
    for (int64_t gap : padding_offsets(table)) ASSERT_EQ(params[gap], 7.0f) << gap;
  }
}

INSTANTIATE_TEST_SUITE_P(AdamWAndMuon, Zero1OneRank, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Muon" : "AdamWOnly"; });

TEST(Zero1Optimizer, StateNamesAndLoadRoundTrip) {
  if (world().size() != 1) GTEST_SKIP();
  const ParamTable table(tiny_moe_config());
  Zero1Optimizer zero(table, adamw_options(true), MuonOptions{}, world());
  EXPECT_EQ(zero.state_names(),
            (std::vector<std::string>{"exp_avg", "exp_avg_sq", "muon_momentum"}));
  Zero1Optimizer plain(table, adamw_options(false), std::nullopt, world());
  EXPECT_EQ(plain.state_names(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  expect_error([&] { plain.gather_state("muon_momentum"); }, "no optimizer state named");

  // A loaded slab comes back where the optimizer keeps state, zero elsewhere.
  const std::vector<float> slab = random_slab(table, 5, 1.0, 3.0f);
  for (const std::string& name : zero.state_names()) {
    zero.load_state(name, slab);
    const std::vector<float> back = zero.gather_state(name);
    ASSERT_EQ(back.size(), slab.size());
    for (const ParamInfo& p : table.params()) {
      const bool kept = (name == "muon_momentum") == muon_applies(p);
      for (int64_t i = 0; i < p.numel; ++i)
        ASSERT_EQ(back[p.offset + i], kept ? slab[p.offset + i] : 0.0f) << name << " " << p.name;
    }
    for (int64_t gap : padding_offsets(table)) ASSERT_EQ(back[gap], 0.0f);
  }
  zero.reset();
  for (const std::string& name : zero.state_names())
    for (float x : zero.gather_state(name)) ASSERT_EQ(x, 0.0f);
  expect_error([&] { zero.load_state("exp_avg", std::vector<float>(10)); },
               "rank 0 passed 10 elements");
}

TEST(Zero1Optimizer, MemoryMatchesWhatItAllocates) {
  if (world().size() != 1) GTEST_SKIP();
  const ParamTable table(tiny_moe_config());
  for (bool with_muon : {false, true}) {
    Zero1Optimizer zero(table, adamw_options(with_muon), muon_options(with_muon), world());
    const Zero1RankMemory m = zero.memory();
    EXPECT_EQ(zero.allocated_bytes(), m.total_bytes() - m.newton_schulz_bytes);
    EXPECT_EQ(m.shard_elements, table.total_elements());
  }
}

TEST(Zero1Optimizer, NonFiniteGradientUpdatesNothing) {
  if (world().size() != 1) GTEST_SKIP();
  const ParamTable table(tiny_moe_config());
  Zero1Optimizer zero(table, adamw_options(true), MuonOptions{}, world());
  std::vector<float> params = random_slab(table, 1, 0.5);
  std::vector<float> grads = random_slab(table, 2, 0.05);
  zero.step(params.data(), grads.data(), 1e-2, 1, 1.0);
  const std::vector<float> before = params;
  const std::vector<float> momentum = zero.gather_state("muon_momentum");
  grads[table.params()[3].offset] = std::numeric_limits<float>::infinity();
  const double norm = zero.step(params.data(), grads.data(), 1e-2, 2, 1.0);
  EXPECT_FALSE(std::isfinite(norm));
  EXPECT_TRUE(bitwise_equal(params, before));
  EXPECT_TRUE(bitwise_equal(zero.gather_state("muon_momentum"), momentum));
}

TEST(Zero1Optimizer, RejectsBadInput) {
  if (world().size() != 1) GTEST_SKIP();
  const ParamTable table(tiny_moe_config());
  // Muon on, but AdamW told to update every tensor: the Muon matrices would get both.
  expect_error([&] { Zero1Optimizer z(table, AdamWOptions{}, MuonOptions{}, world()); },
               "both AdamW and Muon");
  AdamWOptions bad_beta = adamw_options(false);
  bad_beta.beta1 = 1.0;
  expect_error([&] { Zero1Optimizer z(table, bad_beta, std::nullopt, world()); }, "betas");
  MuonOptions bad_muon;
  bad_muon.ns_steps = 0;
  expect_error([&] { Zero1Optimizer z(table, adamw_options(true), bad_muon, world()); },
               "ns_steps");
  Zero1Optimizer zero(table, adamw_options(false), std::nullopt, world());
  std::vector<float> params = random_slab(table, 1, 0.5), grads = random_slab(table, 2, 0.05);
  expect_error([&] { zero.step(params.data(), grads.data(), 1e-2, 0, 1.0); }, ">= 1");
  expect_error([&] { zero.step(params.data(), grads.data(), 1e-2, 1, -1.0); }, "clip norm");
  expect_error([&] { zero.step(nullptr, grads.data(), 1e-2, 1, 1.0); }, "rank 0 of 1");
}

}  // namespace
}  // namespace foundry
