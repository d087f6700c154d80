#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "base/rng.h"
#include "kernels/test_support.h"

namespace foundry::ops {
namespace {

using namespace foundry::testing;

struct Inputs {
  AttentionShape s;
  std::vector<double> q, k, v;
  explicit Inputs(AttentionShape shape, uint64_t seed) : s(shape) {
    q = random_normal(s.b * s.t * s.h * s.d, seed);
    k = random_normal(s.b * s.t * s.kvh * s.d, seed + 1);
    v = random_normal(s.b * s.t * s.kvh * s.d, seed + 2);
  }
  int64_t q_count() const { return s.b * s.t * s.h * s.d; }
  int64_t row_count() const { return s.b * s.h * s.t; }
  std::vector<double> reference() const {
    std::vector<double> out(q_count());
    attention_reference(out.data(), q.data(), k.data(), v.data(), s);
    return out;
  }
  // lse [B, H, T]: log Σ_{j ≤ t} exp(q_t·k_j / sqrt(D)), in double.
  std::vector<double> reference_lse() const {
    std::vector<double> lse(row_count());
    const int64_t g = s.h / s.kvh;
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t h = 0; h < s.h; ++h)
        for (int64_t i = 0; i < s.t; ++i) {
          std::vector<double> z;
          for (int64_t j = 0; j <= i; ++j) {
            double dot = 0;
            for (int64_t x = 0; x < s.d; ++x)
              dot += q[((b * s.t + i) * s.h + h) * s.d + x] *
                     k[((b * s.t + j) * s.kvh + h / g) * s.d + x];
            z.push_back(dot / std::sqrt(static_cast<double>(s.d)));
          }
          const double m = *std::max_element(z.begin(), z.end());
          double sum = 0;
          for (double x : z) sum += std::exp(x - m);
          lse[(b * s.h + h) * s.t + i] = m + std::log(sum);
        }
    return lse;
  }
};

struct Result {
  std::vector<float> out, lse;
};

Result run_forward(const Inputs& in, DType dtype) {
  const auto q = cast_vector<float>(in.q), k = cast_vector<float>(in.k),
             v = cast_vector<float>(in.v);
  Result r{std::vector<float>(in.q_count(), 7.0f), std::vector<float>(in.row_count(), 7.0f)};
  attention_forward(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), in.s, dtype);
  return r;
}

struct Grads {
  std::vector<float> dq, dk, dv;
};

Grads run_backward(const Inputs& in, const std::vector<double>& dout_d, DType dtype) {
  const auto q = cast_vector<float>(in.q), k = cast_vector<float>(in.k),
             v = cast_vector<float>(in.v), dout = cast_vector<float>(dout_d);
  const Result fwd = run_forward(in, dtype);
  // Written, not accumulated: start from garbage.
  Grads g{std::vector<float>(q.size(), 5.0f), std::vector<float>(k.size(), 5.0f),
          std::vector<float>(v.size(), 5.0f)};
  attention_backward(g.dq.data(), g.dk.data(), g.dv.data(), dout.data(), fwd.out.data(),
                     fwd.lse.data(), q.data(), k.data(), v.data(), in.s, dtype);
  return g;
}

// A shape and the tile size it runs with (0: the kernel's own choice, one tile for these
// small shapes). Tiles of 16 and 48 give ragged last blocks, several masked tiles per row
// block and, with 48 against T = 130, a diagonal that is not the only masked tile's edge.
struct TiledShape {
  AttentionShape s;
  int64_t tile;
};
const TiledShape kShapes[] = {{{2, 7, 4, 2, 8}, 0},     {{1, 130, 2, 2, 16}, 48},
                              {{2, 67, 4, 1, 32}, 16},  {{1, 130, 4, 2, 8}, 0},
                              {{2, 260, 8, 2, 4}, 64},  {{1, 33, 6, 3, 8}, 16}};

class AttentionShapes : public ::testing::TestWithParam<TiledShape> {
 protected:
  ScopedAttentionTile tile_{GetParam().tile};
};

