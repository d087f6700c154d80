// Multi-rank tests of ZeRO-1 (ctest runs them under mpirun at 2, 3 and 4 ranks, one thread
// per rank), and of the point-to-point and v-collective methods of comm/comm.h they use.
//
// Every rank draws every rank's local gradient (deterministic from the seed, the step and
// the rank), so each can compute the single-process reference from the averaged gradient
// itself and compare. Assertions that could differ between ranks never skip a collective:
// a test makes the same communicator calls on every rank whatever it finds, and main()
// combines the ranks' verdicts.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/comm.h"
#include "base/test_expect_error.h"
#include "comm/mpi_test_main.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/muon.h"
#include "optim/test_util.h"
#include "optim/zero1.h"

namespace foundry {
namespace {

Communicator* g_world = nullptr;
Communicator& world() { return *g_world; }

using test::padding_offsets;
using test::random_slab;
using test::adamw_options;
using test::bitwise_equal;
using test::muon_options;

// Tolerances against the single-process reference, on |a - b| / max(|b|, 1) per parameter.
// MPI sums the ranks' gradients in another order than the reference, and the norm's partial
// sums are grouped by shard, so the averaged gradient differs in its last bits (~1e-7
// relative). Typically that stays at that level: the RMS error is ~1e-8 (checked below 1e-7).
// The largest errors come from two amplifiers: AdamW's first steps are sign-like,
// lr·g/(|g| + eps), so an element whose averaged gradient nearly cancels (|g| ~ 1e-6) moves
// by a visible fraction of lr when its last bits change; and Newton–Schulz (slope a = 3.4
// near zero, five times over) amplifies differences in the small singular directions. The
// measured maxima at 2-4 ranks are 1.2e-6 (AdamW) and 5.3e-6 (Muon), against updates of
// lr = 1e-2.
constexpr double kAdamWTolerance = 5e-6;
constexpr double kMuonTolerance = 2e-5;
constexpr double kRmsTolerance = 1e-7;

// "wide": one layer whose attention matrices (32768 elements each) dwarf everything else.
// Over 4 ranks o_proj spans 3 shards and shard 2 lies inside it (no matrix starts there);
// over 3 ranks rank 1 both holds a piece of q_proj and owns the split o_proj.
ModelConfig wide_config() {
  ModelConfig c;
  c.vocab_size = 128;
  c.d_model = 32;
  c.n_layers = 1;
  c.n_heads = 32;
  c.n_kv_heads = 1;
  c.head_dim = 32;
  c.n_experts = 2;
  c.top_k = 1;
  c.ffn_dim = 32;
  return c;
}

// True on every rank iff `ok` on every rank.
bool all_ranks(bool ok, const Communicator& comm) {
  const int64_t mine = ok ? 1 : 0;
  int64_t all = 0;
  comm.allreduce(&mine, &all, 1, ReduceOp::min);
  return all == 1;
}

// Largest |a - b| / max(|b|, 1) over the tensor elements.
double max_error(std::span<const float> a, std::span<const float> b, const ParamTable& table) {
  double worst = 0;
  for (const ParamInfo& p : table.params())
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i)
      worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) /
                                  std::max(1.0, std::abs(static_cast<double>(b[i]))));
  return worst;
}

// Root mean square of a - b over the tensor elements.
double rms_error(std::span<const float> a, std::span<const float> b, const ParamTable& table) {
  double sum = 0;
  int64_t n = 0;
  for (const ParamInfo& p : table.params())
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i, ++n)
      sum += std::pow(static_cast<double>(a[i]) - b[i], 2);
  return n > 0 ? std::sqrt(sum / static_cast<double>(n)) : 0.0;
}

// Rank `rank`'s local gradient at `step`: normal values in every tensor, NaN in the alignment
// padding (which no part of the step may read).
std::vector<float> local_gradient(const ParamTable& table, uint64_t seed, int64_t step,
                                  int rank) {
  return random_slab(table, seed * 1000003 + static_cast<uint64_t>(step) * 7919 + rank, 0.05,
                     std::numeric_limits<float>::quiet_NaN());
}

