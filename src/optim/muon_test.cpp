#include "optim/muon.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "base/rng.h"
#include "optim/adamw.h"
#include "optim/test_util.h"

namespace foundry {
namespace {

using test::padding_offsets;
using test::random_slab;

// Every shape Muon meets: square (q, o), wide (k, v: 8 × 16; w2: 16 × 24), tall (w1, w3:
// 24 × 16), plus a router, norms and an embedding that it must leave alone.
ModelConfig tiny_config(int64_t n_experts = 2) {
  ModelConfig c;
  c.vocab_size = 100;
  c.d_model = 16;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 8;
  c.n_experts = n_experts;
  c.top_k = 1;
  c.ffn_dim = 24;
  return c;
}

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> m(rows * cols);
  for (float& x : m) x = static_cast<float>(rng.normal());
  return m;
}

// ---- double-precision references ------------------------------------------------------

using Matrix = std::vector<double>;  // row-major

Matrix multiply(const Matrix& a, const Matrix& b, int64_t m, int64_t k, int64_t n) {
  Matrix c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += a[i * k + p] * b[p * n + j];
  return c;
}

Matrix transpose(const Matrix& a, int64_t rows, int64_t cols) {
  Matrix t(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

// Quintic Newton–Schulz as written in the literature: transpose a tall input, iterate on
// the wide one, transpose back.
Matrix reference_newton_schulz(const Matrix& g, int64_t rows, int64_t cols, int steps) {
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  const bool tall = rows > cols;
  Matrix x = tall ? transpose(g, rows, cols) : g;
  const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
  double norm = 0;
  for (double v : x) norm += v * v;
  norm = std::sqrt(norm);
  for (double& v : x) v /= norm + 1e-7;
  for (int s = 0; s < steps; ++s) {
    const Matrix gram = multiply(x, transpose(x, m, n), m, n, m);
    const Matrix gram2 = multiply(gram, gram, m, m, m);
    Matrix poly(m * m);
    for (int64_t i = 0; i < m * m; ++i) poly[i] = b * gram[i] + c * gram2[i];
    const Matrix px = multiply(poly, x, m, m, n);
    for (int64_t i = 0; i < m * n; ++i) x[i] = a * x[i] + px[i];
  }
  return tall ? transpose(x, m, n) : x;
}

// Muon written out element by element in double over the tensors it owns.
struct ReferenceMuon {
  MuonOptions o;
  std::vector<double> momentum;

  void step(std::vector<double>& p, const std::vector<float>& g, const ParamTable& table,
            double lr) {
    for (const ParamInfo& info : table.params()) {
      if (!muon_applies(info)) continue;
      const int64_t rows = info.shape[0], cols = info.shape[1];
      Matrix u(info.numel);
      for (int64_t i = 0; i < info.numel; ++i) {
        double& buf = momentum[info.offset + i];
        buf = o.momentum * buf + g[info.offset + i];
        u[i] = o.nesterov ? g[info.offset + i] + o.momentum * buf : buf;
      }
      const Matrix orth = reference_newton_schulz(u, rows, cols, o.ns_steps);
      const double scale = o.rms_scale * std::sqrt(static_cast<double>(std::max(rows, cols)));
      for (int64_t i = 0; i < info.numel; ++i) {
        double& w = p[info.offset + i];
        w = w * (1 - lr * o.weight_decay) - lr * scale * orth[i];
      }
    }
  }
};

// Eigenvalues of a symmetric n × n matrix by cyclic Jacobi rotations.
std::vector<double> symmetric_eigenvalues(Matrix a, int64_t n) {
  double total = 0;
  for (double v : a) total += v * v;
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j) off += a[i * n + j] * a[i * n + j];
    if (off <= 1e-30 * total) break;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) {
        const double apq = a[p * n + q];
        if (apq == 0) continue;
        // The rotation that zeroes a[p][q]: A ← Jᵀ A J.
        const double theta = (a[q * n + q] - a[p * n + p]) / (2 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::hypot(theta, 1.0));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int64_t k = 0; k < n; ++k) {
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
        }
        for (int64_t k = 0; k < n; ++k) {
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
      }
  }
  std::vector<double> eig(n);
  for (int64_t i = 0; i < n; ++i) eig[i] = a[i * n + i];
  std::sort(eig.begin(), eig.end());
  return eig;
}