TEST_P(AttentionShapes, Fp32ForwardMatchesReference) {
  const Inputs in(GetParam().s, 11);
  const auto expected = in.reference();
  const Result r = run_forward(in, DType::f32);
  EXPECT_LT(norm_relative_error(r.out, expected), 2e-6);
  for (size_t i = 0; i < expected.size(); ++i) ASSERT_NEAR(r.out[i], expected[i], 2e-5) << i;
  const auto lse = in.reference_lse();
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(r.lse[i], lse[i], 2e-5) << "row " << i;
}

TEST_P(AttentionShapes, Bf16ForwardMatchesReferenceLoosely) {
  const Inputs in(GetParam().s, 12);
  const auto expected = in.reference();
  const Result r = run_forward(in, DType::bf16);
  EXPECT_LT(norm_relative_error(r.out, expected), 1e-2);
  EXPECT_LT(norm_relative_error(r.lse, in.reference_lse()), 1e-2);
}

// The tiling changes only the rounding: any tile size gives the one-tile result to fp32
// rounding, and a given tile size is bitwise repeatable.
TEST_P(AttentionShapes, TilingChangesOnlyRounding) {
  const Inputs in(GetParam().s, 15);
  const auto dout = random_normal(in.q_count(), 16);
  const Grads tiled = run_backward(in, dout, DType::f32);
  const Grads again = run_backward(in, dout, DType::f32);
  EXPECT_EQ(tiled.dq, again.dq);
  EXPECT_EQ(tiled.dk, again.dk);
  EXPECT_EQ(tiled.dv, again.dv);
  ScopedAttentionTile whole(1 << 20);
  const Grads one = run_backward(in, dout, DType::f32);
  EXPECT_LT(norm_relative_error(tiled.dq, cast_vector<double>(one.dq)), 1e-5);
  EXPECT_LT(norm_relative_error(tiled.dk, cast_vector<double>(one.dk)), 1e-5);
  EXPECT_LT(norm_relative_error(tiled.dv, cast_vector<double>(one.dv)), 1e-5);
}

// Directional derivatives of <reference(q, k, v), dout> against the kernel's gradient: cheap
// enough for the multi-block shapes, where full finite differences would be slow.
TEST_P(AttentionShapes, BackwardMatchesDirectionalFiniteDifferences) {
  Inputs in(GetParam().s, 13);
  const auto dout = random_normal(in.q_count(), 14);
  const Grads g = run_backward(in, dout, DType::f32);
  auto loss = [&] { return dot(in.reference(), dout); };
  struct Tensor {
    std::vector<double>* x;
    const std::vector<float>* grad;
  };
  uint64_t seed = 100;
  for (const Tensor& t : {Tensor{&in.q, &g.dq}, Tensor{&in.k, &g.dk}, Tensor{&in.v, &g.dv}}) {
    const auto direction = random_normal(t.x->size(), ++seed);
    double analytic = 0;
    for (size_t i = 0; i < direction.size(); ++i) analytic += (*t.grad)[i] * direction[i];
    const double step = 1e-5;
    const auto x0 = *t.x;
    for (size_t i = 0; i < x0.size(); ++i) (*t.x)[i] = x0[i] + step * direction[i];
    const double up = loss();
    for (size_t i = 0; i < x0.size(); ++i) (*t.x)[i] = x0[i] - step * direction[i];
    const double down = loss();
    *t.x = x0;
    const double numeric = (up - down) / (2 * step);
    EXPECT_NEAR(analytic, numeric, 3e-5 * std::abs(numeric) + 1e-7);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionShapes, ::testing::ValuesIn(kShapes));

TEST(Attention, OutputsBeforeAPositionIgnoreThatPositionsKeysAndValues) {
  const AttentionShape s{2, 130, 4, 2, 8};
  ScopedAttentionTile tile(32);
  Inputs in(s, 21);
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Result base = run_forward(in, dtype);
    for (int64_t changed : {0, 50, 100, 129}) {
      Inputs moved = in;
      for (int64_t b = 0; b < s.b; ++b)
        for (int64_t x = 0; x < s.kvh * s.d; ++x) {
          moved.k[(b * s.t + changed) * s.kvh * s.d + x] += 3.0;
          moved.v[(b * s.t + changed) * s.kvh * s.d + x] -= 2.0;
        }
      const Result r = run_forward(moved, dtype);
      for (int64_t b = 0; b < s.b; ++b)
        for (int64_t t = 0; t < s.t; ++t) {
          const int64_t row = (b * s.t + t) * s.h * s.d;
          bool same = true;
          for (int64_t x = 0; x < s.h * s.d; ++x) same &= r.out[row + x] == base.out[row + x];
          if (t < changed) {
            ASSERT_TRUE(same) << "b " << b << " t " << t << " changed " << changed;
          } else if (t == changed) {
            ASSERT_FALSE(same) << "the change must reach position " << t;
          }
        }
    }
  }
}