// The average the optimizer should see: the ranks' gradients summed in rank order, times
// 1/dp (as ZeRO-1 scales the reduced sum).
std::vector<float> averaged_gradient(const ParamTable& table, uint64_t seed, int64_t step,
                                     int dp) {
  std::vector<float> sum = local_gradient(table, seed, step, 0);
  for (int r = 1; r < dp; ++r) {
    const std::vector<float> g = local_gradient(table, seed, step, r);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += g[i];
  }
  if (dp > 1) {
    const float inv_dp = static_cast<float>(1.0 / dp);
    for (float& x : sum) x *= inv_dp;
  }
  return sum;
}

// The single-process optimizers of the trainer: clip, AdamW, Muon.
struct Reference {
  Reference(const ParamTable& table, bool with_muon, std::vector<float> initial)
      : table(table), params(std::move(initial)), adam(table, adamw_options(with_muon)) {
    if (with_muon) muon.emplace(table, MuonOptions{});
  }
  double step(std::vector<float> grads, double lr, int64_t step, double clip) {
    const double norm = clip_grad_norm(grads.data(), table, clip);
    adam.step(params.data(), grads.data(), lr, step);
    if (muon) muon->step(params.data(), grads.data(), lr, step);
    return norm;
  }
  std::span<const float> state(const std::string& name) const {
    return name == "muon_momentum" ? muon->state(name) : adam.state(name);
  }
  const ParamTable& table;
  std::vector<float> params;
  AdamW adam;
  std::optional<Muon> muon;
};

struct RunResult {
  std::vector<float> params;
  std::vector<double> norms;
  std::vector<std::vector<float>> states;  // gathered (full on rank 0, empty elsewhere)
};

// `steps` ZeRO-1 steps over `comm` from `initial`, clipping at `clip` on odd steps and not
// at all on even ones.
RunResult run_zero1(const ParamTable& table, bool with_muon, const std::vector<float>& initial,
                    uint64_t seed, int steps, double clip, const Communicator& comm,
                    const Zero1Options& options = {}) {
  Zero1Optimizer zero(table, adamw_options(with_muon), muon_options(with_muon), comm, options);
  RunResult result;
  result.params = initial;
  for (int64_t step = 1; step <= steps; ++step) {
    const std::vector<float> grads = local_gradient(table, seed, step, comm.rank());
    result.norms.push_back(
        zero.step(result.params.data(), grads.data(), 1e-2, step, step % 2 ? clip : 0.0));
  }
  for (const std::string& name : zero.state_names())
    result.states.push_back(zero.gather_state(name));
  return result;
}

// Every rank's `data` equals rank 0's, bit for bit (checked on every rank).
bool same_on_every_rank(const std::vector<float>& data, const Communicator& comm) {
  std::vector<float> root = data;
  comm.broadcast(root.data(), root.size(), 0);
  return all_ranks(bitwise_equal(root, data), comm);
}