// Singular values (ascending) of a rows × cols matrix, from the Gram matrix of its short side.
std::vector<double> singular_values(const std::vector<float>& x, int64_t rows, int64_t cols) {
  Matrix m(x.begin(), x.end());
  if (rows > cols) {
    m = transpose(m, rows, cols);
    std::swap(rows, cols);
  }
  std::vector<double> eig = symmetric_eigenvalues(multiply(m, transpose(m, rows, cols), rows,
                                                           cols, rows),
                                                  rows);
  for (double& e : eig) e = std::sqrt(std::max(e, 0.0));
  return eig;
}

// Largest error relative to max(|expected|, RMS of the expected tensor), over `tensors`.
double worst_relative_error(const std::vector<float>& actual, const std::vector<double>& expected,
                            const std::vector<ParamInfo>& tensors) {
  double worst = 0;
  for (const ParamInfo& info : tensors) {
    double sum_sq = 0;
    for (int64_t i = info.offset; i < info.offset + info.numel; ++i)
      sum_sq += expected[i] * expected[i];
    const double rms = std::sqrt(sum_sq / static_cast<double>(info.numel));
    for (int64_t i = info.offset; i < info.offset + info.numel; ++i)
      worst = std::max(worst, std::abs(actual[i] - expected[i]) /
                                  std::max(std::abs(expected[i]), rms));
  }
  return worst;
}

// ---- Newton–Schulz ---------------------------------------------------------------------

TEST(MuonTest, JacobiEigenSolverIsRight) {
  // [[2,1,0],[1,2,1],[0,1,2]] has eigenvalues 2 - √2, 2, 2 + √2.
  const std::vector<double> eig = symmetric_eigenvalues({2, 1, 0, 1, 2, 1, 0, 1, 2}, 3);
  EXPECT_NEAR(eig[0], 2 - std::sqrt(2.0), 1e-12);
  EXPECT_NEAR(eig[1], 2, 1e-12);
  EXPECT_NEAR(eig[2], 2 + std::sqrt(2.0), 1e-12);
}

// Five quintic steps take a Gaussian matrix's singular values (spread over a factor of 3
// to 6) into the band the iteration oscillates in, about [0.68, 1.20]; the iteration does
// not converge to exactly 1. Asserted band: [0.65, 1.22].
TEST(MuonTest, NewtonSchulzSingularValuesInBand) {
  struct Shape { int64_t rows, cols; };
  for (const Shape shape : {Shape{64, 128}, Shape{96, 48}}) {
    const std::vector<float> g = random_matrix(shape.rows, shape.cols, 17 + shape.rows);
    const std::vector<double> before = singular_values(g, shape.rows, shape.cols);
    ASSERT_GT(before.back() / before.front(), 2.5) << "input should be far from orthogonal";
    std::vector<float> out(g.size());
    newton_schulz(g.data(), out.data(), shape.rows, shape.cols, 5, /*use_bf16=*/false);
    const std::vector<double> sv = singular_values(out, shape.rows, shape.cols);
    EXPECT_EQ(sv.size(), static_cast<size_t>(std::min(shape.rows, shape.cols)));
    EXPECT_GE(sv.front(), 0.65) << shape.rows << "x" << shape.cols;
    EXPECT_LE(sv.back(), 1.22) << shape.rows << "x" << shape.cols;

    // And it is the same iteration as the double reference (fp32 rounding only).
    const Matrix ref = reference_newton_schulz(Matrix(g.begin(), g.end()), shape.rows,
                                               shape.cols, 5);
    double err = 0, norm = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      err += (out[i] - ref[i]) * (out[i] - ref[i]);
      norm += ref[i] * ref[i];
    }
    EXPECT_LT(std::sqrt(err / norm), 1e-5) << shape.rows << "x" << shape.cols;
  }
}

TEST(MuonTest, NewtonSchulzBf16StaysCloseToFp32) {
  const int64_t rows = 64, cols = 128;
  const std::vector<float> g = random_matrix(rows, cols, 5);
  std::vector<float> fp32(g.size()), bf16(g.size());
  newton_schulz(g.data(), fp32.data(), rows, cols, 5, false);
  newton_schulz(g.data(), bf16.data(), rows, cols, 5, true);
  double err = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    err += (bf16[i] - fp32[i]) * double(bf16[i] - fp32[i]);
    norm += double(fp32[i]) * fp32[i];
  }
  EXPECT_LT(std::sqrt(err / norm), 0.05);
  EXPECT_GT(std::sqrt(err / norm), 0.0) << "the bf16 path should actually round";
  const std::vector<double> sv = singular_values(bf16, rows, cols);
  EXPECT_GE(sv.front(), 0.6);
  EXPECT_LE(sv.back(), 1.25);
}