class AttentionGradients : public ::testing::TestWithParam<TiledShape> {
 protected:
  ScopedAttentionTile tile_{GetParam().tile};
};

// Every input element, central differences of the double reference.
TEST_P(AttentionGradients, BackwardMatchesFiniteDifferences) {
  Inputs in(GetParam().s, 31);
  const auto dout = random_normal(in.q_count(), 32);
  auto loss = [&] { return dot(in.reference(), dout); };
  const auto numeric_dq = numeric_gradient(in.q, loss);
  const auto numeric_dk = numeric_gradient(in.k, loss);
  const auto numeric_dv = numeric_gradient(in.v, loss);

  const Grads g = run_backward(in, dout, DType::f32);
  EXPECT_LT(norm_relative_error(g.dq, numeric_dq), 2e-6);
  EXPECT_LT(norm_relative_error(g.dk, numeric_dk), 2e-6);
  EXPECT_LT(norm_relative_error(g.dv, numeric_dv), 2e-6);

  const Grads h = run_backward(in, dout, DType::bf16);
  EXPECT_LT(norm_relative_error(h.dq, numeric_dq), 1.5e-2);
  EXPECT_LT(norm_relative_error(h.dk, numeric_dk), 1.5e-2);
  EXPECT_LT(norm_relative_error(h.dv, numeric_dv), 1.5e-2);
}

// GQA with two query heads per kv head, plain multi-head attention (KVH = H), and tiles of
// three rows (three row blocks, the last one ragged).
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionGradients,
                         ::testing::Values(TiledShape{{2, 5, 4, 2, 4}, 0},
                                           TiledShape{{1, 6, 4, 4, 8}, 0},
                                           TiledShape{{1, 4, 3, 1, 5}, 0},
                                           TiledShape{{1, 8, 4, 2, 4}, 3}));