void expect_matches_reference(const ParamTable& table, bool with_muon, int steps, double clip,
                              const Zero1Options& options = {}) {
  const Communicator& comm = world();
  const uint64_t seed = 17 + steps + (with_muon ? 100 : 0);
  const std::vector<float> initial = random_slab(table, seed, 0.5, 7.0f);
  const RunResult run = run_zero1(table, with_muon, initial, seed, steps, clip, comm, options);

  Reference ref(table, with_muon, initial);
  const double tolerance = with_muon ? kMuonTolerance : kAdamWTolerance;
  for (int64_t step = 1; step <= steps; ++step) {
    const double norm = ref.step(averaged_gradient(table, seed, step, comm.size()), 1e-2, step,
                                 step % 2 ? clip : 0.0);
    EXPECT_NEAR(run.norms[step - 1], norm, 1e-6 * norm) << "step " << step;
  }
  const double error = max_error(run.params, ref.params, table);
  const double rms = rms_error(run.params, ref.params, table);
  EXPECT_LE(error, tolerance) << "parameters after " << steps << " steps, dp " << comm.size();
  EXPECT_LE(rms, kRmsTolerance) << "parameters after " << steps << " steps, dp " << comm.size();
  for (int64_t gap : padding_offsets(table)) EXPECT_EQ(run.params[gap], 7.0f) << gap;
  EXPECT_TRUE(same_on_every_rank(run.params, comm)) << "ranks disagree after the all-gather";
  std::vector<std::string> names = AdamW::state_names();
  if (with_muon) names.push_back("muon_momentum");
  ASSERT_EQ(run.states.size(), names.size());
  for (size_t s = 0; s < names.size(); ++s) {
    if (comm.rank() != 0) {
      EXPECT_TRUE(run.states[s].empty()) << names[s];
      continue;
    }
    ASSERT_EQ(run.states[s].size(), static_cast<size_t>(table.total_elements()));
    // Moments scale like the gradient (and exp_avg_sq like its square): relative to the
    // largest value, not to 1.
    const std::span<const float> expected = ref.state(names[s]);
    double scale = 0;
    for (float x : expected) scale = std::max(scale, static_cast<double>(std::abs(x)));
    double worst = 0;
    for (size_t i = 0; i < expected.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(run.states[s][i]) - expected[i]));
    EXPECT_LE(worst, 1e-5 * scale) << names[s];
  }
  if (::testing::Test::HasFailure() || std::getenv("ZERO1_VERBOSE"))
    std::fprintf(stderr, "[rank %d] dp %d, %s, %d steps, slab %ld: error max %.3g rms %.3g\n",
                 comm.rank(), comm.size(), with_muon ? "muon+adamw" : "adamw", steps,
                 static_cast<long>(table.total_elements()), error, rms);
}

// ---- communicator: point to point and the v-collectives -------------------------------

TEST(CommMultiRank, PointToPointRing) {
  const Communicator& c = world();
  const int n = c.size(), r = c.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // Non-blocking: receive posted first, then send.
  std::vector<double> out(5, 0.0), in(5, -1.0);
  for (int i = 0; i < 5; ++i) out[i] = 100.0 * r + i;
  Request receive = c.irecv(in.data(), in.size(), prev, 7);
  Request send = c.isend(out.data(), out.size(), next, 7);
  receive.wait();
  send.wait();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(in[i], 100.0 * prev + i);
  // Blocking, ordered by rank so that no cycle forms: rank 0 sends first, every other rank
  // receives from its predecessor before sending on.
  std::vector<int64_t> token = {r, 2 * r}, got(2, -1);
  const bool send_first = r == 0;
  if (send_first) {
    c.send(token.data(), 2, next, 8);
    c.irecv(got.data(), 2, prev, 8).wait();
  } else {
    c.irecv(got.data(), 2, prev, 8).wait();
    c.send(token.data(), 2, next, 8);
  }
  EXPECT_EQ(got, (std::vector<int64_t>{prev, 2 * prev}));
  // Two messages with one tag arrive in order.
  if (r == 0) {
    const float a = 1, b = 2;
    c.send(&a, 1, n - 1, 9);
    c.send(&b, 1, n - 1, 9);
  }
  if (r == n - 1) {
    float a = 0, b = 0;
    Request ra = c.irecv(&a, 1, 0, 9);
    Request rb = c.irecv(&b, 1, 0, 9);
    ra.wait();
    rb.wait();
    EXPECT_EQ(a, 1.0f);
    EXPECT_EQ(b, 2.0f);
  }
}