TEST(MuonTest, NewtonSchulzInPlaceAndZeroInput) {
  const int64_t rows = 24, cols = 16;
  std::vector<float> g = random_matrix(rows, cols, 9);
  std::vector<float> out(g.size());
  newton_schulz(g.data(), out.data(), rows, cols, 5, false);
  newton_schulz(g.data(), g.data(), rows, cols, 5, false);
  EXPECT_EQ(g, out);
  std::vector<float> zero(g.size(), 0.0f);
  newton_schulz(zero.data(), zero.data(), rows, cols, 5, false);
  for (float v : zero) ASSERT_EQ(v, 0.0f);
}

// ---- Muon steps against the reference ----------------------------------------------

std::vector<ParamInfo> muon_tensors(const ParamTable& table) {
  std::vector<ParamInfo> out;
  for (const ParamInfo& info : table.params())
    if (muon_applies(info)) out.push_back(info);
  return out;
}

// One step from a random (non-zero) momentum, so that Nesterov and the momentum term both
// show: from zero momentum the first step's direction is g either way.
void check_one_step(const MuonOptions& options) {
  const ParamTable table(tiny_config());
  Muon muon(table, options);
  ReferenceMuon ref{options, {}};
  const std::vector<float> momentum = random_slab(table, 31, 0.5);
  std::copy(momentum.begin(), momentum.end(), muon.state("muon_momentum").begin());
  ref.momentum.assign(momentum.begin(), momentum.end());

  const std::vector<float> before = random_slab(table, 32, 1.0, /*padding_value=*/55.0f);
  const std::vector<float> grads = random_slab(table, 33, 1.0, /*padding_value=*/-3.0f);
  std::vector<float> params = before;
  std::vector<double> ref_params(before.begin(), before.end());
  const double lr = 0.05;
  muon.step(params.data(), grads.data(), lr, 1);
  ref.step(ref_params, grads, table, lr);

  const std::vector<ParamInfo> owned = muon_tensors(table);
  EXPECT_LE(worst_relative_error(params, ref_params, owned), 1e-4) << "weights";
  // The weights move by a few percent; judge the update itself too.
  std::vector<float> delta(params.size());
  std::vector<double> ref_delta(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    delta[i] = params[i] - before[i];
    ref_delta[i] = ref_params[i] - before[i];
  }
  EXPECT_LE(worst_relative_error(delta, ref_delta, owned), 1e-4) << "update";
  const auto buf = muon.state("muon_momentum");
  EXPECT_LE(worst_relative_error(std::vector<float>(buf.begin(), buf.end()), ref.momentum,
                                 owned),
            1e-6)
      << "momentum";

  // Everything Muon does not own, padding included, is untouched.
  for (const ParamInfo& info : table.params()) {
    if (muon_applies(info)) continue;
    for (int64_t i = info.offset; i < info.offset + info.numel; ++i) {
      ASSERT_EQ(params[i], before[i]) << info.name;
      ASSERT_EQ(buf[i], momentum[i]) << info.name;
    }
  }
  for (int64_t i : padding_offsets(table)) ASSERT_EQ(params[i], 55.0f) << "padding " << i;
}

TEST(MuonTest, OneStepMatchesScalarReferenceNesterov) { check_one_step(MuonOptions{}); }

TEST(MuonTest, OneStepMatchesScalarReferencePlainMomentum) {
  MuonOptions options;
  options.nesterov = false;
  options.momentum = 0.9;
  options.weight_decay = 0.3;
  options.rms_scale = 0.3;
  options.ns_steps = 3;
  check_one_step(options);
}

TEST(MuonTest, SeveralStepsMatchScalarReference) {
  const ParamTable table(tiny_config());
  const MuonOptions options;
  Muon muon(table, options);
  ReferenceMuon ref{options, std::vector<double>(table.total_elements(), 0.0)};
  std::vector<float> params = random_slab(table, 41, 1.0);
  std::vector<double> ref_params(params.begin(), params.end());
  const double lrs[] = {0.02, 0.05, 0.01, 0.03};
  for (int64_t t = 1; t <= 4; ++t) {
    const std::vector<float> grads = random_slab(table, 50 + t, t % 2 ? 1.0 : 1e-3);
    muon.step(params.data(), grads.data(), lrs[t - 1], t);
    ref.step(ref_params, grads, table, lrs[t - 1]);
  }
  EXPECT_LE(worst_relative_error(params, ref_params, muon_tensors(table)), 1e-4);
}