// Context parallelism's layout: a sequence of 4 chunks over 2 ranks, rank 0 holding chunks
// 0 and 3 and rank 1 chunks 1 and 2, each rank's queries against the whole sequence's keys.
// The ranks' rows of out and dq match the whole sequence's, and their dk, dv add up to its
// dk, dv. Chunks of 24 rows against tiles of 16 put tile edges inside chunks.
TEST(Attention, ChunksOfASequenceAddUpToTheWholeSequence) {
  const AttentionShape s{2, 96, 4, 2, 8};
  ScopedAttentionTile tile(16);
  const Inputs in(s, 41);
  const auto q = cast_vector<float>(in.q), k = cast_vector<float>(in.k),
             v = cast_vector<float>(in.v);
  const auto dout = cast_vector<float>(random_normal(in.q_count(), 42));
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Result whole = run_forward(in, dtype);
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), whole.out.data(),
                       whole.lse.data(), q.data(), k.data(), v.data(), s, dtype);

    const int64_t chunk = s.t / 4, local = 2 * chunk, row = s.h * s.d;
    std::vector<float> dk_sum(k.size(), 0.0f), dv_sum(v.size(), 0.0f);
    for (const auto& held : {std::array<int64_t, 2>{0, 3}, std::array<int64_t, 2>{1, 2}}) {
      // The rank's rows: [B, 2·chunk, H, D], its chunks one after the other.
      auto local_rows = [&](const std::vector<float>& x) {
        std::vector<float> out(s.b * local * row);
        for (int64_t b = 0; b < s.b; ++b)
          for (int64_t i = 0; i < 2; ++i)
            std::copy_n(x.begin() + (b * s.t + held[i] * chunk) * row, chunk * row,
                        out.begin() + (b * local + i * chunk) * row);
        return out;
      };
      const auto lq = local_rows(q), ldout = local_rows(dout);
      std::vector<float> lout(lq.size()), llse(s.b * s.h * local), ldq(lq.size());
      std::vector<float> ldk(k.size(), 0.0f), ldv(v.size(), 0.0f);
      for (int64_t i = 0; i < 2; ++i) {
        const AttentionChunk c{s.b, s.h, s.kvh, s.d, local, s.t, i * chunk, (i + 1) * chunk,
                               held[i] * chunk};
        attention_chunk_forward(lout.data(), llse.data(), lq.data(), k.data(), v.data(), c,
                                dtype);
      }
      for (int64_t i = 0; i < 2; ++i) {
        const AttentionChunk c{s.b, s.h, s.kvh, s.d, local, s.t, i * chunk, (i + 1) * chunk,
                               held[i] * chunk};
        attention_chunk_backward(ldq.data(), ldk.data(), ldv.data(), ldout.data(), lout.data(),
                                 llse.data(), lq.data(), k.data(), v.data(), c, dtype);
      }
      const double tolerance = dtype == DType::f32 ? 1e-6 : 1e-2;
      EXPECT_LT(norm_relative_error(lout, cast_vector<double>(local_rows(whole.out))), tolerance);
      EXPECT_LT(norm_relative_error(ldq, cast_vector<double>(local_rows(dq))), tolerance);
      for (size_t i = 0; i < k.size(); ++i) {
        dk_sum[i] += ldk[i];
        dv_sum[i] += ldv[i];
      }
    }
    const double tolerance = dtype == DType::f32 ? 1e-6 : 1e-2;
    EXPECT_LT(norm_relative_error(dk_sum, cast_vector<double>(dk)), tolerance);
    EXPECT_LT(norm_relative_error(dv_sum, cast_vector<double>(dv)), tolerance);
  }
}

TEST(Attention, ReferenceOfASinglePositionReturnsItsValue) {
  // With one position the softmax is 1 whatever the scores.
  const AttentionShape s{1, 1, 2, 1, 3};
  const std::vector<double> q{1, 2, 3, -4, 5, 6}, k{0.5, -1, 2}, v{7, 8, 9};
  std::vector<double> out(6);
  attention_reference(out.data(), q.data(), k.data(), v.data(), s);
  EXPECT_EQ(out, (std::vector<double>{7, 8, 9, 7, 8, 9}));
}

void expect_decode_matches_reference(const AttentionShape& s) {
  const Inputs in(s, 31);
  const std::vector<double> ref = in.reference();
  const int64_t row = s.kvh * s.d, qrow = s.h * s.d, max_len = s.t + 3;
  std::vector<float> k_cache(DecodeKv::floats(s.b, s.kvh, s.d, max_len), NAN);
  std::vector<float> v_cache(k_cache.size(), NAN);
  const DecodeKv cache{k_cache.data(), v_cache.data(), s.b, s.kvh, s.d, max_len};
  std::vector<float> k(s.b * row), v(s.b * row);
  std::vector<float> q(s.b * qrow), out(s.b * qrow), scores(s.b * s.h * s.t);
  for (int64_t t = 0; t < s.t; ++t) {
    for (int64_t b = 0; b < s.b; ++b) {
      for (int64_t x = 0; x < row; ++x) {
        k[b * row + x] = float(in.k[(b * s.t + t) * row + x]);
        v[b * row + x] = float(in.v[(b * s.t + t) * row + x]);
      }
      for (int64_t x = 0; x < qrow; ++x) q[b * qrow + x] = float(in.q[(b * s.t + t) * qrow + x]);
    }
    decode_kv_store(cache, t, k.data(), v.data());
    attention_decode(out.data(), scores.data(), q.data(), cache, t + 1, s.h);
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t x = 0; x < qrow; ++x)
        ASSERT_NEAR(out[b * qrow + x], ref[(b * s.t + t) * qrow + x], 1e-5)
            << "sequence " << b << " position " << t;
  }
}