TEST(CommMultiRank, WrongMessageLengthIsAnError) {
  const Communicator& c = world();
  const float data[3] = {1, 2, 3};
  if (c.rank() == 1) {
    c.send(data, 3, 0, 11);
    c.send(data, 3, 0, 12);
  }
  if (c.rank() == 0) {
    float four[4] = {}, two[2] = {};
    // Posted before waiting; each message may arrive before or after its receive.
    Request shorter = c.irecv(four, 4, 1, 11);
    Request longer = c.irecv(two, 2, 1, 12);
    try {
      shorter.wait();
      ADD_FAILURE() << "a 3-element message for a 4-element receive was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("received 3 elements from rank 1, expected 4"),
                std::string::npos)
          << e.what();
    }
    try {
      longer.wait();
      ADD_FAILURE() << "a 3-element message for a 2-element receive was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("MPI_Irecv failed on rank 0"), std::string::npos)
          << e.what();
    }
  }
  c.barrier();
}

TEST(CommMultiRank, AllgatherVInPlace) {
  const Communicator& c = world();
  const int n = c.size(), r = c.rank();
  // Uneven counts, one of them zero: rank i has i + 1 elements, except rank 1 has none.
  std::vector<int64_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = i == 1 ? 0 : i + 1;
  int64_t total = 0;
  for (int64_t x : counts) total += x;
  int64_t offset = 0;
  for (int i = 0; i < r; ++i) offset += counts[i];
  std::vector<float> data(total, -1.0f);
  for (int64_t i = 0; i < counts[r]; ++i) data[offset + i] = static_cast<float>(10 * r + i);
  c.allgatherv_in_place(data.data(), counts);
  int64_t at = 0;
  for (int i = 0; i < n; ++i)
    for (int64_t k = 0; k < counts[i]; ++k) EXPECT_EQ(data[at++], static_cast<float>(10 * i + k));
}

// ---- ZeRO-1 ------------------------------------------------------------------------------

TEST(Zero1MultiRank, LayoutsCoverEverySplitCase) {
  const int dp = world().size();
  const Zero1Layout layout(ParamTable(wide_config()), dp, true);
  int64_t split = 0, widest = 0;
  bool rank_without_start = false, rank_with_both_roles = false;
  for (const MuonPlacement& m : layout.muon_matrices()) {
    split += m.split();
    widest = std::max<int64_t>(widest, m.last_rank - m.owner + 1);
  }
  for (int r = 0; r < dp; ++r) {
    rank_without_start |= layout.owned_matrices(r).empty();
    rank_with_both_roles |= layout.owned_split_matrix(r) >= 0 && layout.held_split_matrix(r) >= 0;
  }
  EXPECT_GE(split, 1);
  if (dp >= 3) {
    EXPECT_TRUE(rank_with_both_roles);
  }
  if (dp >= 4) {
    EXPECT_GE(widest, 3) << "a matrix should span 3 shards";
    EXPECT_TRUE(rank_without_start) << "a shard should hold no matrix start";
  }
  const Zero1Layout tiny(ParamTable(test::tiny_moe_config()), dp, true);
  int64_t tiny_split = 0;
  for (const MuonPlacement& m : tiny.muon_matrices()) tiny_split += m.split();
  EXPECT_GE(tiny_split + (dp == 1), 1);
}

TEST(Zero1MultiRank, AdamWMatchesSingleProcess) {
  for (const ModelConfig& config : {test::tiny_moe_config(), wide_config()}) {
    const ParamTable table(config);
    expect_matches_reference(table, false, 1, 1.0);
    expect_matches_reference(table, false, 5, 1.0);
  }
}

TEST(Zero1MultiRank, MuonMatchesSingleProcess) {
  for (const ModelConfig& config : {test::tiny_moe_config(), wide_config()}) {
    const ParamTable table(config);
    expect_matches_reference(table, true, 1, 1.0);
    expect_matches_reference(table, true, 5, 1.0);
  }
}