// RMS matching: with zero momentum and no decay the update's RMS is about rms_scale * lr,
// whatever the tensor's shape (the band allows for the non-unit singular values).
TEST(MuonTest, UpdateRmsMatchesScaleForEveryShape) {
  const ParamTable table(tiny_config());
  MuonOptions options;
  options.weight_decay = 0;
  Muon muon(table, options);
  const std::vector<float> before = random_slab(table, 61, 1.0);
  std::vector<float> params = before;
  const std::vector<float> grads = random_slab(table, 62, 1.0);
  const double lr = 0.1;
  muon.step(params.data(), grads.data(), lr, 1);
  for (const ParamInfo& info : muon_tensors(table)) {
    double sum_sq = 0;
    for (int64_t i = info.offset; i < info.offset + info.numel; ++i)
      sum_sq += double(params[i] - before[i]) * (params[i] - before[i]);
    const double rms = std::sqrt(sum_sq / static_cast<double>(info.numel)) / lr;
    EXPECT_GT(rms, 0.7 * options.rms_scale) << info.name;
    EXPECT_LT(rms, 1.2 * options.rms_scale) << info.name;
  }
}

// ---- state, determinism, assignment, AdamW exclusion ------------------------------

std::vector<float> run_muon(const ParamTable& table, const MuonOptions& options, int64_t steps) {
  Muon muon(table, options);
  std::vector<float> params = random_slab(table, 71, 1.0);
  for (int64_t t = 1; t <= steps; ++t)
    muon.step(params.data(), random_slab(table, 80 + t, 1.0).data(), 0.02, t);
  return params;
}

TEST(MuonTest, StateRoundTripResumesBitwise) {
  const ParamTable table(tiny_config());
  auto grads_at = [&](int64_t t) { return random_slab(table, 90 + t, 1.0); };
  Muon straight(table, MuonOptions{});
  std::vector<float> p_straight = random_slab(table, 91, 1.0);
  std::vector<float> p_resumed = p_straight;
  for (int64_t t = 1; t <= 3; ++t) straight.step(p_straight.data(), grads_at(t).data(), 0.02, t);

  Muon first(table, MuonOptions{});
  for (int64_t t = 1; t <= 2; ++t) first.step(p_resumed.data(), grads_at(t).data(), 0.02, t);
  ASSERT_EQ(Muon::state_names(), std::vector<std::string>{"muon_momentum"});
  const auto saved_span = first.state("muon_momentum");
  ASSERT_EQ(saved_span.size(), static_cast<size_t>(table.total_elements()));
  const std::vector<float> saved(saved_span.begin(), saved_span.end());
  Muon second(table, MuonOptions{});
  std::copy(saved.begin(), saved.end(), second.state("muon_momentum").begin());
  second.step(p_resumed.data(), grads_at(3).data(), 0.02, 3);
  ASSERT_EQ(p_straight, p_resumed);
  const auto a = straight.state("muon_momentum"), b = second.state("muon_momentum");
  ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin()));
}

TEST(MuonTest, TwoRunsAreBitwiseIdentical) {
  const ParamTable table(tiny_config());
  for (bool bf16 : {false, true}) {
    MuonOptions options;
    options.bf16_newton_schulz = bf16;
    ASSERT_EQ(run_muon(table, options, 2), run_muon(table, options, 2)) << "bf16 " << bf16;
  }
  MuonOptions fp32, bf16;
  bf16.bf16_newton_schulz = true;
  EXPECT_NE(run_muon(table, fp32, 1), run_muon(table, bf16, 1)) << "bf16 option has no effect";
}

TEST(MuonTest, AssignsHiddenMatricesToMuon) {
  for (int64_t n_experts : {2, 1}) {
    const ParamTable table(tiny_config(n_experts));
    int muon_count = 0;
    for (const ParamInfo& info : table.params()) {
      const bool expect_muon =
          info.kind == ParamKind::attention || info.kind == ParamKind::expert;
      EXPECT_EQ(muon_applies(info), expect_muon) << info.name;
      EXPECT_EQ(optimizer_for(info, true), expect_muon ? "muon" : "adamw") << info.name;
      EXPECT_EQ(optimizer_for(info, false), "adamw") << info.name;
      muon_count += expect_muon;
    }
    // q, k, v, o plus w1, w3, w2 (gate/up/down when dense) per expert, each on its own.
    EXPECT_EQ(muon_count, 4 + 3 * n_experts);
    EXPECT_EQ(Muon(table, MuonOptions{}).tensors().size(), static_cast<size_t>(muon_count));
  }
  const ParamTable table(tiny_config());
  EXPECT_FALSE(muon_applies(table.get("model.embed_tokens.weight")));
  EXPECT_FALSE(muon_applies(table.get("model.norm.weight")));
  EXPECT_FALSE(muon_applies(table.get("model.layers.0.input_layernorm.weight")));
  EXPECT_FALSE(muon_applies(table.get("model.layers.0.block_sparse_moe.gate.weight")));
  EXPECT_TRUE(muon_applies(table.get("model.layers.0.self_attn.q_proj.weight")));
  EXPECT_TRUE(muon_applies(table.get("model.layers.0.block_sparse_moe.experts.1.w3.weight")));
}