// B sequences decoded in step, each position's rows stored as it comes (the cache longer than
// the sequences): each new row equals the causal attention of the whole sequences at its
// position (the double reference).
TEST(Attention, BatchedDecodeMatchesTheReferenceAtEveryPosition) {
  // Head dims below the kernel's 64-wide register chunk, and one full chunk with a tail; more
  // positions than a key block (16).
  for (const AttentionShape& s :
       {AttentionShape{3, 9, 4, 2, 8}, AttentionShape{2, 21, 2, 1, 80}}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << s.d);
    expect_decode_matches_reference(s);
  }
}

// Rows at different positions, their keys cut into spans at arbitrary points (a shared
// prefix, then a sequence's own positions, each span with its own room): each row's output
// has the bits of its row decoded alone over one contiguous cache.
TEST(Attention, DecodeRowsOverSpansGiveTheBitsOfOneContiguousCache) {
  const int64_t H = 4, KVH = 2, D = 80, T = 37, kv_row = KVH * D;
  Rng rng(12);
  std::vector<float> keys(T * kv_row), values(T * kv_row), q(3 * H * D);
  for (float& x : keys) x = static_cast<float>(rng.normal());
  for (float& x : values) x = static_cast<float>(rng.normal());
  for (float& x : q) x = static_cast<float>(rng.normal());
  // Row r attends to positions 0 … lens[r] − 1 of the same sequence.
  const int64_t lens[3] = {37, 20, 1};

  // Alone: one contiguous cache, one row at a time.
  std::vector<float> k_one(DecodeKv::floats(1, KVH, D, T)), v_one(k_one.size());
  const DecodeKv one{k_one.data(), v_one.data(), 1, KVH, D, T};
  for (int64_t t = 0; t < T; ++t) decode_kv_store(one, t, &keys[t * kv_row], &values[t * kv_row]);
  std::vector<float> alone(3 * H * D), scores(H * T);
  for (int r = 0; r < 3; ++r)
    attention_decode(&alone[r * H * D], scores.data(), &q[r * H * D], one, lens[r], H);

  // Rows together, over spans [0, 5), [5, 21), [21, 37) of separate storage.
  const int64_t cuts[4] = {0, 5, 21, 37};
  std::vector<std::vector<float>> ks(3), vs(3);
  std::vector<DecodeSpan> pieces(3);
  for (int s = 0; s < 3; ++s) {
    const int64_t room = cuts[s + 1] - cuts[s] + 3 * s;  // more room than used, differently
    ks[s].assign(DecodeKv::floats(1, KVH, D, room), NAN);
    vs[s].assign(ks[s].size(), NAN);
    pieces[s] = {ks[s].data(), vs[s].data(), cuts[s + 1] - cuts[s], room};
    for (int64_t t = cuts[s]; t < cuts[s + 1]; ++t)
      decode_span_store(pieces[s], t - cuts[s], &keys[t * kv_row], &values[t * kv_row], KVH, D);
  }
  std::vector<DecodeSpan> spans;
  std::vector<int64_t> first = {0};
  for (int r = 0; r < 3; ++r) {
    for (int s = 0; s < 3 && cuts[s] < lens[r]; ++s) {
      DecodeSpan piece = pieces[s];
      piece.len = std::min(cuts[s + 1], lens[r]) - cuts[s];
      spans.push_back(piece);
    }
    first.push_back(static_cast<int64_t>(spans.size()));
  }
  std::vector<float> together(3 * H * D, NAN), row_scores(3 * H * T);
  attention_decode_rows(together.data(), row_scores.data(), T, q.data(), spans.data(),
                        first.data(), 3, H, KVH, D);
  EXPECT_EQ(std::memcmp(together.data(), alone.data(), alone.size() * sizeof(float)), 0);
}