TEST(Zero1MultiRank, WindowedCollectivesMatchToo) {
  // Windows of 5000 elements: several reduce-scatter / all-gather calls per step, most ranks
  // receiving nothing in most of them, and state messages cut into pieces.
  const ParamTable table(wide_config());
  expect_matches_reference(table, true, 3, 1.0, Zero1Options{.max_message_elements = 5000});
  expect_matches_reference(table, false, 2, 1.0, Zero1Options{.max_message_elements = 5000});
}

TEST(Zero1MultiRank, RepeatedRunIsBitwiseIdentical) {
  const ParamTable table(wide_config());
  const std::vector<float> initial = random_slab(table, 3, 0.5);
  const RunResult a = run_zero1(table, true, initial, 3, 3, 1.0, world());
  const RunResult b = run_zero1(table, true, initial, 3, 3, 1.0, world());
  EXPECT_TRUE(bitwise_equal(a.params, b.params));
  EXPECT_EQ(a.norms, b.norms);
  for (size_t s = 0; s < a.states.size(); ++s) EXPECT_TRUE(bitwise_equal(a.states[s], b.states[s]));
  // Every rank computed the same norms.
  std::vector<double> root = a.norms;
  world().broadcast(root.data(), root.size(), 0);
  EXPECT_EQ(root, a.norms);
}

TEST(Zero1MultiRank, SparseAllGatherWritesOnlyWhatEachRankStores) {
  // Every rank releases every other block of 64 elements outside its kept range (its shard,
  // extended over the split Muon matrix it owns) and poisons them with NaN: they must stay
  // NaN (never written), and the stored elements must match the dense run bit for bit
  // (nothing read from a released element). Then rank 0 gathers its released elements.
  const ParamTable table(wide_config());
  const int rank = world().rank(), size = world().size();
  const Zero1Layout layout(table, size, /*muon_enabled=*/true);
  std::vector<Zero1Optimizer::Ranges> released(size);
  for (int r = 0; r < size; ++r) {
    const auto [kb, ke] = zero1_kept_range(layout, r);
    for (int64_t b = 0; b < table.total_elements(); b += 128) {
      const int64_t e = std::min(b + 64, table.total_elements());
      if (e <= kb || b >= ke) released[r].push_back({b, e});
    }
  }
  const std::vector<float> initial = random_slab(table, 5, 0.5);
  const RunResult dense = run_zero1(table, true, initial, 5, 3, 1.0, world());

  Zero1Optimizer zero(table, adamw_options(true), muon_options(true), world());
  zero.set_released_ranges(released);
  std::vector<float> params = initial;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto& [b, e] : released[rank]) std::fill(params.begin() + b, params.begin() + e, nan);
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<float> grads = local_gradient(table, 5, step, rank);
    zero.step(params.data(), grads.data(), 1e-2, step, step % 2 ? 1.0 : 0.0);
  }
  size_t r = 0;
  int64_t stored_differ = 0, released_written = 0;
  for (int64_t i = 0; i < table.total_elements(); ++i) {
    while (r < released[rank].size() && released[rank][r].end <= i) ++r;
    const bool is_released = r < released[rank].size() && released[rank][r].begin <= i;
    if (is_released)
      released_written += !std::isnan(params[i]);
    else
      stored_differ +=
          std::bit_cast<uint32_t>(params[i]) != std::bit_cast<uint32_t>(dense.params[i]);
  }
  EXPECT_EQ(released_written, 0) << "the all-gather wrote released elements";
  EXPECT_EQ(stored_differ, 0) << "stored elements differ from the dense run";
  zero.gather_released(params.data(), 0);
  if (rank == 0) {
    EXPECT_TRUE(bitwise_equal(params, dense.params)) << "rank 0 after gathering";
  }

  // A rank may not release its own shard.
  std::vector<Zero1Optimizer::Ranges> bad(size);
  const SlabRange mine = layout.shard(rank);
  if (mine.size() > 0) bad[rank].push_back({mine.begin, mine.begin + 1});
  if (mine.size() > 0) expect_error([&] { zero.set_released_ranges(bad); }, "overlaps its shard");
}