TEST(MuonTest, AdamWSkipsExcludedTensorsBitwise) {
  const ParamTable table(test::tiny_moe_config());  // several chunks per run
  AdamWOptions options;
  options.applies = [](const ParamInfo& info) { return !muon_applies(info); };
  AdamW partial(table, options);
  AdamW full(table, AdamWOptions{});
  const std::vector<float> before = random_slab(table, 101, 1.0, /*padding_value=*/9.0f);
  std::vector<float> p_partial = before, p_full = before;
  for (int64_t t = 1; t <= 3; ++t) {
    const std::vector<float> grads = random_slab(table, 110 + t, 1.0);
    partial.step(p_partial.data(), grads.data(), 1e-2, t);
    full.step(p_full.data(), grads.data(), 1e-2, t);
  }
  const auto m = partial.state("exp_avg"), v = partial.state("exp_avg_sq");
  for (const ParamInfo& info : table.params()) {
    EXPECT_EQ(partial.updates(info), !muon_applies(info)) << info.name;
    EXPECT_TRUE(full.updates(info));
    for (int64_t i = info.offset; i < info.offset + info.numel; ++i) {
      if (muon_applies(info)) {
        ASSERT_EQ(p_partial[i], before[i]) << info.name;
        ASSERT_EQ(m[i], 0.0f) << info.name;
        ASSERT_EQ(v[i], 0.0f) << info.name;
      } else {
        ASSERT_NE(p_partial[i], before[i]) << info.name;
        ASSERT_FLOAT_EQ(p_partial[i], p_full[i]) << info.name;
      }
    }
  }
  for (int64_t i : padding_offsets(table)) ASSERT_EQ(p_partial[i], 9.0f);
}

// AdamW on the complement plus Muon: every tensor moves, by exactly one of the two.
TEST(MuonTest, CombinedWithAdamWCoversEveryTensorOnce) {
  const ParamTable table(test::tiny_moe_config());
  AdamWOptions adam_options;
  adam_options.applies = [](const ParamInfo& info) { return !muon_applies(info); };
  AdamW adamw(table, adam_options);
  Muon muon(table, MuonOptions{});
  const std::vector<float> before = random_slab(table, 121, 1.0);
  const std::vector<float> grads = random_slab(table, 122, 1.0);
  std::vector<float> after_adamw = before;
  adamw.step(after_adamw.data(), grads.data(), 1e-2, 1);
  std::vector<float> after_both = after_adamw;
  muon.step(after_both.data(), grads.data(), 1e-2, 1);
  for (const ParamInfo& info : table.params()) {
    const bool muon_owned = muon_applies(info);
    bool adamw_moved = false, muon_moved = false;
    for (int64_t i = info.offset; i < info.offset + info.numel; ++i) {
      adamw_moved |= after_adamw[i] != before[i];
      muon_moved |= after_both[i] != after_adamw[i];
    }
    EXPECT_EQ(adamw_moved, !muon_owned) << info.name;
    EXPECT_EQ(muon_moved, muon_owned) << info.name;
  }
}

TEST(MuonTest, RejectsBadInput) {
  const ParamTable table(tiny_config());
  Muon muon(table, MuonOptions{});
  std::vector<float> params(table.total_elements()), grads(table.total_elements());
  EXPECT_THROW(muon.step(params.data(), grads.data(), 1e-3, 0), Error);
  EXPECT_THROW(muon.state("exp_avg"), Error);
  auto bad = [&](auto edit) {
    MuonOptions o;
    edit(o);
    EXPECT_THROW(Muon(table, o), Error);
  };
  bad([](MuonOptions& o) { o.momentum = 1.0; });
  bad([](MuonOptions& o) { o.momentum = -0.1; });
  bad([](MuonOptions& o) { o.ns_steps = 0; });
  bad([](MuonOptions& o) { o.weight_decay = -1; });
  bad([](MuonOptions& o) { o.rms_scale = 0; });
}

}  // namespace
}  // namespace foundry