// A prompt chunk: rows at consecutive positions of one segment (more rows than a task takes,
// their lengths ending inside key and value blocks, in no particular order), beside rows of
// other storage: each row's output has the bits of its row decoded alone.
TEST(Attention, DecodeRowsOfOneSegmentReadItTogetherWithTheBitsOfEachAlone) {
  for (const int64_t D : {64, 80}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << D);
    const int64_t H = 6, KVH = 2, T = 75, room = 80, kv_row = KVH * D;
    Rng rng(13);
    std::vector<float> keys(T * kv_row), values(T * kv_row);
    for (float& x : keys) x = static_cast<float>(rng.normal());
    for (float& x : values) x = static_cast<float>(rng.normal());
    std::vector<float> k_seg(DecodeKv::floats(1, KVH, D, room), NAN), v_seg(k_seg.size(), NAN);
    const DecodeKv seg{k_seg.data(), v_seg.data(), 1, KVH, D, room};
    for (int64_t t = 0; t < T; ++t)
      decode_kv_store(seg, t, &keys[t * kv_row], &values[t * kv_row]);
    // A second sequence of its own storage: its rows read 30 and 75 positions.
    std::vector<float> k_other(k_seg.size(), NAN), v_other(k_seg.size(), NAN);
    const DecodeKv other{k_other.data(), v_other.data(), 1, KVH, D, room};
    for (int64_t t = 0; t < T; ++t)
      decode_kv_store(other, t, &values[t * kv_row], &keys[t * kv_row]);
    // Rows: positions 40 … 74 of the segment, shuffled, with the other sequence's two between.
    std::vector<std::pair<const DecodeKv*, int64_t>> rows;  // storage, positions read
    for (int64_t len = 41; len <= T; ++len) rows.push_back({&seg, len});
    for (size_t i = rows.size() - 1; i > 0; --i)
      std::swap(rows[i], rows[static_cast<size_t>(rng.uniform() * static_cast<double>(i + 1))]);
    rows.insert(rows.begin() + 7, {&other, 30});
    rows.insert(rows.begin() + 20, {&other, T});
    const int64_t n = static_cast<int64_t>(rows.size());
    std::vector<float> q(n * H * D);
    for (float& x : q) x = static_cast<float>(rng.normal());

    std::vector<float> alone(n * H * D), scores(H * T);
    std::vector<DecodeSpan> spans;
    std::vector<int64_t> first = {0};
    for (int64_t r = 0; r < n; ++r) {
      attention_decode(&alone[r * H * D], scores.data(), &q[r * H * D], *rows[r].first,
                       rows[r].second, H);
      spans.push_back(decode_span(*rows[r].first, 0, rows[r].second));
      first.push_back(r + 1);
    }
    std::vector<float> together(n * H * D, NAN), row_scores(n * H * T);
    attention_decode_rows(together.data(), row_scores.data(), T, q.data(), spans.data(),
                          first.data(), n, H, KVH, D);
    EXPECT_EQ(std::memcmp(together.data(), alone.data(), alone.size() * sizeof(float)), 0);
  }
}

TEST(Attention, DecodeCacheRefusesAPositionPastItsEnd) {
  std::vector<float> k(DecodeKv::floats(1, 1, 4, 3)), v(k.size()), row(4, 1.0f);
  const DecodeKv cache{k.data(), v.data(), 1, 1, 4, 3};
  decode_kv_store(cache, 2, row.data(), row.data());
  EXPECT_THROW(decode_kv_store(cache, 3, row.data(), row.data()), foundry::Error);
}

}  // namespace
}  // namespace foundry::ops