TEST(Zero1MultiRank, MemoryFormulaMatchesAllocationOnEveryRank) {
  const ParamTable table(wide_config());
  Zero1Optimizer zero(table, adamw_options(true), MuonOptions{}, world());
  const Zero1RankMemory m = zero.memory();
  EXPECT_EQ(zero.allocated_bytes(), m.total_bytes() - m.newton_schulz_bytes);
  EXPECT_EQ(m.shard_elements, zero.layout().shard(world().rank()).size());
  const Zero1MemoryReport report = zero1_memory(table, world().size(), true);
  EXPECT_LE(m.total_bytes(), report.peak.total_bytes());
  EXPECT_LT(report.peak.total_bytes(), report.gather_peak_bytes);
}

// Local gradients whose average does not depend on the rank count: rank r of dp adds
// (r - (dp-1)/2) times a second random slab to a common one, and those offsets cancel.
std::vector<float> dp_independent_gradient(const ParamTable& table, int64_t step, int rank,
                                           int dp) {
  std::vector<float> g = random_slab(table, 500 + step, 0.05);
  const std::vector<float> h = random_slab(table, 900 + step, 0.05);
  const float c = static_cast<float>(rank - 0.5 * (dp - 1));
  for (size_t i = 0; i < g.size(); ++i) g[i] += c * h[i];
  return g;
}

void continue_steps(const ParamTable& table, Zero1Optimizer& zero, std::vector<float>& params,
                    int64_t first, int64_t last, const Communicator& comm) {
  for (int64_t step = first; step <= last; ++step) {
    const std::vector<float> g = dp_independent_gradient(table, step, comm.rank(), comm.size());
    zero.step(params.data(), g.data(), 1e-2, step, 1.0);
  }
}

// A checkpoint written at dp = 2 (gather_state on rank 0) loads at dp = 1 and at dp = the
// world size, and both continue like the uninterrupted single-process run.
TEST(Zero1MultiRank, CheckpointReshardsBetweenRankCounts) {
  const ParamTable table(wide_config());
  const int world_rank = world().rank();
  constexpr int64_t kSaved = 3, kTotal = 6;
  const std::vector<float> initial = random_slab(table, 77, 0.5);

  Reference ref(table, true, initial);
  std::vector<std::vector<float>> ref_states_at_save;
  const std::vector<std::string> names = {"exp_avg", "exp_avg_sq", "muon_momentum"};
  for (int64_t step = 1; step <= kTotal; ++step) {
    ref.step(random_slab(table, 500 + step, 0.05), 1e-2, step, 1.0);
    if (step == kSaved)
      for (const std::string& name : names) {
        const std::span<const float> s = ref.state(name);
        ref_states_at_save.emplace_back(s.begin(), s.end());
      }
  }

  // Save at dp = 2: world ranks 0 and 1; the others wait.
  std::vector<float> params = initial;
  std::vector<std::vector<float>> saved(names.size());
  {
    Communicator pair = world().split(world_rank < 2 ? 0 : 1, world_rank);
    if (world_rank < 2) {
      Zero1Optimizer zero(table, adamw_options(true), MuonOptions{}, pair);
      continue_steps(table, zero, params, 1, kSaved, pair);
      for (size_t s = 0; s < names.size(); ++s) saved[s] = zero.gather_state(names[s]);
    }
  }
  // "Write the checkpoint": rank 0 has everything; hand it to every rank as a reader would.
  world().broadcast(params.data(), params.size(), 0);
  for (auto& slab : saved) {
    slab.resize(table.total_elements());
    world().broadcast(slab.data(), slab.size(), 0);
  }
  for (size_t s = 0; s < names.size(); ++s) {
    double scale = 0, worst = 0;
    for (size_t i = 0; i < saved[s].size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::abs(ref_states_at_save[s][i])));
      worst = std::max(worst,
                       std::abs(static_cast<double>(saved[s][i]) - ref_states_at_save[s][i]));
    }
    EXPECT_LE(worst, 1e-5 * scale) << "saved " << names[s];
  }

  // Resume at dp = 1 (every rank alone) and at dp = world size.
  std::vector<float> resumed_one = params, resumed_all = params;
  {
    Communicator alone = world().split(world_rank, 0);
    Zero1Optimizer zero(table, adamw_options(true), MuonOptions{}, alone);
    for (size_t s = 0; s < names.size(); ++s) zero.load_state(names[s], saved[s]);
    continue_steps(table, zero, resumed_one, kSaved + 1, kTotal, alone);
  }
  {
    Zero1Optimizer zero(table, adamw_options(true), MuonOptions{}, world());
    for (size_t s = 0; s < names.size(); ++s)
      zero.load_state(names[s], world_rank == 0 ? std::span<const float>(saved[s])
                                                : std::span<const float>());
    continue_steps(table, zero, resumed_all, kSaved + 1, kTotal, world());
  }
  EXPECT_LE(max_error(resumed_one, ref.params, table), kMuonTolerance) << "resumed at dp 1";
  EXPECT_LE(rms_error(resumed_one, ref.params, table), kRmsTolerance) << "resumed at dp 1";
  EXPECT_LE(rms_error(resumed_all, ref.params, table), kRmsTolerance);
  EXPECT_LE(max_error(resumed_all, ref.params, table), kMuonTolerance)
      << "resumed at dp " << world().size();
  EXPECT_LE(max_error(resumed_all, resumed_one, table), kMuonTolerance);
  EXPECT_TRUE(same_on_every_rank(resumed_all, world()));
}

TEST(Zero1MultiRank, MismatchedArgumentsFailOnEveryRank) {
  const ParamTable table(wide_config());
  Zero1Optimizer zero(table, adamw_options(true), MuonOptions{}, world());
  std::vector<float> params = random_slab(table, 1, 0.5);
  const std::vector<float> grads = local_gradient(table, 1, 1, world().rank());
  const double lr = world().rank() == world().size() - 1 ? 2e-2 : 1e-2;
  try {
    zero.step(params.data(), grads.data(), lr, 1, 1.0);
    ADD_FAILURE() << "different learning rates were accepted";
  } catch (const Error& e) {
    const std::string expected = fmt::format("rank {} passed lr 0.02", world().size() - 1);
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
  // The optimizer is still usable, and nothing was updated by the failed call.
  const std::vector<float> before = params;
  EXPECT_TRUE(same_on_every_rank(params, world()));
  zero.step(params.data(), grads.data(), 1e-2, 1, 1.0);
  EXPECT_FALSE(bitwise_equal(params, before));

  // A rank with another model: the constructor fails everywhere, naming it.
  ModelConfig other = wide_config();
  if (world().rank() == 1) other.ffn_dim = 48;
  try {
    Zero1Optimizer bad(ParamTable(other), adamw_options(true), MuonOptions{}, world());
    ADD_FAILURE() << "different parameter tables were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 has a different parameter table"),
              std::string::npos)
        << e.what();
  }
}

TEST(Zero1MultiRank, NonFiniteGradientOnOneRankSkipsTheStepEverywhere) {
  const ParamTable table(wide_config());
  Zero1Optimizer zero(table, adamw_options(true), MuonOptions{}, world());
  std::vector<float> params = random_slab(table, 1, 0.5);
  std::vector<float> grads = local_gradient(table, 2, 1, world().rank());
  if (world().rank() == world().size() - 1)
    grads[table.params()[2].offset + 5] = std::numeric_limits<float>::infinity();
  const std::vector<float> before = params;
  const double norm = zero.step(params.data(), grads.data(), 1e-2, 1, 1.0);
  EXPECT_FALSE(std::isfinite(norm));
  EXPECT_TRUE(bitwise_equal(params, before));
}


}  // namespace
}  // namespace foundry

int main(int argc, char** argv) { return foundry::mpi_test_main(argc, argv, &foundry::g_world); }
